#!/usr/bin/env python3
"""Host cost per call of an MLX CUDA custom kernel against MLX's own ops, on the machine it runs
on: a chain of CALLS dependent calls on small operands (the device work per call is a few
microseconds, so the host's share shows), timed in two parts per evaluation: building the lazy
graph (Python + MLX's op construction; `fast.cuda_kernel` assembles the kernel's whole source
text on every call) and `mx.eval` (MLX's encoding, CUDA graph updates and launches, and the
device work). Python's own cost per call is in every variant alike, so the differences between
variants are what each form of call costs the host.

Variants: MLX's quantized product (`qmv`), MLX's RMSNorm, memexec's one-row product kernel as
memexec calls it (4 template constants, its header, 3 shape arguments), the same kernel with its
constants written into the source (no template constants), and a trivial copy kernel (no header,
no shapes, no template constants: the floor of a custom kernel call). Then the trivial kernel
with one of the row kernel's traits added at a time, to tell which of them costs: its header
(~3 KB more source text per call), its four inputs, its three shape arguments, its four
template constants. Last, the row kernel as memexec calls it and the trivial kernel again, as
PRECOMPILED kernels (precompiled.py, as memexec with MEMEXEC_KERNEL_CALLS=precompiled: the
same body and template constants, no source text per call, shapes as int scalars), checked
equal to the JIT form's output.

usage: kernel_host_cost.py [--calls 254] [--reps 20] [--out FILE]
"""
import argparse
import json
import os
import time

import mlx.core as mx

from precompiled import PrecompiledKernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernel_text(path):
    """A kernel file (path from the repository root) without its comment lines, as memexec
    passes it to MLX (`row_kernel::without_comment_lines`)."""
    return "\n".join(l for l in open(os.path.join(ROOT, path)).read().splitlines()
                     if not l.lstrip().startswith("//"))


def measure(step, x, calls, reps):
    """(build us, eval us) per call: mean over reps of a chain of `calls` calls from `x`."""
    def once():
        t0 = time.perf_counter()
        y = x
        for _ in range(calls):
            y = step(y)
        t1 = time.perf_counter()
        mx.eval(y)
        mx.synchronize()
        return t1 - t0, time.perf_counter() - t1
    once()
    once()
    b = e = 0.0
    for _ in range(reps):
        tb, te = once()
        b += tb
        e += te
    return b / reps / calls * 1e6, e / reps / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=254)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    k = n = 512
    w, s, b = mx.quantize((mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16), group_size=64,
                          bits=4)
    x = mx.random.normal((1, 1, k)).astype(mx.bfloat16)
    norm_w = mx.ones((k,), mx.bfloat16)
    mx.eval(w, s, b, x, norm_w)
    header = kernel_text("src/model/kernels/quantized_rows_header.cuh") + "\n"
    body = kernel_text("src/model/kernels/quantized_row.cu")
    names = ["x", "w", "scales", "biases"]
    templated = mx.fast.cuda_kernel(name="hc_templated", input_names=names, output_names=["out"],
                                    source=body, header=header, ensure_row_contiguous=True)
    consts = ("using T = __nv_bfloat16;\nconstexpr int GROUP = 64;\nconstexpr int COLS = 4;\n"
              "constexpr int UNROLL = 2;\n")
    baked = mx.fast.cuda_kernel(name="hc_baked", input_names=names, output_names=["out"],
                                source=consts + body, header=header, ensure_row_contiguous=True)
    trivial = mx.fast.cuda_kernel(
        name="hc_trivial", input_names=["x"], output_names=["out"],
        source="const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "if (i < 512) { out[i] = x[i]; }\n", ensure_row_contiguous=True)
    copy = ("const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            "if (i < 512) { out[i] = x[i]; }\n")
    with_header = mx.fast.cuda_kernel(name="hc_trivial_header", input_names=["x"],
                                      output_names=["out"], source=copy, header=header,
                                      ensure_row_contiguous=True)
    four_inputs = mx.fast.cuda_kernel(name="hc_trivial_inputs", input_names=names,
                                      output_names=["out"], source=copy,
                                      ensure_row_contiguous=True)
    shapes = mx.fast.cuda_kernel(
        name="hc_trivial_shapes", input_names=names, output_names=["out"],
        source="const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
               "if (i < x_shape[2] && w_shape[0] > 0 && scales_shape[0] > 0) { out[i] = x[i]; }\n",
        ensure_row_contiguous=True)
    templ = mx.fast.cuda_kernel(name="hc_trivial_template", input_names=["x"],
                                output_names=["out"], source=copy, ensure_row_contiguous=True)
    pre_templated = PrecompiledKernel(name="hc_pre_templated", input_names=names,
                                      output_names=["out"], source=body, header=header)
    pre_trivial = PrecompiledKernel(name="hc_pre_trivial", input_names=["x"],
                                    output_names=["out"], source=copy)
    grid = dict(grid=(n // 32 * 32, 8, 1), threadgroup=(32, 8, 1))
    row_template = [("T", mx.bfloat16), ("GROUP", 64), ("COLS", 4), ("UNROLL", 2)]
    one = dict(output_shapes=[(1, 1, n)], output_dtypes=[mx.bfloat16], grid=(512, 1, 1),
               threadgroup=(256, 1, 1))
    variants = {
        "mlx_qmv": lambda y: mx.quantized_matmul(y, w, s, b, transpose=True, group_size=64, bits=4),
        "mlx_rms_norm": lambda y: mx.fast.rms_norm(y, norm_w, 1e-6),
        "kernel_templated": lambda y: templated(
            inputs=[y, w, s, b], template=row_template,
            output_shapes=[(1, 1, n)], output_dtypes=[mx.bfloat16], **grid)[0],
        "kernel_baked": lambda y: baked(
            inputs=[y, w, s, b], output_shapes=[(1, 1, n)], output_dtypes=[mx.bfloat16],
            **grid)[0],
        "kernel_trivial": lambda y: trivial(
            inputs=[y], output_shapes=[(1, 1, n)], output_dtypes=[mx.bfloat16],
            grid=(512, 1, 1), threadgroup=(256, 1, 1))[0],
        "trivial+header": lambda y: with_header(inputs=[y], **one)[0],
        "trivial+4_inputs": lambda y: four_inputs(inputs=[y, w, s, b], **one)[0],
        "trivial+4_in+3_shapes": lambda y: shapes(inputs=[y, w, s, b], **one)[0],
        "trivial+4_templates": lambda y: templ(
            inputs=[y], template=row_template, **one)[0],
    }
    variants["pre_templated"] = lambda y: pre_templated(
        inputs=[y, w, s, b], template=row_template, output_shapes=[(1, 1, n)],
        output_dtypes=[mx.bfloat16], **grid)[0]
    variants["pre_trivial"] = lambda y: pre_trivial(inputs=[y], **one)[0]
    same = mx.array_equal(variants["pre_templated"](x), variants["kernel_templated"](x)).item()
    same = same and mx.array_equal(variants["pre_templated"](x),
                                   variants["kernel_templated"](x)).item()
    print(f"precompiled row kernel equals the JIT form (with its image, then without): {same}",
          flush=True)
    results = {"mlx": mx.__version__, "calls": a.calls, "reps": a.reps, "us_per_call": {},
               "precompiled_equal": same}
    for rnd in range(2):
        for name, f in variants.items():
            bu, eu = measure(f, x, a.calls, a.reps)
            results["us_per_call"].setdefault(name, []).append({"build": bu, "eval": eu})
            print(f"round {rnd + 1} {name:22}: build {bu:5.2f} + eval {eu:5.2f} = {bu + eu:5.2f} us "
                  "per call", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
