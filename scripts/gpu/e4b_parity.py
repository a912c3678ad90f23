"""Greedy ids of mlx-lm (generate_step, argmax) vs memexec on the e4b-shaped checkpoint.

usage: e4b_parity.py MEMEXEC MODEL_DIR OUT.json [--tokens N] [--lengths 23,100,400] [--max-id N]
Random-id prompts (seeded), each decoded twice by mlx-lm in this process (run-to-run
determinism of the oracle) and once by `MEMEXEC generate --ignore-eos`; prints, per prompt,
how many of the N ids agree and where they first differ. Exit code 1 if any prompt differs.
"""
import argparse, json, random, subprocess, sys, time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

ap = argparse.ArgumentParser()
ap.add_argument("memexec"); ap.add_argument("model"); ap.add_argument("out")
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--lengths", default="23,100,400")
ap.add_argument("--max-id", type=int, default=200000, help="prompt ids are drawn from [3, max-id)")
a = ap.parse_args()

model, _ = load(a.model)
rng = random.Random(20261130)


def mlx_greedy(ids):
    out = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=a.tokens):
        out.append(int(tok))
    return out


def first_diff(x, y):
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)


res, bad = [], 0
for n in map(int, a.lengths.split(",")):
    ids = [2] + [rng.randrange(3, a.max_id) for _ in range(n - 1)]
    t = time.time()
    m1, m2 = mlx_greedy(ids), mlx_greedy(ids)
    p = subprocess.run([a.memexec, "generate", "--model", a.model, "--prompt-ids", ",".join(map(str, ids)),
                        "--max-tokens", str(a.tokens), "--ignore-eos", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"rand{n}: memexec failed: {p.stderr.strip()[-300:]}"); bad += 1; continue
    me = json.loads(p.stdout)["ids"]
    d = first_diff(me, m1)
    same = sum(x == y for x, y in zip(me, m1))
    print(f"rand{n}: memexec vs mlx-lm {same}/{len(m1)} identical"
          + ("" if d is None else f", first diff at {d}")
          + f"; mlx-lm run 2 {'==' if m1 == m2 else '!='} run 1 ({time.time() - t:.1f} s)")
    bad += d is not None or len(me) != len(m1)
    res.append({"name": f"rand{n}", "prompt_ids": ids, "mlx_lm": m1, "mlx_lm_run2": m2, "memexec": me,
                "identical": same, "first_diff": d})
json.dump({"model": a.model, "tokens": a.tokens, "device": str(mx.default_device()), "prompts": res},
          open(a.out, "w"))
print(f"memexec vs mlx-lm on {a.model}: {len(res) - bad}/{len(res)} prompts identical")
sys.exit(1 if bad else 0)
