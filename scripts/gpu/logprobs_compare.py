#!/usr/bin/env python3
"""Step-by-step numbers of memexec vs mlx-lm greedy decoding: for each random-id prompt, the
first step whose log-probabilities differ (f64 sum over the vocabulary, |diff| > 1e-6: any
changed value moves it by far more than summation order does) and the first differing id.
Localizes a divergence: a difference at step 0 means the prompt's prefill already differs.

Usage: logprobs_compare.py MEMEXEC MODEL_DIR OUT.json [--lengths 700,1000] [--tokens 24]
       [--max-id N] [--seed S]
Prompts: [2] + random ids in [3, max-id) (seeded as e4b_parity.py, whose default seed and
max-id give the same prompts for the same --lengths). Exit 1 if any step differs.
"""
import argparse
import json
import math
import sys
import tempfile

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from compare_common import add_args, memexec_logprobs, random_prompts

ap = argparse.ArgumentParser()
add_args(ap, lengths="700,1000", tokens=24)
a = ap.parse_args()

model, _ = load(a.model)


def mlx_steps(ids):
    steps = []
    for tok, logprobs in generate_step(mx.array(ids), model, max_tokens=a.tokens):
        v = logprobs.astype(mx.float32).tolist()
        steps.append({"id": int(tok), "sum": math.fsum(v),
                      "top": sorted(range(len(v)), key=lambda i: (-v[i], i))[:8]})
    return steps


res, bad = [], 0
for name, ids in random_prompts(a):
    theirs = mlx_steps(ids)
    with tempfile.TemporaryDirectory() as d:
        path = memexec_logprobs(a, ids, d)
        if path is None:
            print(f"{name}: see the memexec failure above")
            bad += 1
            continue
        ours = json.load(open(path))["steps"]
    first_num = next((i for i, (x, y) in enumerate(zip(ours, theirs))
                      if abs(x["sum"] - y["sum"]) > 1e-6), None)
    first_id = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x["id"] != y["id"]), None)
    print(f"{name}: first step with different log-probs: {first_num}; first different id: "
          f"{first_id} (of {len(theirs)} steps)", flush=True)
    bad += first_num is not None or first_id is not None
    res.append({"name": name, "prompt_ids": ids, "first_logprobs_diff": first_num,
                "first_id_diff": first_id,
                "steps": [{"memexec": x, "mlx_lm": {"id": y["id"], "sum": y["sum"], "top": y["top"]}}
                          for x, y in zip(ours, theirs)]})
json.dump({"model": a.model, "device": str(mx.default_device()), "prompts": res}, open(a.out, "w"))
sys.exit(1 if bad else 0)
