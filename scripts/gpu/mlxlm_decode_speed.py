"""Single-stream greedy decode speed of mlx-lm's `generate_step` on one prompt, measured the way
`memexec generate` reports it: tokens after the first over the time after the first token.

Run next to `memexec generate` on the same ids and with the same MLX environment variables
(e.g. MLX_MAX_OPS_PER_BUFFER), so the two numbers compare one decoder with the other.

usage: mlxlm_decode_speed.py MODEL_DIR --prompt-ids 1,2,3 [--tokens 128] [--reps 2]
prints one JSON line: {"decode_tokens_per_s": [...], "ids_head": [...], env}
"""
import argparse
import json
import os
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    ids = [int(t) for t in a.prompt_ids.split(",")]
    model, _ = load(a.model)
    rates, head = [], None
    for _ in range(a.reps + 1):  # the first run warms up the kernels and is not reported
        out, t_first = [], None
        for y, _ in generate_step(mx.array(ids), model, max_tokens=a.tokens,
                                  sampler=lambda x: mx.argmax(x, axis=-1)):
            out.append(int(y))
            if t_first is None:
                t_first = time.perf_counter()
        dt = time.perf_counter() - t_first
        rates.append((len(out) - 1) / dt)
        head = out[:8]
    env = {k: v for k, v in os.environ.items() if k.startswith("MLX_")}
    print(json.dumps({"decode_tokens_per_s": rates[1:], "ids_head": head, "env": env}))


if __name__ == "__main__":
    main()
