#!/usr/bin/env python3
"""memexec's one-kernel decode attention (src/model/kernels/decode_attention.cu) against MLX's
`scaled_dot_product_attention`, on the machine it runs on (MLX CUDA only: the kernel is CUDA).

For e4b's attention shapes (8 query heads, 2 KV heads, head dim 256 / 512, bf16) and key counts
1..MAX_KEYS, keys / values as cache views (a prefix of a larger buffer, as memexec's caches):
  - how close each is to an f64 reference (max |error|), and how often the kernel's output
    equals MLX's bit for bit;
  - batch independence: the kernel on one row == that row inside a 5-row call;
  - host + device time per call in a chain of 42 calls (one decode step's attention).

Usage: attention_kernel.py [--out FILE] [--reps N]
"""
import argparse
import json
import os

import mlx.core as mx
import numpy as np

from attention_cases import HEADS, KV_HEADS, cache_case, normal_bf16, scale_bits
from device_timing import chain_time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = open(os.path.join(ROOT, "src/model/kernels/decode_attention.cu")).read()
MAX_KEYS = 8192



def source(rows):
    """The kernel source for `rows` rows, as src/model/decode_attention.rs `source` builds it."""
    s = ("const int heads = q_shape[1];\nconst int row = blockIdx.x / heads;\n"
         "const int h = blockIdx.x % heads;\nconst T* kr;\nconst T* vr;\nint n_keys, kv_heads;\n"
         "int64_t k_head, k_step, v_head, v_step;\nswitch (row) {\n")
    for r in range(rows):
        s += (f"  case {r}: kr = k{r}; vr = v{r}; n_keys = k{r}_shape[2]; kv_heads = k{r}_shape[1];\n"
              f"    k_head = k{r}_strides[1]; k_step = k{r}_strides[2];\n"
              f"    v_head = v{r}_strides[1]; v_step = v{r}_strides[2]; break;\n")
    s += ("  default: return;\n}\nconst T* qh = q + row * q_strides[0] + h * q_strides[1];\n"
          "T* oh = out + (row * heads + h) * D;\n")
    return s + SOURCE


ROWS_PER_CALL = 8  # src/model/decode_attention.rs
KERNEL = mx.fast.cuda_kernel(
    name="memexec_decode_attention",
    input_names=["q"] + [n for r in range(ROWS_PER_CALL) for n in (f"k{r}", f"v{r}")],
    output_names=["out"], source=source(ROWS_PER_CALL), ensure_row_contiguous=False)


def kernel_attention(q, k, v, scale):
    """q [B, H, 1, D] (B <= ROWS_PER_CALL); k, v: one [1, G, S, D] array or a list of B."""
    kv = list(zip(k, v)) if isinstance(k, list) else [(k, v)]
    rows, d = len(kv), q.shape[-1]
    kv += [kv[0]] * (ROWS_PER_CALL - rows)  # unused inputs: row 0's arrays, as memexec does
    return KERNEL(
        inputs=[q] + [a for pair in kv for a in pair],
        template=[("T", q.dtype), ("D", d), ("SCALE_BITS", scale_bits(scale)),
                  ("MAX_KEYS", MAX_KEYS)],
        grid=(rows * HEADS * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )[0]


def reference(q, k, v, scale):
    qf = np.array(q.astype(mx.float32)).astype(np.float64)[0, :, 0]  # [H, D]
    kf = np.array(k.astype(mx.float32)).astype(np.float64)[0]  # [G, S, D]
    vf = np.array(v.astype(mx.float32)).astype(np.float64)[0]
    rep = HEADS // KV_HEADS
    out = np.zeros_like(qf)
    for h in range(HEADS):
        s = kf[h // rep] @ qf[h] * scale
        p = np.exp(s - s.max())
        p /= p.sum()
        out[h] = p @ vf[h // rep]
    return out


def case(d, n, cap, scale, seed):
    q, k, v, kb, vb = cache_case(seed, d, n, cap)
    ours = kernel_attention(q, k, v, scale)
    mlx = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    mx.eval(ours, mlx)
    ref = reference(q, k, v, scale)
    o = np.array(ours.astype(mx.float32))[0, :, 0].astype(np.float64)
    m = np.array(mlx.astype(mx.float32))[0, :, 0].astype(np.float64)
    again = kernel_attention(q, k, v, scale)
    # Batch independence: the row as row 2 of a 5-row call whose other rows hold other keys.
    others = [(kb[:, :, : max(1, n - 3 * i), :], vb[:, :, : max(1, n - 3 * i), :]) for i in range(1, 5)]
    rows = others[:2] + [(k, v)] + others[2:]
    qs = mx.concatenate([q * (i + 1) if i != 2 else q for i in range(5)], axis=0)
    batch = kernel_attention(qs, [a for a, _ in rows], [b for _, b in rows], scale)
    mx.eval(again, batch)
    return {
        "head_dim": d, "keys": n, "buffer": cap, "scale": scale,
        "kernel_max_err": float(np.abs(o - ref).max()),
        "mlx_max_err": float(np.abs(m - ref).max()),
        "bitwise_equal_to_mlx": float((np.array(ours.view(mx.uint16)) == np.array(mlx.view(mx.uint16))).mean()),
        "repeatable": bool(mx.array_equal(ours, again).item()),
        "same_in_a_batch": bool(mx.array_equal(ours[0], batch[2]).item()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "cases": [], "timing": []}
    seed = 0
    for d in (256, 512):
        for n in (1, 7, 37, 256, 511, 512, 1000, 1100, 4000, MAX_KEYS):
            for scale in (1.0, 0.0625):
                cap = ((n + 255) // 256) * 256 + (256 if n % 256 == 0 else 0)
                seed += 1
                r = case(d, n, cap, scale, seed)
                results["cases"].append(r)
                print(f"D={d:4} S={n:5} scale={scale:<7} kernel err {r['kernel_max_err']:.3e}  "
                      f"mlx err {r['mlx_max_err']:.3e}  equal {r['bitwise_equal_to_mlx']:.3f}  "
                      f"repeatable {r['repeatable']}  same in a batch {r['same_in_a_batch']}", flush=True)
    for d, n in ((256, 512), (512, 1000)):
        rng = np.random.default_rng(1)
        q = normal_bf16(rng, (1, HEADS, 1, d))
        k = normal_bf16(rng, (1, KV_HEADS, n, d))
        v = normal_bf16(rng, (1, KV_HEADS, n, d))
        mx.eval(q, k, v)
        ours = chain_time(lambda x: kernel_attention(x, k, v, 1.0), q, a.reps)
        mlx = chain_time(lambda x: mx.fast.scaled_dot_product_attention(x, k, v, scale=1.0),
                         q, a.reps)
        results["timing"].append({"head_dim": d, "keys": n, "kernel_us_per_call": ours,
                                  "mlx_us_per_call": mlx})
        print(f"timing D={d} S={n}: kernel {ours:.1f} us/call, mlx sdpa {mlx:.1f} us/call", flush=True)
    bad = [c for c in results["cases"] if not c["repeatable"] or not c["same_in_a_batch"]
           or c["kernel_max_err"] > 4 * max(c["mlx_max_err"], 1e-3)]
    results["ok"] = not bad
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print("ok" if not bad else f"FAILED: {len(bad)} cases", flush=True)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
