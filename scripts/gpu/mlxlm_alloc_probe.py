#!/usr/bin/env python3
"""Is mlx-lm's own greedy output on this device a function of the prompt only, or also of the
process's allocation history? Re-runs mlx-lm `generate_step` (greedy) on the prompts of an
e4b_parity.py result after first allocating (and keeping) `--pad-bytes` of device memory, and
says, per prompt, whether the ids equal that file's mlx-lm ids and its memexec ids.

Run it several times (separate processes) with different --pad-bytes: if mlx-lm disagrees
with itself across pads, a memexec-vs-mlx-lm difference on those prompts says nothing about
memexec (the kernels it reaches are not reproducible between processes).

Usage: mlxlm_alloc_probe.py MODEL PARITY.json [--pad-bytes N] [--out FILE]
"""
import argparse
import json

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("parity")
ap.add_argument("--pad-bytes", type=int, default=0)
ap.add_argument("--out")
a = ap.parse_args()

pad = None
if a.pad_bytes:
    pad = mx.zeros((a.pad_bytes,), dtype=mx.uint8)
    mx.eval(pad)
model, _ = load(a.model)
ref = json.load(open(a.parity))
rows = []
for p in ref["prompts"]:
    n = len(p["mlx_lm"])
    ids = [int(t) for t, _ in generate_step(mx.array(p["prompt_ids"]), model, max_tokens=n)]
    row = {"name": p["name"], "pad_bytes": a.pad_bytes, "ids": ids,
           "equals_file_mlx_lm": ids == p["mlx_lm"], "equals_file_memexec": ids == p["memexec"]}
    rows.append(row)
    print(f"pad {a.pad_bytes}: {p['name']}: == file mlx-lm {row['equals_file_mlx_lm']}, "
          f"== file memexec {row['equals_file_memexec']}", flush=True)
if a.out:
    json.dump(rows, open(a.out, "w"))
