#!/usr/bin/env python3
"""Pins a memexec-vs-mlx-lm difference to a forward call, a layer and a tensor.

For each random-id prompt (seeded as e4b_parity.py / logprobs_compare.py): memexec runs
`generate --logprobs-out` with MEMEXEC_TRACE_DIR set (one safetensors file per forward call:
`h.I` the hidden state after layer I, `k.I` / `v.I` the keys / values layer I attended over,
`q.I` its RoPE'd queries, `o.I` its attention output before `o_proj`, `logits`), and mlx-lm
runs the same schedule by hand (prompt[:-1] in one call, then one token per call, greedy) with
its DecoderLayer and attention wrapped to keep the same tensors. Then, call by call
and layer by layer (k, v, q, o, h), the first tensor whose values differ, its max |diff| and how
many elements differ. Runs where the arrays stay: nothing big leaves the machine.

Usage: trace_compare.py MEMEXEC MODEL_DIR OUT.json [--lengths 520,700] [--tokens 4]
       [--max-id N] [--seed S] [--prompts-from PARITY.json [--names a,b]] [--repeat]
       [--recompute CALL.LAYER]
Exit 1 if any traced tensor differs.
"""
import argparse
import json
import os
import sys
import tempfile

import mlx.core as mx
import mlx_lm.models.gemma4_text as g4
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from compare_common import add_args, memexec_logprobs, random_prompts

ap = argparse.ArgumentParser()
add_args(ap, lengths="520,700", tokens=4)
ap.add_argument("--prompts-from", help="use the prompts of an e4b_parity.py result instead")
ap.add_argument("--names", help="with --prompts-from: only these prompts (comma-separated)")
ap.add_argument("--repeat", action="store_true",
                help="run each side twice: is each deterministic tensor for tensor?")
ap.add_argument("--recompute", metavar="CALL.LAYER",
                help="redo that call's attention of that layer from the traced q/k/v in several "
                     "memory layouts and compare with both sides' outputs")
a = ap.parse_args()

current = None  # the dict the wrapped layers record into
orig_layer_call = g4.DecoderLayer.__call__


def traced_layer_call(self, x, mask=None, cache=None, per_layer_input=None, shared_kv=None,
                      offset=None):
    global layer_now
    layer_now = self.layer_idx
    h, kvs, off = orig_layer_call(self, x, mask, cache, per_layer_input=per_layer_input,
                                  shared_kv=shared_kv, offset=offset)
    if current is not None:
        i = self.layer_idx
        current[f"k.{i}"], current[f"v.{i}"], current[f"h.{i}"] = kvs[0], kvs[1], h
    return h, kvs, off


g4.DecoderLayer.__call__ = traced_layer_call
orig_sdpa = g4.scaled_dot_product_attention
layer_now = None  # the index of the layer being run (set by traced_layer_call)


def traced_sdpa(queries, keys, values, cache, scale, mask, **kw):
    out = orig_sdpa(queries, keys, values, cache=cache, scale=scale, mask=mask, **kw)
    if current is not None:
        current[f"q.{layer_now}"], current[f"o.{layer_now}"] = queries, out
    return out


g4.scaled_dot_product_attention = traced_sdpa
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
        return (int(idx) if idx else 1 << 30, "kvqoh".find(kind) if kind in "kvqoh" else 9)
    return sorted(names, key=key)


def prompts():
    if a.prompts_from:
        wanted = a.names.split(",") if a.names else None
        for p in json.load(open(a.prompts_from))["prompts"]:
            if wanted is None or p["name"] in wanted:
                yield p["name"], p["prompt_ids"]
        return
    yield from random_prompts(a)


def memexec_forwards(ids):
    """memexec's tensors of each forward call, or None with a message when it fails:
    `generate --logprobs-out` runs the unpipelined step-by-step decoder first (tokens + 1
    calls, the schedule mlx_forwards uses), then the ordinary pipelined one (its calls
    follow)."""
    with tempfile.TemporaryDirectory() as d:
        if memexec_logprobs(a, ids, d, env={"MEMEXEC_TRACE_DIR": d}) is None:
            return None
        files = sorted(f for f in os.listdir(d) if f.startswith("forward-"))
        calls = []
        for f in files:
            t = {k: v.astype(mx.float32) for k, v in mx.load(os.path.join(d, f)).items()}
            mx.eval(t)
            calls.append(t)
        return calls


def compare(label, ours, theirs):
    """Per call: the tensors of both whose values differ (in layer order)."""
    calls = []
    for c, (x_call, y_call) in enumerate(zip(ours, theirs)):
        diffs = []
        common = set(x_call) & set(y_call)
        for name in order(common):
            x, y = x_call[name], y_call[name]
            if name == "logits":
                x, y = x.reshape(-1), y.reshape(-1)
            if x.shape != y.shape:
                diffs.append({"name": name, "shape": [list(x.shape), list(y.shape)]})
                continue
            count = int(mx.sum(mx.not_equal(x, y)).item())
            if count:
                md = float(mx.max(mx.abs(x - y)).item())
                diffs.append({"name": name, "differing": count, "of": x.size, "max_abs": md})
        calls.append({"call": c, "tensors": len(common), "first_diffs": diffs[:8],
                      "n_diffs": len(diffs)})
        if diffs:
            print(f"{label} call {c}: {len(diffs)} of {len(common)} tensors differ; "
                  f"first {diffs[0]}", flush=True)
    n_diff = sum(1 for c in calls if c["n_diffs"])
    print(f"{label}: {len(ours)} vs {len(theirs)} calls, {n_diff} with a differing tensor",
          flush=True)
    return calls


def recompute_sdpa(label, traced, spec):
    """Layer L's attention of call C redone here from `traced`'s q / k / v (fresh contiguous
    arrays, and k / v as views of larger buffers): does the result depend on the layout?"""
    c, layer = map(int, spec.split("."))
    t = traced[c]
    dt = mx.bfloat16
    q, k, v = (t[f"{n}.{layer}"].astype(dt) for n in "qkv")
    big = lambda x: mx.concatenate([x, mx.zeros_like(x)], axis=2)[:, :, : x.shape[2], :]
    shifted = lambda x: mx.concatenate([mx.zeros_like(x[:, :, :1]), x], axis=2)[:, :, 1:, :]
    layouts = {"fresh": lambda x: x, "view_of_2x": big, "view_offset_1": shifted}
    out = {}
    for name, lay in layouts.items():
        # lazy k / v when the op is built (as in a forward), or already evaluated: MLX picks
        # some kernels by the inputs' buffers, which it can only see once they exist
        out[name] = mx.fast.scaled_dot_product_attention(q, lay(k), lay(v), scale=1.0)
        kk, vv = lay(k), lay(v)
        mx.eval(kk, vv)
        out[name + "_evaluated"] = mx.fast.scaled_dot_product_attention(q, kk, vv, scale=1.0)
    # MLX's composed fallback, op for op (fast.cpp): scale, GQA unflatten, matmul, precise
    # softmax, matmul
    h_kv, rep = k.shape[1], q.shape[1] // k.shape[1]
    qs = (mx.array(1.0, dtype=dt) * q).reshape(q.shape[0], h_kv, rep, q.shape[2], q.shape[3])
    sc = qs @ mx.swapaxes(mx.expand_dims(k, 2), -1, -2)
    sc = mx.softmax(sc, axis=-1, precise=True)
    out["composed"] = (sc @ mx.expand_dims(v, 2)).reshape(q.shape)
    mx.eval(out)
    res = {}
    for name, o in out.items():
        o = o.astype(mx.float32)
        res[name] = {ref: int(mx.sum(mx.not_equal(o, tr[c][f"o.{layer}"])).item())
                     for ref, tr in (("memexec", MEM[0]), ("mlx_lm", MLX[0]))}
    print(f"recompute o.{layer} of call {c} from {label}'s q/k/v: differing elements {res}",
          flush=True)
    return res


res, bad = [], 0
for pname, ids in prompts():
    MLX = [mlx_forwards(ids) for _ in range(2 if a.repeat else 1)]
    MEM = [memexec_forwards(ids) for _ in range(2 if a.repeat else 1)]
    if any(m is None for m in MEM):
        bad += 1
        continue
    entry = {"name": pname, "memexec_calls": len(MEM[0]), "mlx_lm_calls": len(MLX[0]),
             "calls": compare(f"{pname} memexec vs mlx-lm", MEM[0], MLX[0])}
    n = a.tokens + 1
    entry["pipelined"] = compare(f"{pname} memexec pipelined vs step-by-step", MEM[0][n:],
                                 MEM[0][:n])
    if a.repeat:
        entry["memexec_run2"] = compare(f"{pname} memexec run 2 vs 1", MEM[1], MEM[0])
        entry["mlx_lm_run2"] = compare(f"{pname} mlx-lm run 2 vs 1", MLX[1], MLX[0])
    if a.recompute:
        entry["recompute"] = {lbl: recompute_sdpa(lbl, tr[0], a.recompute)
                              for lbl, tr in (("memexec", MEM), ("mlx_lm", MLX))}
    bad += any(c["n_diffs"] for c in entry["calls"] + entry["pipelined"])
    res.append(entry)
json.dump({"model": a.model, "device": str(mx.default_device()), "prompts": res},
          open(a.out, "w"), indent=1)
sys.exit(1 if bad else 0)
