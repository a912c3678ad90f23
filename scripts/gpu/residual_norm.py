#!/usr/bin/env python3
"""memexec's residual-norm kernel (src/model/kernels/residual_norm.cu) against MLX's own ops,
on the machine it runs on (MLX CUDA only).

The kernel computes `out = (h + rms_norm(y, w)) [* s]` and `xn = rms_norm(out, wn)` in one node;
MLX computes them as RMSNorm, Add, Multiply, RMSNorm (what memexec runs without the kernel, and
mlx-lm's Gemma-4 layer). For bf16 / f16 / f32, axes of 64..8192 elements (Gemma-4 e4b's 2560,
256, 512 among them), 1..17 rows and prefill-like [1, L, D] inputs, with and without the scale
and the next norm, y also as a strided view:
  - both outputs vs MLX's (fraction of elements bit-equal: must be 1.0);
  - batch independence: a row alone == the same row inside a 9-row call;
  - `--sweep N` more random cases over e4b's 2560-wide rows (enough elements to see a sum order
    that differs from MLX's);
  - host + device time of a chain of 42 updates (a one-row e4b step's worth of one of them):
    MLX's four ops vs the kernel.
`--variant nofma` sums the squares without fma contraction, `plain` uses T's plain operators (which
NVRTC contracts into fmas): controls that show the check can fail. The kernels are called
precompiled (precompiled.py, as memexec calls them with MEMEXEC_KERNEL_CALLS=precompiled) unless
`--calls jit` (MLX's `mx.fast.cuda_kernel`, as session 10 measured them).

Usage: residual_norm.py [--out FILE] [--variant literal,nofma] [--sweep N] [--reps N] [--quick]
       [--calls precompiled|jit]
"""
import argparse
import json
import os
import struct

import mlx.core as mx
import numpy as np

from device_timing import chain_time
from precompiled import PrecompiledKernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BODY = "\n".join(l for l in open(os.path.join(ROOT, "src/model/kernels/residual_norm.cu"))
                 .read().splitlines() if not l.lstrip().startswith("//"))
HEADER = "#include <cooperative_groups/reduce.h>\n#include <cuda/std/type_traits>\n"  # residual_norm.rs
EPS = 1e-6

VARIANTS = {
    "literal": [],
    "nofma": [("sum = __fmaf_rn(f, f, sum);", "sum = __fadd_rn(sum, __fmul_rn(f, f));")],
    # T's plain operators, which NVRTC may fuse into an fma (the first version's mistake).
    "plain": [("return __fmul_rn(a, b);", "return a * b;"), ("return __hmul_rn(a, b);", "return a * b;"),
              ("return __fadd_rn(a, b);", "return a + b;"), ("return __hadd_rn(a, b);", "return a + b;")],
}


def mlx_launch(d, dtype):
    """src/model/residual_norm.rs `mlx_launch`: MLX's (threads, chunks) for an axis of d."""
    n_reads = 16 // dtype.size
    if d > n_reads * 128 * 8:
        return None
    vectors = (d + n_reads - 1) // n_reads
    if d <= n_reads * 64:
        return 64, 1
    if vectors % 128 == 0 and vectors // 128 <= 8:
        return 128, vectors // 128
    if vectors % 64 == 0 and vectors // 64 <= 8:
        return 64, vectors // 64
    return 128, (vectors + 127) // 128


def make_kernels(variant, calls="precompiled"):
    body = BODY
    for old, new in VARIANTS[variant]:
        assert old in body, old
        body = body.replace(old, new)
    kernel = PrecompiledKernel if calls == "precompiled" else mx.fast.cuda_kernel
    make = lambda name, outs, src: kernel(
        name=f"{name}_{variant}", input_names=["h", "y", "w", "s", "wn"], output_names=outs,
        source=src, header=HEADER, ensure_row_contiguous=False)
    return {True: make("memexec_residual_norm_next", ["out", "xn"], body),
            False: make("memexec_residual_norm", ["out"], "T* xn = nullptr;\n" + body)}


def eps_bits():
    return struct.unpack("<i", struct.pack("<f", EPS))[0]


def kernel_update(kernels, h, y, w, s, wn):
    d = h.shape[-1]
    threads, chunks = mlx_launch(d, h.dtype)
    rows = h.size // d
    outs = kernels[wn is not None](
        inputs=[h, y, w, s if s is not None else w, wn if wn is not None else w],
        template=[("T", h.dtype), ("D", d), ("BLOCK", threads), ("CHUNKS", chunks),
                  ("EPS_BITS", eps_bits()), ("HAS_SCALE", int(s is not None)),
                  ("HAS_NEXT", int(wn is not None))],
        grid=(rows * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=[h.shape] * (2 if wn is not None else 1),
        output_dtypes=[h.dtype] * (2 if wn is not None else 1))
    return outs[0], (outs[1] if wn is not None else None)


def mlx_update(h, y, w, s, wn):
    out = h + mx.fast.rms_norm(y, w, EPS)
    if s is not None:
        out = out * s
    return out, (mx.fast.rms_norm(out, wn, EPS) if wn is not None else None)


def draw(rng, shape, dtype, scale):
    return mx.array(rng.standard_normal(shape).astype(np.float32) * scale).astype(dtype)


def inputs(seed, shape, dtype, with_scale, with_next, strided):
    rng = np.random.default_rng(seed)
    d = shape[-1]
    h = draw(rng, shape, dtype, 4.0)
    if strided:  # y as every other element of a twice-as-wide buffer (last stride 2)
        y = draw(rng, shape[:-1] + (2 * d,), dtype, 20.0)[..., ::2]
    else:
        y = draw(rng, shape, dtype, 20.0)
    w = (mx.abs(draw(rng, (d,), dtype, 1.0)) + 0.1).astype(dtype)
    wn = (mx.abs(draw(rng, (d,), dtype, 1.0)) + 0.1).astype(dtype) if with_next else None
    s = None
    if with_scale:  # the layer scalar: one value broadcast over the axis, as memexec holds it
        s = mx.broadcast_to(mx.array([rng.uniform(0.1, 1.5)], dtype=mx.float32).astype(dtype),
                            (1, 1, d))
    mx.eval(h, y, w, *(a for a in (s, wn) if a is not None))
    return h, y, w, s, wn


def equal(a, b):
    return float(np.mean(np.array(a.astype(mx.float32)) == np.array(b.astype(mx.float32))))


def case(kernels, seed, shape, dtype, with_scale, with_next, strided=False):
    h, y, w, s, wn = inputs(seed, shape, dtype, with_scale, with_next, strided)
    out, xn = kernel_update(kernels, h, y, w, s, wn)
    ref, ref_xn = mlx_update(h, y, w, s, wn)
    r = {"shape": list(shape), "dtype": str(dtype), "scale": with_scale, "next": with_next,
         "strided": strided, "out_equal": equal(out, ref),
         "xn_equal": equal(xn, ref_xn) if wn is not None else None}
    return r


def batch_independent(kernels, seed):
    """Row 4 of a 9-row call == that row alone (bf16, e4b's hidden size)."""
    h, y, w, s, wn = inputs(seed, (9, 1, 2560), mx.bfloat16, True, True, False)
    out, xn = kernel_update(kernels, h, y, w, s, wn)
    one, one_xn = kernel_update(kernels, h[4:5], y[4:5], w, s, wn)
    return bool(mx.array_equal(out[4:5], one).item() and mx.array_equal(xn[4:5], one_xn).item())


def sweep(kernels, n):
    unequal = elements = unequal_cases = 0
    for i in range(n):
        rows = 1 + i % 8
        h, y, w, s, wn = inputs(10_000 + i, (rows, 1, 2560), mx.bfloat16, True, True, False)
        out, xn = kernel_update(kernels, h, y, w, s, wn)
        ref, ref_xn = mlx_update(h, y, w, s, wn)
        diff = int((out != ref).sum().item()) + int((xn != ref_xn).sum().item())
        elements += 2 * out.size
        unequal += diff
        unequal_cases += diff > 0
    return {"cases": n, "elements": elements, "unequal_elements": unequal,
            "unequal_cases": unequal_cases}


def timing(kernels, reps):
    """Microseconds per update in a chain of 42 one-row updates with scale and next norm."""
    h, y, w, s, wn = inputs(7, (1, 1, 2560), mx.bfloat16, True, True, False)
    return {"mlx_ops_us": chain_time(lambda x: mlx_update(x, y, w, s, wn)[0], h, reps),
            "kernel_us": chain_time(lambda x: kernel_update(kernels, x, y, w, s, wn)[0], h, reps)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--variant", default="literal", help=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="a few cases per variant, no timing")
    ap.add_argument("--sweep", type=int, default=0, help="N more random e4b-shaped cases")
    ap.add_argument("--calls", choices=["precompiled", "jit"], default="precompiled",
                    help="how the kernels are called (memexec: MEMEXEC_KERNEL_CALLS)")
    a = ap.parse_args()
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "calls": a.calls,
               "variants": {}}
    ok = True
    dims = (256, 2560) if a.quick else (64, 100, 256, 320, 512, 1000, 1536, 2048, 2560, 5376,
                                        8192)
    for variant in a.variant.split(","):
        kernels = make_kernels(variant, a.calls)
        cases, seed = [], 0
        for dtype in (mx.bfloat16, mx.float16, mx.float32):
            for d in dims:
                if mlx_launch(d, dtype) is None:
                    continue
                for shape in ((1, 1, d), (3, 1, d), (17, 1, d), (1, 7, d)):
                    for flags in ((True, True, False), (False, False, False), (False, True, True)):
                        seed += 1
                        r = case(kernels, seed, shape, dtype, *flags)
                        cases.append(r)
        bad = [c for c in cases if c["out_equal"] != 1.0 or c["xn_equal"] not in (None, 1.0)]
        for c in bad[:20]:
            print(f"{variant}: differs: {c}", flush=True)
        independent = batch_independent(kernels, 99)
        good = not bad and independent
        print(f"{variant}: {len(cases) - len(bad)} of {len(cases)} cases bit-equal to MLX's ops; "
              f"a row alone == the row in a 9-row call: {independent}", flush=True)
        sw = sweep(kernels, a.sweep) if a.sweep else None
        if sw:
            good = good and sw["unequal_elements"] == 0
            print(f"{variant}: sweep of {sw['cases']} cases: {sw['unequal_elements']} of "
                  f"{sw['elements']} elements differ, in {sw['unequal_cases']} cases", flush=True)
        results["variants"][variant] = {"cases": cases, "sweep": sw, "ok": good,
                                        "batch_independent": independent}
        if not a.quick:
            t = timing(kernels, a.reps)
            print(f"{variant}: chain of 42 updates (1 x 2560 bf16, scale + next norm): MLX ops "
                  f"{t['mlx_ops_us']:.1f} us, kernel {t['kernel_us']:.1f} us per update",
                  flush=True)
            results["variants"][variant]["timing"] = t
        ok = ok and (good or variant != "literal")
    results["ok"] = ok
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print("residual_norm:", "ok" if ok else "FAILED", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
