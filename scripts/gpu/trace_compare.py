#!/usr/bin/env python3
"""Pins a memexec-vs-mlx-lm difference to a forward call, a layer and a tensor.

For each random-id prompt (seeded as e4b_parity.py / logprobs_compare.py): memexec runs
`generate --logprobs-out` with MEMEXEC_TRACE_DIR set (one safetensors file per forward call:
`h.I` the hidden state after layer I, `k.I` / `v.I` the keys / values layer I attended over,
`logits`), and mlx-lm runs the same schedule by hand (prompt[:-1] in one call, then one token
per call, greedy) with its DecoderLayer wrapped to keep the same tensors. Then, call by call
and layer by layer (k, v, h), the first tensor whose values differ, its max |diff| and how
many elements differ. Runs where the arrays stay: nothing big leaves the machine.

Usage: trace_compare.py MEMEXEC MODEL_DIR OUT.json [--lengths 520,700] [--tokens 4]
       [--max-id N] [--seed S]
Exit 1 if any traced tensor differs.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import mlx.core as mx
import mlx_lm.models.gemma4_text as g4
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

ap = argparse.ArgumentParser()
ap.add_argument("memexec")
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--lengths", default="520,700")
ap.add_argument("--tokens", type=int, default=4)
ap.add_argument("--max-id", type=int, default=200000)
ap.add_argument("--seed", type=int, default=20261130)
a = ap.parse_args()

current = None  # the dict the wrapped layers record into
orig_layer_call = g4.DecoderLayer.__call__


def traced_layer_call(self, x, mask=None, cache=None, per_layer_input=None, shared_kv=None,
                      offset=None):
    h, kvs, off = orig_layer_call(self, x, mask, cache, per_layer_input=per_layer_input,
                                  shared_kv=shared_kv, offset=offset)
    if current is not None:
        i = self.layer_idx
        current[f"k.{i}"], current[f"v.{i}"], current[f"h.{i}"] = kvs[0], kvs[1], h
    return h, kvs, off


g4.DecoderLayer.__call__ = traced_layer_call
model, _ = load(a.model)


def mlx_forwards(ids):
    """mlx-lm's tensors of each forward call (generate_step's schedule, greedy)."""
    global current
    cache = make_prompt_cache(model)
    calls, token = [], None
    for step in range(a.tokens + 1):
        current = {}
        inp = mx.array(ids[:-1])[None] if step == 0 else mx.array([[token]])
        logits = model(inp, cache=cache)[:, -1, :]
        current["logits"] = logits
        mx.eval(current)
        # Copies: mlx-lm's cache assigns into its key / value arrays in place
        # (`self.keys[...] = k` rewrites the same Python object), so a kept reference would show
        # later calls' writes. f32 holds bf16 / f16 values exactly.
        calls.append({k: v.astype(mx.float32) for k, v in current.items()})
        mx.eval(calls[-1])
        if step == 0:
            token = ids[-1]
        else:
            lp = logits - mx.logsumexp(logits, keepdims=True)
            token = int(mx.argmax(lp, axis=-1).item())
    current = None
    return calls


def order(names):
    def key(n):
        kind, _, idx = n.partition(".")
        return (int(idx) if idx else 1 << 30, "kvh".find(kind) if kind in "kvh" else 9)
    return sorted(names, key=key)


res, bad = [], 0
rng = random.Random(a.seed)
for n in map(int, a.lengths.split(",")):
    ids = [2] + [rng.randrange(3, a.max_id) for _ in range(n - 1)]
    theirs = mlx_forwards(ids)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, MEMEXEC_TRACE_DIR=d)
        p = subprocess.run([a.memexec, "generate", "--model", a.model, "--prompt-ids",
                            ",".join(map(str, ids)), "--max-tokens", str(a.tokens),
                            "--ignore-eos", "--json", "--logprobs-out", os.path.join(d, "lp.json")],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"rand{n}: memexec failed: {p.stderr.strip()[-300:]}")
            bad += 1
            continue
        files = sorted(f for f in os.listdir(d) if f.startswith("forward-"))
        calls = []
        for c, f in enumerate(files):
            ours = mx.load(os.path.join(d, f))
            if c >= len(theirs):
                break
            diffs = []
            for name in order(set(ours) & set(theirs[c])):
                x, y = ours[name].astype(mx.float32), theirs[c][name]
                if name == "logits":
                    x, y = x.reshape(-1), y.reshape(-1)
                if x.shape != y.shape:
                    diffs.append({"name": name, "shape": [list(x.shape), list(y.shape)]})
                    continue
                ne = mx.not_equal(x, y)
                count = int(mx.sum(ne).item())
                if count:
                    md = float(mx.max(mx.abs(x - y)).item())
                    diffs.append({"name": name, "differing": count, "of": x.size, "max_abs": md})
            calls.append({"call": c, "tensors": len(set(ours) & set(theirs[c])),
                          "only_memexec": sorted(set(ours) - set(theirs[c]))[:5],
                          "first_diffs": diffs[:8], "n_diffs": len(diffs)})
            first = diffs[0] if diffs else None
            print(f"rand{n} call {c}: {len(diffs)} of {calls[-1]['tensors']} tensors differ"
                  + (f"; first {first}" if first else ""), flush=True)
        bad += any(c["n_diffs"] for c in calls) or len(files) != len(theirs)
        res.append({"name": f"rand{n}", "memexec_calls": len(files), "mlx_lm_calls": len(theirs),
                    "calls": calls})
json.dump({"model": a.model, "device": str(mx.default_device()), "prompts": res},
          open(a.out, "w"), indent=1)
sys.exit(1 if bad else 0)
