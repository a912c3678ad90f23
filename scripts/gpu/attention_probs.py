#!/usr/bin/env python3
"""memexec's attention-probabilities kernel (src/model/kernels/attention_probs.cu) against MLX's
own decomposition of `scaled_dot_product_attention` (its CUDA fallback for head dims 256 / 512),
on the machine it runs on (MLX CUDA only).

For e4b's attention shapes (8 query heads, 2 KV heads, head dim 256 / 512, bf16), key counts
1..MAX_KEYS, keys / values as cache views (a prefix of a larger buffer, as memexec's caches):
  - the kernel's probabilities vs MLX's `softmax(T(scale * q) @ k^T, precise)` (fraction of
    elements bit-equal: must be 1.0);
  - the attention output `matmul(p, v)` from those probabilities vs MLX's
    `scaled_dot_product_attention` (bit-equal: must be 1.0);
  - batch independence: a row alone == the same row inside a 5-row call;
  - split independence: the same probabilities with the keys on 1 block or 16 per head;
  - host + device time of one layer's attention for 1 and 8 rows: MLX's op per row vs the
    kernel + one matmul per row.
`--variant` swaps in alternative roundings (for finding MLX's by trial, as session 8 did).

Usage: attention_probs.py [--out FILE] [--reps N] [--variant literal|...]
"""
import argparse
import json
import os

import mlx.core as mx
import numpy as np

from attention_cases import HEADS, KV_HEADS, cache_case, normal_bf16, scale_bits
from device_timing import timed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BODY = open(os.path.join(ROOT, "src/model/kernels/attention_probs.cu")).read()
HEADER = "#include <cooperative_groups/reduce.h>\n"  # src/model/attention_probs.rs HEADER
MAX_KEYS = 8192
ROWS_PER_CALL = 8  # src/model/attention_probs.rs
# src/model/attention_probs.rs: keys per split block, most blocks per (row, head), blocks a
# call aims at, most heads a split call takes.
KEYS_PER_CHUNK, MAX_CHUNKS, TARGET_BLOCKS, MAX_HEADS = 64, 16, 264, 64

VARIANTS = {
    "literal": [],
    # Scores summed without fma contraction.
    "nofma_scores": [("sum += static_cast<float>(row_k[c + NP * lane + j]) * qs[i];",
                      "sum = __fadd_rn(sum, __fmul_rn(static_cast<float>(row_k[c + NP * lane + j]), qs[i]));")],
    # The softmax reading 4 scores per thread per pass (MLX reads 16 bytes: 8 bf16): the
    # control that shows whether --sweep can tell reduction orders apart.
    "n_reads4": [("constexpr int N_READS = 16 / sizeof(T);", "constexpr int N_READS = 4;")],
    # Softmax normalizer without fma contraction.
    "nofma_softmax": [("normalizer = normalizer * __expf(prevmax - maxval);\n    for",
                       "normalizer = __fmul_rn(normalizer, __expf(prevmax - maxval));\n    for"),
                      ("normalizer = normalizer + __expf(vals[i] - maxval);",
                       "normalizer = __fadd_rn(normalizer, __expf(vals[i] - maxval));")],
}


def source(rows, variant):
    """The kernel source for `rows` rows, as src/model/attention_probs.rs `source` builds it."""
    s = ("const int heads = q_shape[1];\nconst int row = blockIdx.x / heads;\n"
         "const int h = blockIdx.x % heads;\nconst T* kr;\nT* pr;\nint n_keys, kv_heads;\n"
         "int64_t k_head, k_step;\nswitch (row) {\n")
    for r in range(rows):
        s += (f"  case {r}: kr = k{r}; pr = p{r}; n_keys = k{r}_shape[2]; kv_heads = k{r}_shape[1];\n"
              f"    k_head = k{r}_strides[1]; k_step = k{r}_strides[2]; break;\n")
    s += ("  default: return;\n}\nconst T* qh = q + row * q_strides[0] + h * q_strides[1];\n"
          "T* ph = pr + h * n_keys;\n"
          "int* counter = const_cast<int*>(counters) + row * heads + h;\n")
    body = BODY
    for old, new in VARIANTS[variant]:
        assert old in body, old
        body = body.replace(old, new)
    return s + body


def make_kernel(variant):
    return mx.fast.cuda_kernel(
        name=f"memexec_attention_probs_{variant}",
        input_names=["q"] + [f"k{r}" for r in range(ROWS_PER_CALL)] + ["counters"],
        output_names=[f"p{r}" for r in range(ROWS_PER_CALL)],
        source=source(ROWS_PER_CALL, variant), header=HEADER, ensure_row_contiguous=False)


def chunks_for(rows, heads, most_keys):
    """Blocks per (row, head), as src/model/attention_probs.rs `chunks` picks them."""
    if heads > MAX_HEADS:
        return 1
    by_keys = (most_keys + KEYS_PER_CHUNK - 1) // KEYS_PER_CHUNK
    return max(1, min(by_keys, TARGET_BLOCKS // max(1, rows * heads), MAX_CHUNKS))


def kernel_probs(kernel, q, ks, scale, chunks=None):
    """q [B, H, 1, D]; ks: B arrays [1, G, S_r, D] -> B arrays [1, G, H / G, 1, S_r].
    `chunks`: blocks per (row, head) (default: memexec's choice)."""
    rows, d = len(ks), q.shape[-1]
    g = ks[0].shape[1]
    if chunks is None:
        chunks = chunks_for(rows, HEADS, max(k.shape[2] for k in ks))
    # A fresh zeroed counter array per call (memexec keeps a ring of them, reset by the kernel).
    counters = mx.zeros((ROWS_PER_CALL * MAX_HEADS,), dtype=mx.int32)
    inputs = [q] + ks + [ks[0]] * (ROWS_PER_CALL - rows) + [counters]
    shapes = [(1, g, HEADS // g, 1, k.shape[2]) for k in ks] + [(1,)] * (ROWS_PER_CALL - rows)
    threads = 1024  # src/model/attention_probs.rs THREADS
    outs = kernel(
        inputs=inputs,
        template=[("T", q.dtype), ("D", d), ("SCALE_BITS", scale_bits(scale)),
                  ("MAX_KEYS", MAX_KEYS)],
        grid=(rows * HEADS * threads, chunks, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=shapes,
        output_dtypes=[q.dtype] * ROWS_PER_CALL,
    )
    return outs[:rows]


def mlx_probs(q, k, scale):
    """MLX's fallback up to the softmax (mlx/fast.cpp), for one row."""
    g = k.shape[1]
    qs = mx.multiply(mx.array(scale, dtype=q.dtype), q)
    qs = qs.reshape(1, g, HEADS // g, 1, q.shape[-1])
    scores = qs @ mx.swapaxes(mx.expand_dims(k, 2), -1, -2)
    return mx.softmax(scores, axis=-1, precise=True)


def times_values(p, v):
    """The fallback's last steps: matmul(p, v) and the flatten of the head groups."""
    return (p @ mx.expand_dims(v, 2)).reshape(1, HEADS, 1, v.shape[-1])


def equal(a, b):
    a, b = np.array(a.view(mx.uint16)), np.array(b.view(mx.uint16))
    return float((a == b).mean()) if a.shape == b.shape else 0.0


def case(kernel, d, n, cap, scale, seed):
    q, k, v, kb, vb = cache_case(seed, d, n, cap)
    (ours,) = kernel_probs(kernel, q, [k], scale)
    theirs = mlx_probs(q, k, scale)
    out_ours = times_values(ours, v)
    out_ops = times_values(theirs, v)
    sdpa = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
    mx.eval(ours, theirs, out_ours, out_ops, sdpa)
    # Batch independence: the row as row 2 of a 5-row call whose other rows hold other keys.
    others = [kb[:, :, : max(1, n - 3 * i), :] for i in range(1, 5)]
    rows = others[:2] + [k] + others[2:]
    qs = mx.concatenate([q * (i + 1) if i != 2 else q for i in range(5)], axis=0)
    batch = kernel_probs(kernel, qs, rows, scale)
    mx.eval(batch)
    # The split over blocks changes nothing: one block, and the most blocks.
    splits = [kernel_probs(kernel, q, [k], scale, chunks=c)[0] for c in (1, MAX_CHUNKS)]
    mx.eval(splits)
    return {
        "head_dim": d, "keys": n, "buffer": cap, "scale": scale,
        "probs_equal": equal(ours, theirs),
        "output_equal_to_sdpa": equal(out_ours, sdpa),
        "mlx_ops_equal_to_sdpa": equal(out_ops, sdpa),
        "same_in_a_batch": bool(mx.array_equal(ours, batch[2]).item()),
        "same_for_any_split": all(bool(mx.array_equal(ours, x).item()) for x in splits),
    }


def sweep_probs(kernel, n):
    """`n` random cases, probabilities only: how many elements differ from MLX's."""
    rng = np.random.default_rng(12345)
    elements = unequal = unequal_cases = 0
    for i in range(n):
        d = (256, 512)[i % 2]
        keys = int(rng.integers(300, 4001))
        q = normal_bf16(rng, (1, HEADS, 1, d), 0.5)
        k = normal_bf16(rng, (1, KV_HEADS, keys, d))
        (ours,) = kernel_probs(kernel, q, [k], 1.0)
        theirs = mlx_probs(q, k, 1.0)
        a = np.array(ours.view(mx.uint16))
        b = np.array(theirs.view(mx.uint16))
        diff = int((a != b).sum())
        elements += a.size
        unequal += diff
        unequal_cases += diff > 0
    return {"cases": n, "elements": elements, "unequal_elements": unequal,
            "unequal_cases": unequal_cases}


def layer_timing(kernel, rows, n, d, reps):
    """One layer's attention for `rows` rows of `n` keys: MLX's op per row (memexec's default
    before this kernel) vs the kernel + a matmul per row; host + device microseconds."""
    rng = np.random.default_rng(rows)
    q = normal_bf16(rng, (rows, HEADS, 1, d))
    ks = [normal_bf16(rng, (1, KV_HEADS, n + r, d)) for r in range(rows)]
    vs = [normal_bf16(rng, (1, KV_HEADS, n + r, d)) for r in range(rows)]
    mx.eval(q, *ks, *vs)

    def per_row():
        qr = mx.split(q, rows, axis=0) if rows > 1 else [q]
        outs = [mx.fast.scaled_dot_product_attention(qr[r], ks[r], vs[r], scale=1.0)
                for r in range(rows)]
        return mx.concatenate(outs, axis=0) if rows > 1 else outs[0]

    def kernel_rows():
        ps = kernel_probs(kernel, q, ks, 1.0)
        outs = [times_values(ps[r], vs[r]) for r in range(rows)]
        return mx.concatenate(outs, axis=0) if rows > 1 else outs[0]

    same = bool(mx.array_equal(per_row(), kernel_rows()).item())
    return {"rows": rows, "keys": n, "head_dim": d, "identical": same,
            "mlx_op_us": timed(per_row, reps), "kernel_us": timed(kernel_rows, reps)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--variant", default="literal", help=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="a few cases per variant, no timing")
    ap.add_argument("--sweep", type=int, default=0,
                    help="N more random cases (300-4000 keys) per variant, probabilities only: "
                         "enough elements to see a reduction order that differs from MLX's")
    a = ap.parse_args()
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "variants": {}}
    ok = True
    for variant in a.variant.split(","):
        kernel = make_kernel(variant)
        cases, seed = [], 0
        lengths = (7, 129, 1000) if a.quick else (1, 7, 37, 128, 129, 256, 511, 512, 1000, 1100,
                                                  4000, 4097, MAX_KEYS)
        for d in (256, 512):
            for n in lengths:
                for scale in ((1.0,) if a.quick else (1.0, 0.0625)):
                    cap = ((n + 255) // 256) * 256 + (256 if n % 256 == 0 else 0)
                    seed += 1
                    r = case(kernel, d, n, cap, scale, seed)
                    cases.append(r)
                    print(f"{variant}: D={d:4} S={n:5} scale={scale:<7} probs equal "
                          f"{r['probs_equal']:.4f}  output equal {r['output_equal_to_sdpa']:.4f}  "
                          f"(mlx ops {r['mlx_ops_equal_to_sdpa']:.4f})  same in a batch "
                          f"{r['same_in_a_batch']}  same for any split {r['same_for_any_split']}",
                          flush=True)
        good = all(c["probs_equal"] == 1.0 and c["output_equal_to_sdpa"] == 1.0
                   and c["same_in_a_batch"] and c["same_for_any_split"] for c in cases)
        sweep = sweep_probs(kernel, a.sweep) if a.sweep else None
        if sweep:
            good = good and sweep["unequal_elements"] == 0
            print(f"{variant}: sweep of {sweep['cases']} cases: {sweep['unequal_elements']} of "
                  f"{sweep['elements']} probabilities differ, in {sweep['unequal_cases']} cases",
                  flush=True)
        results["variants"][variant] = {"cases": cases, "sweep": sweep, "ok": good}
        ok = ok and good
        if not a.quick:
            timing = [layer_timing(kernel, rows, 1000, d, a.reps)
                      for rows in (1, 8) for d in (256, 512)]
            for t in timing:
                print(f"{variant}: timing rows={t['rows']} D={t['head_dim']} S={t['keys']}: MLX op "
                      f"per row {t['mlx_op_us']:.1f} us, kernel + matmuls {t['kernel_us']:.1f} us, "
                      f"identical {t['identical']}", flush=True)
            results["variants"][variant]["timing"] = timing
    results["ok"] = ok
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print("attention_probs:", "ok" if ok else "FAILED", flush=True)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
