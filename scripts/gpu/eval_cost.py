#!/usr/bin/env python3
"""Host cost of one graph node by MLX primitive, at e4b decode-step shapes (bf16, one row), on
the machine it runs on: where a decode step's host time goes when MLX encodes its graph.

A one-row e4b decode step is ~1600 graph nodes and the host, not the GPU, bounds it (memexec
generate's profile: ~80% of a step is MLX's `async_eval` encoding the graph). Node counts alone
mislead (session 10: a kernel that replaced 252 RMSNorm / Add / Multiply nodes of a step did not
shorten the encoding), so this measures each primitive: N independent nodes of one kind over
evaluated inputs, then
  - encode_us: host microseconds per node inside `mx.async_eval` (MLX encodes on the calling
    thread and returns once everything is submitted),
  - total_us: per node until `mx.synchronize()` returns (encode + whatever the GPU adds).
Best of `--reps` runs. Python builds the graph before the clock starts, so its own overhead is
not counted.

Usage: eval_cost.py [--nodes N] [--reps R] [--out FILE]
"""
import argparse
import json
import time

import mlx.core as mx
import numpy as np

from attention_cases import HEADS, KV_HEADS
from attention_cases import normal_bf16 as bf16

D, HEAD_DIM, KEYS = 2560, 256, 400


def cases(rng):
    """name -> a function that makes one node of that kind over shared, evaluated inputs."""
    x = bf16(rng, (1, 1, D))
    y = bf16(rng, (1, 1, D))
    w = bf16(rng, (D,))
    s = mx.broadcast_to(bf16(rng, (1,)), (1, 1, D))
    wq, sq, bq = mx.quantize(bf16(rng, (2048, D), 0.02), group_size=64, bits=4)
    p = mx.softmax(bf16(rng, (1, KV_HEADS, HEADS // KV_HEADS, 1, KEYS)), axis=-1, precise=True)
    v = bf16(rng, (1, KV_HEADS, 1, KEYS, HEAD_DIM))
    scores = bf16(rng, (1, KV_HEADS, HEADS // KV_HEADS, 1, KEYS))
    cache = bf16(rng, (1, KV_HEADS, 1024, HEAD_DIM))
    kv_new = bf16(rng, (1, KV_HEADS, 1, HEAD_DIM))
    q = bf16(rng, (1, HEADS, 1, HEAD_DIM))
    logits = bf16(rng, (1, 262144))
    copy = None if mx.default_device() == mx.cpu else mx.fast.cuda_kernel(
        name="eval_cost_copy", input_names=["a"], output_names=["o"],
        source="int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < a_shape[2]) o[i] = a[i];")
    mx.eval(x, y, w, s, wq, sq, bq, p, v, scores, cache, kv_new, q, logits)
    ops = {
        "rms_norm": lambda: mx.fast.rms_norm(x, w, 1e-6),
        "add": lambda: x + y,
        "multiply_broadcast_scalar": lambda: x * s,
        "quantized_matmul_qmv_2560x2048": lambda: mx.quantized_matmul(
            x, wq, sq, bq, transpose=True, group_size=64, bits=4),
        "matmul_p_v_cublas": lambda: p @ v,
        "softmax_precise_400": lambda: mx.softmax(scores, axis=-1, precise=True),
        # The dynamic form (start indices as an array); memexec writes with the static one.
        "dynamic_slice_update_cache_write": lambda: mx.slice_update(
            cache, kv_new, mx.array([0, 0, 7, 0]), axes=(0, 1, 2, 3)),
        "rope_8x256": lambda: mx.fast.rope(q, HEAD_DIM, traditional=False, base=10000.0,
                                           scale=1.0, offset=7),
        "reshape_view": lambda: x.reshape(1, D),
        "argmax_vocab": lambda: mx.argmax(logits, axis=-1),
        "custom_kernel_copy": lambda: copy(inputs=[x], output_shapes=[x.shape],
                                           output_dtypes=[x.dtype], grid=(D, 1, 1),
                                           threadgroup=(256, 1, 1))[0],
    }
    if copy is None:  # a CPU run (a dry run of this script): no custom kernels there
        del ops["custom_kernel_copy"]
    return ops


def measure(make, nodes, reps):
    best_encode = best_total = float("inf")
    for _ in range(reps + 1):  # the first run compiles / warms
        outs = [make() for _ in range(nodes)]
        mx.synchronize()
        t0 = time.perf_counter()
        mx.async_eval(outs)
        t1 = time.perf_counter()
        mx.synchronize()
        t2 = time.perf_counter()
        best_encode = min(best_encode, (t1 - t0) / nodes * 1e6)
        best_total = min(best_total, (t2 - t0) / nodes * 1e6)
        del outs
    return {"encode_us": round(best_encode, 2), "total_us": round(best_total, 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    results = {"mlx": mx.__version__, "device": str(mx.default_device()), "nodes": a.nodes,
               "ops": {}}
    for name, make in cases(rng).items():
        r = measure(make, a.nodes, a.reps)
        results["ops"][name] = r
        print(f"{name:34} encode {r['encode_us']:7.2f} us/node   total {r['total_us']:7.2f} us/node",
              flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
