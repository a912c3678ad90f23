#!/usr/bin/env python3
"""Localizes a memexec-vs-mlx-lm difference on long prompts: re-runs mlx-lm greedy on the
prompts of an e4b_parity.py result with one mlx-lm detail changed at a time to what memexec
does, and says whether the ids then equal the file's mlx-lm ids and its memexec ids.

Variants:
  default     mlx-lm as is
  host_mask   causal/window masks built on the host (numpy) and uploaded, as memexec does,
              instead of computed on the device with arange/compare ops
  int_offset  RoPE offsets passed as Python ints instead of mx.array(cache.offset)

Usage: mlxlm_mask_probe.py MODEL PARITY.json [--variants default,host_mask,int_offset]
"""
import argparse
import json

import numpy as np
import mlx.core as mx
import mlx_lm.models.base as base
import mlx_lm.models.cache as cache_mod
from mlx_lm import load
from mlx_lm.generate import generate_step

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("parity")
ap.add_argument("--variants", default="default,host_mask,int_offset")
ap.add_argument("--out")
a = ap.parse_args()

orig_mask = cache_mod.create_causal_mask
orig_array = mx.array


def host_causal_mask(N, offset=0, window_size=None, right_padding=None, left_padding=None):
    if right_padding is not None or left_padding is not None:
        return orig_mask(N, offset, window_size, right_padding, left_padding)
    l = np.arange(offset, offset + N)[:, None]
    r = np.arange(offset + N)[None]
    m = l >= r
    if window_size is not None:
        m &= l < r + window_size
    return mx.array(m)


model, _ = load(a.model)
ref = json.load(open(a.parity))
rows = []
for variant in a.variants.split(","):
    cache_mod.create_causal_mask = host_causal_mask if variant == "host_mask" else orig_mask
    base.create_causal_mask = cache_mod.create_causal_mask
    attn_mod = __import__("mlx_lm.models.gemma4_text", fromlist=["mx"])
    if variant == "int_offset":
        class _MX:  # mx with array(int) left as int, for `offset = mx.array(cache.offset)`
            def __getattr__(self, k):
                return getattr(mx, k)

            @staticmethod
            def array(x, *args, **kw):
                return x if isinstance(x, int) and not args and not kw else orig_array(x, *args, **kw)
        attn_mod.mx = _MX()
    else:
        attn_mod.mx = mx
    for p in ref["prompts"]:
        n = len(p["mlx_lm"])
        ids = [int(t) for t, _ in generate_step(mx.array(p["prompt_ids"]), model, max_tokens=n)]
        row = {"variant": variant, "name": p["name"], "ids": ids,
               "equals_file_mlx_lm": ids == p["mlx_lm"], "equals_file_memexec": ids == p["memexec"]}
        rows.append(row)
        print(f"{variant}: {p['name']}: == mlx-lm {row['equals_file_mlx_lm']}, "
              f"== memexec {row['equals_file_memexec']}", flush=True)
if a.out:
    json.dump(rows, open(a.out, "w"))
