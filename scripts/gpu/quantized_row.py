#!/usr/bin/env python3
"""memexec's one-row quantized product (src/model/kernels/quantized_row.cu) against MLX's own
one-row product (`qmv`, what mlx-lm's serial decode runs), on the machine it runs on (MLX CUDA
only: the kernel is CUDA).

For every tile VARIANT (columns per warp x steps of loads in flight) given:
  - the share of output elements equal to MLX's `quantized_matmul` of the same row bit for bit,
    for the e4b's product shapes (4-bit, group 64, bf16; n x k below) and for f16 / f32
    activations, groups of 32 / 128, a k with a partial last step, column counts that leave a
    warp partly out of range, and an input that starts 3 elements into its buffer (the
    kernel's element loads): must be 1.0 everywhere;
  - wall time per call (42 independent calls per evaluation) of the e4b's shapes, the kernel
    vs MLX's product. Run the script under cupti_trace.py for the device time per kernel and
    shape (its "no decode steps" table: mean us per name and grid).

The kernel is called as a precompiled kernel (precompiled.py: as memexec with
MEMEXEC_KERNEL_CALLS=precompiled) unless --calls jit.

Usage: quantized_row.py [--out FILE] [--reps N] [--variants 4x2,2x4,...] [--timing-only]
       [--calls precompiled|jit]
"""
import argparse

import mlx.core as mx
import numpy as np

from device_timing import timed
from kernel_host_cost import kernel_text
from precompiled import PrecompiledKernel
from quantized_rows import SHAPES, bits_of, finish, mlx_product

WARPS = 8


def make_kernel(calls="precompiled"):
    make = PrecompiledKernel if calls == "precompiled" else mx.fast.cuda_kernel
    return make(
        name="memexec_quantized_row", input_names=["x", "w", "scales", "biases"],
        output_names=["out"], source=kernel_text("src/model/kernels/quantized_row.cu"),
        header=kernel_text("src/model/kernels/quantized_rows_header.cuh") + "\n",
        ensure_row_contiguous=True)


KERNEL = None


def kernel_row(x, w, scales, biases, group, variant):
    cols, unroll = variant
    n = w.shape[0]
    blocks = (n + WARPS * cols - 1) // (WARPS * cols)
    return KERNEL(
        inputs=[x, w, scales, biases],
        template=[("T", x.dtype), ("GROUP", group), ("COLS", cols), ("UNROLL", unroll)],
        grid=(blocks * 32, WARPS, 1), threadgroup=(32, WARPS, 1),
        output_shapes=[tuple(x.shape[:-1]) + (n,)], output_dtypes=[x.dtype])[0]


def operands(n, k, seed, group=64, dtype=mx.bfloat16):
    kw, kx = mx.random.split(mx.random.key(seed))
    wf = (mx.random.normal((n, k), key=kw) * 0.02).astype(dtype)
    w, scales, biases = mx.quantize(wf, group_size=group, bits=4)
    x = mx.random.normal((1, 1, k), key=kx).astype(dtype)
    mx.eval(w, scales, biases, x)
    return x, w, scales, biases


def case(variant, n, k, seed, group=64, dtype=mx.bfloat16, unaligned=False):
    x, w, scales, biases = operands(n, k, seed, group, dtype)
    xk = x
    if unaligned:  # a row-contiguous view 3 elements into its buffer: the element loads
        xk = mx.concatenate([mx.zeros((3,), dtype), x.reshape(-1)])[3:].reshape(1, 1, k)
        mx.eval(xk)
    ours = kernel_row(xk, w, scales, biases, group, variant)
    theirs = mlx_product(x, w, scales, biases, group, 4)
    mx.eval(ours, theirs)
    eq = bits_of(ours) == bits_of(theirs)
    return {
        "variant": f"{variant[0]}x{variant[1]}", "n": n, "k": k, "group": group,
        "dtype": str(dtype), "unaligned": unaligned,
        "equal_to_mlx": float(eq.mean()), "unequal_elements": int((~eq).sum()),
        "max_abs_diff": float(np.abs(np.array(ours.astype(mx.float32))
                                     - np.array(theirs.astype(mx.float32))).max()),
    }


def main():
    global KERNEL
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="4x2,2x2,2x4,1x4,4x1",
                    help="COLSxUNROLL tiles, comma-separated")
    ap.add_argument("--timing-only", action="store_true", help="skip the equality cases")
    ap.add_argument("--calls", choices=["precompiled", "jit"], default="precompiled",
                    help="call the kernel as memexec's MEMEXEC_KERNEL_CALLS does")
    a = ap.parse_args()
    variants = [tuple(int(p) for p in v.split("x")) for v in a.variants.split(",")]
    KERNEL = make_kernel(a.calls)
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "calls": a.calls,
               "cases": [],
               "timing": []}
    extra = [dict(n=24, k=704), dict(n=100, k=2560), dict(n=2560, k=256 + 64),
             dict(n=2048, k=2560, dtype=mx.float16), dict(n=2048, k=2560, dtype=mx.float32),
             dict(n=2048, k=2560 + 128, group=32), dict(n=2048, k=2560 + 128, group=128),
             dict(n=2048, k=2560, unaligned=True), dict(n=2048, k=2560, dtype=mx.float32,
                                                         unaligned=True)]
    seed = 0
    for variant in ([] if a.timing_only else variants):
        for kw in [dict(n=n, k=k) for n, k in SHAPES] + extra:
            seed += 1
            r = case(variant, seed=seed, **kw)
            results["cases"].append(r)
            print(f"{r['variant']} n={r['n']:6} k={r['k']:5} g={r['group']:3} {r['dtype']:>14}"
                  f"{' unaligned' if r['unaligned'] else ''}: equal {r['equal_to_mlx']:.6f}"
                  f" ({r['unequal_elements']} differ, max |d| {r['max_abs_diff']:.3g})", flush=True)
    for n, k in SHAPES:
        x, w, s, b = operands(n, k, n + k)
        calls = 42 if n * k < 1e8 else 4
        row = {"n": n, "k": k,
               "mlx_us": timed(lambda: [mlx_product(x, w, s, b, 64, 4) for _ in range(calls)],
                               a.reps) / calls}
        for v in variants:
            row[f"{v[0]}x{v[1]}_us"] = timed(
                lambda: [kernel_row(x, w, s, b, 64, v) for _ in range(calls)], a.reps) / calls
        results["timing"].append(row)
        print(f"wall {n:6}x{k:5}: " + ", ".join(f"{key[:-3]} {val:.1f}" for key, val in row.items()
                                                  if key.endswith("_us")) + " us/call", flush=True)
    return finish(results, "equal_to_mlx", a.out)


if __name__ == "__main__":
    raise SystemExit(main())
