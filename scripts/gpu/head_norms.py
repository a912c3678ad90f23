#!/usr/bin/env python3
"""memexec's q/k/v head-norm kernel (src/model/kernels/head_norms.cu, MEMEXEC_HEAD_NORM_KERNEL=1)
against MLX's own ops, on the machine it runs on (MLX CUDA only).

The kernel norms every query / key / value head of one decode position in one node and, in its
rotating forms, applies RoPE to the queries and keys; MLX (and memexec without it, and mlx-lm's
Gemma-4 attention) reshapes each projection into heads, runs `RMSNorm` on it (the value norm
without a weight) and `RoPE` on queries and keys. For bf16 / f16 / f32, head dims 64..512
(Gemma-4 e4b's 256 and 512 among them), 1..9 rows, 8 / 2 and 4 / 1 heads, q / k / v as views of
one fused product (as the model passes them) and as arrays of their own:
  - the norms: each output vs MLX's (fraction of elements bit-equal: must be 1.0), batch
    independence (a row alone == the same row inside a 9-row call), `--sweep N` more cases;
  - the rotation, for each of the kernel's four ways of writing its products (`VARIANT`,
    src/model/head_norms.rs ROPE_VARIANTS, tried in that order at load): e4b's sliding heads
    (base 10000) and full heads (proportional RoPE) at offsets up to 100000, queries alone too;
    which variants give MLX's bits everywhere (memexec takes the first);
  - host + device time of a chain of 24 calls (a one-row e4b step's worth): MLX's ops vs the
    kernel, with and without the rotation.
`--variant nofma` sums the squares without fma (MLX sums them with fma): a control that must
differ somewhere, or the check could not fail. The kernel is called precompiled (precompiled.py,
as memexec calls it with MEMEXEC_KERNEL_CALLS=precompiled) unless `--calls jit`.

Usage: head_norms.py [--out FILE] [--variant literal,nofma] [--sweep N] [--reps N] [--quick]
       [--calls precompiled|jit]
Exit 1 when the literal norms differ from MLX anywhere, when no rotation variant matches MLX
everywhere, or when a control variant run does not differ.
"""
import argparse
import ctypes
import json
import math
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
ROPE_VARIANTS = (0, 1, 2, 3)  # head_norms.rs ROPE_VARIANTS
VARIANTS = {
    "literal": [],
    "nofma": [("sum = __fmaf_rn(f, f, sum);", "sum = __fadd_rn(sum, __fmul_rn(f, f));")],
}


def f32_bits(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


def log2f(x):
    """The C library's f32 log2: what MLX's `std::log2(base)` and memexec's `f32::log2` call."""
    libm = ctypes.CDLL("libm.so.6")
    libm.log2f.restype, libm.log2f.argtypes = ctypes.c_float, [ctypes.c_float]
    return libm.log2f(x)


def eps_bits():
    return f32_bits(EPS)


def source(rope, kv, body=BODY):
    """head_norms.rs `source`: what a variant lacks declared as nullptr, then the body."""
    pre = ""
    if not rope:
        pre += "const int32_t* offsets = nullptr;\nconst float* freqs = nullptr;\n"
    if not kv:
        pre += "T* kn = nullptr;\nT* vn = nullptr;\n"
    return pre + body


def make_kernels(variant, calls):
    """The three forms memexec makes (head_norms.rs `kernel`), by (rope, kv)."""
    body = BODY
    for old, new in VARIANTS[variant]:
        assert old in body, old
        body = body.replace(old, new)
    make = PrecompiledKernel if calls == "precompiled" else mx.fast.cuda_kernel
    ins = ["q", "k", "v", "qw", "kw"]
    return {
        (False, True): make(name=f"memexec_head_norms_{variant}", input_names=ins,
                            output_names=["qn", "kn", "vn"], source=source(False, True, body),
                            header=HEADER, ensure_row_contiguous=False),
        (True, True): make(name=f"memexec_head_norms_rope_{variant}",
                           input_names=ins + ["offsets", "freqs"],
                           output_names=["qn", "kn", "vn"], source=source(True, True, body),
                           header=HEADER, ensure_row_contiguous=False),
        (True, False): make(name=f"memexec_head_norms_rope_q_{variant}",
                            input_names=ins + ["offsets", "freqs"], output_names=["qn"],
                            source=source(True, False, body), header=HEADER,
                            ensure_row_contiguous=False),
    }


def template(dtype, d, heads, kv_heads, rope_consts=(0, 0, 0, 0, 0, 0)):
    """head_norms.rs `fused`'s template constants, in its order."""
    threads, chunks = mlx_launch(d, dtype)
    names = ("ROPE", "FREQS", "LOG2_BASE_BITS", "SCALE_BITS", "OFFSET_STRIDE", "VARIANT")
    return [("T", dtype), ("D", d), ("BLOCK", threads), ("CHUNKS", chunks),
            ("EPS_BITS", eps_bits()), ("HQ", heads), ("HK", kv_heads),
            *zip(names, rope_consts)]


class Rotation:
    """A Gemma-4 RoPE as memexec builds it (rope.rs): base (default) or per-pair periods
    (proportional), with the offsets array RowOffsets passes (one row: a scalar)."""

    def __init__(self, d, kind, offsets):
        self.d, self.kind = d, kind
        self.offsets = mx.array(offsets[0] if len(offsets) == 1 else offsets, dtype=mx.int32)
        if kind == "proportional":  # theta 1e6, partial 0.25, factor 1
            rotated = int(d * 0.25)
            rot = mx.power(mx.array(1e6, mx.float32),
                           mx.arange(0, rotated, 2, dtype=mx.float32) / d) * 1.0
            rest = mx.full(((d - rotated) // 2,), math.inf, dtype=mx.float32)
            self.freqs, self.base = mx.concatenate([rot, rest]), None
        else:
            self.freqs, self.base = None, 10000.0
        mx.eval(self.offsets, *(a for a in (self.freqs,) if a is not None))

    def consts(self, variant, rows):
        log2_base = 0 if self.base is None else f32_bits(log2f(self.base))
        stride = 0 if self.offsets.size == 1 else 1
        return (1, int(self.freqs is not None), log2_base, f32_bits(1.0), stride, variant)

    def mlx(self, x):
        return mx.fast.rope(x, self.d, traditional=False, base=self.base, scale=1.0,
                            offset=self.offsets, freqs=self.freqs)


def kernel_call(kernels, q, k, v, qw, kw, heads, kv_heads, rot=None, variant=0):
    """head_norms.rs `fused`: q / k / v [B, 1, heads * d] -> [B, heads, 1, d] (k / v None:
    queries alone, which only the rotating form takes)."""
    b, d = q.shape[0], qw.shape[0]
    threads, _ = mlx_launch(d, q.dtype)
    kv = k is not None
    hk = kv_heads if kv else 0
    inputs = [q, k, v, qw, kw] if kv else [q, q, q, qw, qw]
    consts = (0, 0, 0, 0, 0, 0)
    if rot is not None:
        freqs = rot.freqs if rot.freqs is not None else mx.array(0.0, dtype=mx.float32)
        inputs += [rot.offsets, freqs]
        consts = rot.consts(variant, b)
    shapes = [(b, heads, 1, d)] + ([(b, hk, 1, d)] * 2 if kv else [])
    return kernels[(rot is not None, kv)](
        inputs=inputs, template=template(q.dtype, d, heads, hk, consts),
        grid=(b * (heads + 2 * hk) * threads, 1, 1), threadgroup=(threads, 1, 1),
        output_shapes=shapes, output_dtypes=[q.dtype] * len(shapes))


def mlx_reference(q, k, v, qw, kw, heads, kv_heads, rot=None):
    """memexec's split_heads + RMSNorm (+ RoPE) for one position (and mlx-lm's attention)."""
    b, d = q.shape[0], qw.shape[0]
    out = [mx.fast.rms_norm(q.reshape(b, heads, 1, d), qw, EPS)]
    if k is not None:
        out += [mx.fast.rms_norm(k.reshape(b, kv_heads, 1, d), kw, EPS),
                mx.fast.rms_norm(v.reshape(b, kv_heads, 1, d), None, EPS)]
    if rot is not None:
        out[0] = rot.mlx(out[0])
        if k is not None:
            out[1] = rot.mlx(out[1])
    return out


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


def norm_cases(kernels, dims):
    cases, seed = [], 0
    for dtype in (mx.bfloat16, mx.float16, mx.float32):
        for d in dims:
            for rows in (1, 3, 9):
                for heads, kv_heads in ((8, 2), (4, 1)):
                    for views in (True, False):
                        seed += 1
                        args = inputs(seed, rows, d, dtype, heads, kv_heads, views)
                        ours = kernel_call(kernels, *args, heads, kv_heads)
                        theirs = mlx_reference(*args, heads, kv_heads)
                        cases.append({"rows": rows, "d": d, "dtype": str(dtype),
                                      "heads": [heads, kv_heads], "views": views,
                                      "equal": [equal(a, b) for a, b in zip(ours, theirs)]})
    return cases


def rope_cases(kernels, variant, quick):
    """The rotation at e4b's shapes: fraction of elements bit-equal per case."""
    cases, seed = [], 1000
    offsets_sets = ([4321], [7, 1234, 30000]) if quick else \
        ([0], [4321], [99999], [7, 1234, 30000], [1, 2, 3, 511, 512, 4097, 65535, 100000, 17])
    for d, kind in ((256, "default"), (512, "proportional")):
        for offsets in offsets_sets:
            for kv in (True, False):
                seed += 1
                rows = len(offsets)
                q, k, v, qw, kw = inputs(seed, rows, d, mx.bfloat16, 8, 2, True)
                rot = Rotation(d, kind, offsets)
                kk, vv = (k, v) if kv else (None, None)
                ours = kernel_call(kernels, q, kk, vv, qw, kw, 8, 2, rot, variant)
                theirs = mlx_reference(q, kk, vv, qw, kw, 8, 2, rot)
                cases.append({"d": d, "rope": kind, "offsets": offsets, "kv": kv,
                              "equal": [equal(a, b) for a, b in zip(ours, theirs)]})
    return cases


def batch_independent(kernels, seed, variant):
    """Row 4 of a 9-row call == that row alone (bf16, e4b's sliding heads), with rotation."""
    q, k, v, qw, kw = inputs(seed, 9, 256, mx.bfloat16, 8, 2, True)
    offs = [3, 50, 700, 9000, 123, 4, 5, 6, 7]
    many = kernel_call(kernels, q, k, v, qw, kw, 8, 2, Rotation(256, "default", offs), variant)
    one = kernel_call(kernels, q[4:5], k[4:5], v[4:5], qw, kw, 8, 2,
                      Rotation(256, "default", [offs[4]]), variant)
    return all(mx.array_equal(a[4:5], b).item() for a, b in zip(many, one))


def sweep(kernels, n):
    unequal = elements = unequal_cases = 0
    for i in range(n):
        d = (256, 512)[i % 2]
        args = inputs(20_000 + i, 1 + i % 8, d, mx.bfloat16, 8, 2, True)
        ours = kernel_call(kernels, *args, 8, 2)
        theirs = mlx_reference(*args, 8, 2)
        diff = sum(int((a != b).sum().item()) for a, b in zip(ours, theirs))
        elements += sum(a.size for a in ours)
        unequal += diff
        unequal_cases += diff > 0
    return {"cases": n, "elements": elements, "unequal_elements": unequal,
            "unequal_cases": unequal_cases}


def timing(kernels, reps, variant):
    """Microseconds per call in a chain of 24 one-row calls (e4b sliding heads, fused views)."""
    q, k, v, qw, kw = inputs(7, 1, 256, mx.bfloat16, 8, 2, True)
    rot = Rotation(256, "default", [100])
    # Chain through the query: the next call's q is this call's q output, flattened back.
    flat = lambda a: a.reshape(1, 1, -1)
    return {
        "mlx_norms_us": chain_time(lambda x: flat(mlx_reference(x, k, v, qw, kw, 8, 2)[0]), q,
                                   reps, calls=24),
        "kernel_norms_us": chain_time(lambda x: flat(kernel_call(kernels, x, k, v, qw, kw, 8,
                                                                 2)[0]), q, reps, calls=24),
        "mlx_rope_us": chain_time(lambda x: flat(mlx_reference(x, k, v, qw, kw, 8, 2, rot)[0]),
                                  q, reps, calls=24),
        "kernel_rope_us": chain_time(lambda x: flat(kernel_call(kernels, x, k, v, qw, kw, 8, 2,
                                                                rot, variant)[0]), q, reps,
                                     calls=24)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--variant", default="literal", help=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="fewer cases, no timing")
    ap.add_argument("--sweep", type=int, default=0, help="N more random e4b-shaped cases")
    ap.add_argument("--calls", choices=["precompiled", "jit"], default="precompiled")
    a = ap.parse_args()
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "calls": a.calls,
               "variants": {}}
    ok = True
    dims = (256, 512) if a.quick else (64, 128, 256, 512)
    for variant in a.variant.split(","):
        kernels = make_kernels(variant, a.calls)
        cases = norm_cases(kernels, dims)
        bad = [c for c in cases if any(e != 1.0 for e in c["equal"])]
        for c in bad[:20]:
            print(f"{variant}: norms differ: {c}", flush=True)
        good = not bad
        print(f"{variant}: norms: {len(cases) - len(bad)} of {len(cases)} cases bit-equal to "
              f"MLX's ops", flush=True)
        res = {"cases": cases, "ok": good}
        if variant == "literal":
            rope = {}
            for rv in ROPE_VARIANTS:
                rc = rope_cases(kernels, rv, a.quick)
                n_eq = sum(all(e == 1.0 for e in c["equal"]) for c in rc)
                rope[rv] = {"cases": rc, "all_equal": n_eq == len(rc)}
                worst = min(min(c["equal"]) for c in rc)
                print(f"rotation variant {rv}: {n_eq} of {len(rc)} cases bit-equal to MLX's "
                      f"RoPE (worst case {worst:.6f} of elements)", flush=True)
            chosen = next((rv for rv in ROPE_VARIANTS if rope[rv]["all_equal"]), None)
            print(f"rotation: memexec would take variant {chosen}", flush=True)
            res["rope"], res["rope_variant"] = rope, chosen
            good = good and chosen is not None
            if chosen is not None:
                independent = batch_independent(kernels, 99, chosen)
                print(f"a row alone == the row in a 9-row call: {independent}", flush=True)
                res["batch_independent"] = independent
                good = good and independent
            sw = sweep(kernels, a.sweep) if a.sweep else None
            if sw:
                good = good and sw["unequal_elements"] == 0
                print(f"sweep of {sw['cases']} cases: {sw['unequal_elements']} of "
                      f"{sw['elements']} elements differ, in {sw['unequal_cases']} cases",
                      flush=True)
            res["sweep"] = sw
            if not a.quick and chosen is not None:
                t = timing(kernels, a.reps, chosen)
                print("chain of 24 calls (8 + 2 + 2 heads of 256, bf16), us per call: " +
                      ", ".join(f"{k} {v:.1f}" for k, v in t.items()), flush=True)
                res["timing"] = t
            ok = ok and good
        elif not bad:  # a control the check cannot tell from MLX: the check proves nothing
            print(f"{variant}: the control matched MLX everywhere", flush=True)
            ok = False
        results["variants"][variant] = res
    results["ok"] = ok
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print("head_norms:", "ok" if ok else "FAILED", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
