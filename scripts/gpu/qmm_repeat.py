#!/usr/bin/env python3
"""Is MLX's 4-bit product repeatable bit for bit on this machine? (the H200, MLX CUDA)

A public report (lablup/mlxcel #910, fixed there in #923) traced run-to-run differences of
4-bit CUDA models to a shared-memory race inside MLX's tiled `qmm_sm80` kernel, the product
MLX runs from 8 rows on (`qmv` below): its epilogue stages the output tile in shared memory
that aliases the input pipeline's slots without first waiting for the last async copies. If
that holds for MLX 0.32.2 here, every prefill (memexec's and mlx-lm's alike) can differ between
two identical runs, which is what session 5 saw once at `MLX_MAX_OPS_PER_BUFFER=240`.

Measures, for e4b product shapes and several row counts: the same product evaluated `--reps`
times (one at a time, and `--group` independent copies in one graph), against the first
result; the share of repetitions that differ in any bit, and the largest difference. With
`--model DIR` also mlx-lm's prefill of a random-id prompt, repeated: last-position logits
bit-equal to the first run's, and whether the greedy id changed.

Usage: qmm_repeat.py [--rows 1,7,8,16,64,399] [--reps 100] [--group 8] [--model DIR]
                     [--model-reps 20] [--out FILE]
"""
import argparse
import json
import os
import time

import mlx.core as mx

# (n, k): the e4b's MLP down projection and one fused gate/up half.
SHAPES = [(2560, 10240), (10240, 2560)]


def product(x, w, s, b):
    return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)


def max_diff(a, b):
    return float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item())


def op_case(n, k, rows, reps, group):
    key = mx.random.key(n * 7 + k * 13 + rows)
    kw, kx = mx.random.split(key)
    w, s, b = mx.quantize(mx.random.normal((n, k), key=kw).astype(mx.bfloat16) * 0.02, 64, 4)
    x = mx.random.normal((rows, k), key=kx).astype(mx.bfloat16)
    ref = product(x, w, s, b)
    mx.eval(ref)
    single = grouped = 0
    worst = 0.0
    t0 = time.perf_counter()
    for _ in range(reps):
        y = product(x, w, s, b)
        mx.eval(y)
        if not mx.array_equal(y, ref).item():
            single += 1
            worst = max(worst, max_diff(y, ref))
        ys = [product(x, w, s, b) for _ in range(group)]
        mx.eval(ys)
        bad = [not mx.array_equal(v, ref).item() for v in ys]
        if any(bad):
            grouped += 1
            worst = max(worst, max(max_diff(v, ref) for v, d in zip(ys, bad) if d))
    return {
        "n": n,
        "k": k,
        "rows": rows,
        "reps": reps,
        "single_differs": single,
        "group": group,
        "grouped_differs": grouped,
        "max_abs_diff": worst,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def model_case(path, length, reps):
    from mlx_lm import load

    model, _ = load(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    vocab = config.get("text_config", config)["vocab_size"]
    ids = mx.random.randint(10, vocab, (1, length), key=mx.random.key(length))
    first = None
    differs = argmax_changed = 0
    worst = 0.0
    for _ in range(reps):
        logits = model(ids)[0, -1].astype(mx.float32)
        mx.eval(logits)
        if first is None:
            first = logits
            continue
        if not mx.array_equal(logits, first).item():
            differs += 1
            worst = max(worst, max_diff(logits, first))
        if mx.argmax(logits).item() != mx.argmax(first).item():
            argmax_changed += 1
    return {
        "prompt_ids": length,
        "reps": reps,
        "logits_differ": differs,
        "argmax_changed": argmax_changed,
        "max_abs_diff": worst,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,7,8,16,64,399")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--model")
    ap.add_argument("--lengths", default="8,64,399")
    ap.add_argument("--model-reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    result = {"mlx": mx.__version__, "device": str(mx.default_device()), "ops": [], "model": []}
    for n, k in SHAPES:
        for rows in [int(r) for r in a.rows.split(",") if r]:
            r = op_case(n, k, rows, a.reps, a.group)
            print(json.dumps(r), flush=True)
            result["ops"].append(r)
    if a.model:
        for length in [int(v) for v in a.lengths.split(",")]:
            r = model_case(a.model, length, a.model_reps)
            print(json.dumps(r), flush=True)
            result["model"].append(r)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
