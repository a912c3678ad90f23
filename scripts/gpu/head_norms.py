#!/usr/bin/env python3
"""memexec's q/k/v head-norm kernel (src/model/kernels/head_norms.cu, MEMEXEC_HEAD_NORM_KERNEL=1)
against MLX's own ops, on the machine it runs on (MLX CUDA only).

The kernel norms every query / key / value head of one decode position in one node; MLX (and
memexec without it, and mlx-lm's Gemma-4 attention) reshapes each projection into heads and runs
`RMSNorm` on it (the value norm without a weight). For bf16 / f16 / f32, head dims 64..512
(Gemma-4 e4b's 256 and 512 among them), 1..9 rows, 8 / 2 and 4 / 1 heads, q / k / v as views of
one fused product (as the model passes them) and as arrays of their own:
  - each output vs MLX's (fraction of elements bit-equal: must be 1.0);
  - batch independence: a row alone == the same row inside a 9-row call;
  - `--sweep N` more random e4b-shaped cases;
  - host + device time of a chain of 24 calls (a one-row e4b step's worth): MLX's ops vs the
    kernel.
`--variant nofma` sums the squares without fma (MLX sums them with fma): a control that must
differ somewhere, or the check could not fail.
The kernel is called precompiled (precompiled.py, as memexec calls it with
MEMEXEC_KERNEL_CALLS=precompiled) unless `--calls jit`.

Usage: head_norms.py [--out FILE] [--variant literal,nofma] [--sweep N] [--reps N] [--quick]
       [--calls precompiled|jit]
Exit 1 when the literal kernel differs from MLX anywhere, or a control variant run does not.
"""
import argparse
import json
import os
import struct

import mlx.core as mx
import numpy as np

from device_timing import chain_time
from precompiled import PrecompiledKernel
from residual_norm import mlx_launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BODY = "\n".join(l for l in open(os.path.join(ROOT, "src/model/kernels/head_norms.cu"))
                 .read().splitlines() if not l.lstrip().startswith("//"))
HEADER = "#include <cooperative_groups/reduce.h>\n#include <cuda/std/type_traits>\n"  # head_norms.rs
EPS = 1e-6
VARIANTS = {
    "literal": [],
    "nofma": [("sum = __fmaf_rn(f, f, sum);", "sum = __fadd_rn(sum, __fmul_rn(f, f));")],
}


def make_kernel(variant, calls):
    body = BODY
    for old, new in VARIANTS[variant]:
        assert old in body, old
        body = body.replace(old, new)
    kernel = PrecompiledKernel if calls == "precompiled" else mx.fast.cuda_kernel
    return kernel(name=f"memexec_head_norms_{variant}", input_names=["q", "k", "v", "qw", "kw"],
                  output_names=["qn", "kn", "vn"], source=body, header=HEADER,
                  ensure_row_contiguous=False)


def eps_bits():
    return struct.unpack("<i", struct.pack("<f", EPS))[0]


def kernel_norms(kernel, q, k, v, qw, kw, heads, kv_heads):
    """src/model/head_norms.rs `fused`: q / k / v [B, 1, heads * d] -> [B, heads, 1, d]."""
    b, d = q.shape[0], qw.shape[0]
    threads, chunks = mlx_launch(d, q.dtype)
    return kernel(
        inputs=[q, k, v, qw, kw],
        template=[("T", q.dtype), ("D", d), ("BLOCK", threads), ("CHUNKS", chunks),
                  ("EPS_BITS", eps_bits()), ("HQ", heads), ("HK", kv_heads)],
        grid=(b * (heads + 2 * kv_heads) * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=[(b, heads, 1, d), (b, kv_heads, 1, d), (b, kv_heads, 1, d)],
        output_dtypes=[q.dtype] * 3)


def mlx_norms(q, k, v, qw, kw, heads, kv_heads):
    """memexec's split_heads + RMSNorm for one position (and mlx-lm's Gemma-4 attention)."""
    b, d = q.shape[0], qw.shape[0]
    return (mx.fast.rms_norm(q.reshape(b, heads, 1, d), qw, EPS),
            mx.fast.rms_norm(k.reshape(b, kv_heads, 1, d), kw, EPS),
            mx.fast.rms_norm(v.reshape(b, kv_heads, 1, d), None, EPS))


def draw(rng, shape, dtype, scale):
    return mx.array(rng.standard_normal(shape).astype(np.float32) * scale).astype(dtype)


def inputs(seed, rows, d, dtype, heads, kv_heads, views):
    rng = np.random.default_rng(seed)
    if views:  # the fused q/k/v product's parts, as the model passes them
        product = draw(rng, (rows, 1, (heads + 2 * kv_heads) * d), dtype, 20.0)
        q, k, v = mx.split(product, [heads * d, (heads + kv_heads) * d], axis=-1)
    else:
        q = draw(rng, (rows, 1, heads * d), dtype, 20.0)
        k = draw(rng, (rows, 1, kv_heads * d), dtype, 20.0)
        v = draw(rng, (rows, 1, kv_heads * d), dtype, 20.0)
    qw = (mx.abs(draw(rng, (d,), dtype, 1.0)) + 0.1).astype(dtype)
    kw = (mx.abs(draw(rng, (d,), dtype, 1.0)) + 0.1).astype(dtype)
    mx.eval(q, k, v, qw, kw)
    return q, k, v, qw, kw


def equal(a, b):
    return float(np.mean(np.array(a.astype(mx.float32)) == np.array(b.astype(mx.float32))))


def case(kernel, seed, rows, d, dtype, heads, kv_heads, views):
    args = inputs(seed, rows, d, dtype, heads, kv_heads, views)
    ours = kernel_norms(kernel, *args, heads, kv_heads)
    theirs = mlx_norms(*args, heads, kv_heads)
    return {"rows": rows, "d": d, "dtype": str(dtype), "heads": [heads, kv_heads], "views": views,
            "equal": [equal(a, b) for a, b in zip(ours, theirs)]}


def batch_independent(kernel, seed):
    """Row 4 of a 9-row call == that row alone (bf16, e4b's sliding heads)."""
    q, k, v, qw, kw = inputs(seed, 9, 256, mx.bfloat16, 8, 2, True)
    many = kernel_norms(kernel, q, k, v, qw, kw, 8, 2)
    one = kernel_norms(kernel, q[4:5], k[4:5], v[4:5], qw, kw, 8, 2)
    return all(mx.array_equal(a[4:5], b).item() for a, b in zip(many, one))


def sweep(kernel, n):
    unequal = elements = unequal_cases = 0
    for i in range(n):
        d = (256, 512)[i % 2]
        args = inputs(20_000 + i, 1 + i % 8, d, mx.bfloat16, 8, 2, True)
        ours = kernel_norms(kernel, *args, 8, 2)
        theirs = mlx_norms(*args, 8, 2)
        diff = sum(int((a != b).sum().item()) for a, b in zip(ours, theirs))
        elements += sum(a.size for a in ours)
        unequal += diff
        unequal_cases += diff > 0
    return {"cases": n, "elements": elements, "unequal_elements": unequal,
            "unequal_cases": unequal_cases}


def timing(kernel, reps):
    """Microseconds per call in a chain of 24 one-row calls (e4b sliding heads, fused views)."""
    q, k, v, qw, kw = inputs(7, 1, 256, mx.bfloat16, 8, 2, True)
    # Chain through the query: the next call's q is this call's normed q, flattened back.
    step_mlx = lambda x: mlx_norms(x, k, v, qw, kw, 8, 2)[0].reshape(1, 1, -1)
    step_kernel = lambda x: kernel_norms(kernel, x, k, v, qw, kw, 8, 2)[0].reshape(1, 1, -1)
    return {"mlx_ops_us": chain_time(step_mlx, q, reps, calls=24),
            "kernel_us": chain_time(step_kernel, q, reps, calls=24)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--variant", default="literal", help=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="a few cases per variant, no timing")
    ap.add_argument("--sweep", type=int, default=0, help="N more random e4b-shaped cases")
    ap.add_argument("--calls", choices=["precompiled", "jit"], default="precompiled")
    a = ap.parse_args()
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "calls": a.calls,
               "variants": {}}
    ok = True
    dims = (256, 512) if a.quick else (64, 128, 256, 512)
    for variant in a.variant.split(","):
        kernel = make_kernel(variant, a.calls)
        cases, seed = [], 0
        for dtype in (mx.bfloat16, mx.float16, mx.float32):
            for d in dims:
                for rows in (1, 3, 9):
                    for heads, kv_heads in ((8, 2), (4, 1)):
                        for views in (True, False):
                            seed += 1
                            cases.append(case(kernel, seed, rows, d, dtype, heads, kv_heads,
                                              views))
        bad = [c for c in cases if any(e != 1.0 for e in c["equal"])]
        for c in bad[:20]:
            print(f"{variant}: differs: {c}", flush=True)
        independent = batch_independent(kernel, 99)
        good = not bad and independent
        print(f"{variant}: {len(cases) - len(bad)} of {len(cases)} cases bit-equal to MLX's ops; "
              f"a row alone == the row in a 9-row call: {independent}", flush=True)
        sw = sweep(kernel, a.sweep) if a.sweep else None
        if sw:
            good = good and sw["unequal_elements"] == 0
            print(f"{variant}: sweep of {sw['cases']} cases: {sw['unequal_elements']} of "
                  f"{sw['elements']} elements differ, in {sw['unequal_cases']} cases", flush=True)
        results["variants"][variant] = {"cases": cases, "sweep": sw, "ok": good,
                                        "batch_independent": independent}
        if not a.quick:
            t = timing(kernel, a.reps)
            print(f"{variant}: chain of 24 calls (8 + 2 + 2 heads of 256, bf16): MLX ops "
                  f"{t['mlx_ops_us']:.1f} us, kernel {t['kernel_us']:.1f} us per call", flush=True)
            results["variants"][variant]["timing"] = t
        if variant == "literal":
            ok = ok and good
        elif not bad:  # a control the check cannot tell from MLX: the check proves nothing
            print(f"{variant}: the control matched MLX everywhere", flush=True)
            ok = False
    results["ok"] = ok
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print("head_norms:", "ok" if ok else "FAILED", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
