#!/usr/bin/env python3
"""Build an e4b-shaped RANDOM Gemma-4 text checkpoint, 4-bit affine g64, in MLX format
(what `mlx_lm.convert -q` writes), directly with mlx-lm's model definition — meant to run
ON the GPU machine, where no real e4b exists and nothing can be downloaded.

Shape (../shared/GEMMA4.md): 42 layers, hidden 2560, MLP 10240, 8 query / 2 KV heads,
head_dim 256 (sliding) / 512 (full), layer_types [sliding x5, full] x7, window 512,
per-layer input 256, vocab 262144 (also per-layer), 18 KV-shared layers, softcap 30,
eos [1, 106]; ~7.5 B parameters, ~4.2 GB at 4 bits.

Weights are drawn tensor by tensor (large ones in row chunks), quantized at once and only
the 4-bit result is kept, so the peak is one chunk of bf16 plus the quantized model. The
init follows reference/fixtures/make_tiny_gemma4.py (the tiny fixtures' generator) so that
greedy outputs are not degenerate: linears and embeddings ~ N(0, 1/sqrt(fan_in)), norm
weights ~ 1 + 0.1 N(0,1) with the post-branch norms x4, layer_scalar ~ U(0.5, 1.5).

The tokenizer is the real Gemma-3 one with the Gemma-4 turn tokens (ids 100/101/105/106
renamed), i.e. the folder .deps/tokenizers/gemma4 of the setup: pass it with --tokenizer.

Usage:
  make_e4b_random.py OUT --tokenizer DIR [--seed 0] [--scale-down] [--layers N] [--shard-gb 2]
                   [--check]
    --scale-down   a small model of the same structure (12 layers, hidden 256, vocab kept)
                   for CPU smoke tests of this script
    --layers N     with --scale-down: N layers (a multiple of 6; KV-shared in e4b's proportion,
                   18 of 42), e.g. 42 for a graph of the e4b's depth: a decode step's nodes
                   and host build time on the CPU, at a small model's compute
    --check        load OUT with mlx_lm.load afterwards and greedy-decode a few prompts
                   (prints distinct-token counts: a degenerate model repeats one token;
                   recorded in OUT/generator.json, not fatal)
Deterministic for a given seed and device (MLX's counter-based random generator).
"""
import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

GROUP, BITS = 64, 4
CHUNK_ELEMS = 1 << 27  # ~128M elements per generated chunk (512 MB in f32)


def text_config(scale_down: bool, layers: int = 12) -> dict:
    if scale_down:
        if layers < 6 or layers % 6:
            raise SystemExit(f"--layers {layers}: a multiple of 6 (5 sliding + 1 full)")
        n_layers, shared = layers, 5 if layers == 12 else round(layers * 18 / 42)
        dims = dict(hidden_size=256, intermediate_size=1024, head_dim=64, global_head_dim=128,
                    hidden_size_per_layer_input=64)
    else:
        n_layers, shared = 42, 18
        dims = dict(hidden_size=2560, intermediate_size=10240, head_dim=256, global_head_dim=512,
                    hidden_size_per_layer_input=256)
    return {
        "model_type": "gemma4_text",
        **dims,
        "num_hidden_layers": n_layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_global_key_value_heads": None,
        "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144,
        "num_kv_shared_layers": shared,
        "sliding_window": 512,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (n_layers // 6),
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "use_double_wide_mlp": False,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "num_experts": None,
        "top_k_experts": None,
        "moe_intermediate_size": None,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
        "attention_bias": False,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": [1, 106],
        "dtype": "bfloat16",
    }


def top_config(tc: dict) -> dict:
    q = {"group_size": GROUP, "bits": BITS, "mode": "affine"}
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": tc,
        # mlx-lm's gemma4.ModelArgs copies the top-level vocab_size into text_config
        "vocab_size": tc["vocab_size"],
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
        "quantization": dict(q),
        "quantization_config": dict(q),
    }


def init_std_or_kind(key: str, shape):
    """The tiny fixtures' init, per parameter name: ('normal', std) | ('norm', mult) | ('scalar',)."""
    leaf_module = key.split(".")[-2] if "." in key else ""
    if key.endswith("layer_scalar"):
        return ("scalar",)
    if "norm" in leaf_module and key.endswith("weight"):
        post = leaf_module in ("post_attention_layernorm", "post_feedforward_layernorm",
                               "post_per_layer_input_norm")
        return ("norm", 4.0 if post else 1.0)
    return ("normal", 1.0 / math.sqrt(shape[-1]))


def draw(kind, shape, key):
    if kind[0] == "scalar":
        return mx.random.uniform(0.5, 1.5, shape, key=key)
    if kind[0] == "norm":
        return kind[1] * (1.0 + 0.1 * mx.random.normal(shape, key=key))
    return mx.random.normal(shape, key=key) * kind[1]


def quantized_paths(model) -> set:
    """Module paths mlx_lm.convert would quantize (utils.quantize_model's predicate)."""
    pred = getattr(model, "quant_predicate", None)
    out = set()
    for path, m in model.named_modules():
        if not hasattr(m, "to_quantized") or not hasattr(m, "weight"):
            continue
        if m.weight.shape[-1] % GROUP != 0:
            continue
        p = pred(path, m) if pred else True
        if p is True:
            out.add(path)
        elif p:  # a dict of other params would need a per-module override: not in this shape
            raise SystemExit(f"{path}: unexpected per-module quantization {p}")
    return out


class ShardWriter:
    def __init__(self, out: Path, shard_bytes: int):
        self.out, self.shard_bytes = out, shard_bytes
        self.cur, self.cur_bytes, self.files, self.weight_map, self.total = {}, 0, [], {}, 0

    def add(self, name, arr):
        mx.eval(arr)
        self.cur[name] = arr
        self.cur_bytes += arr.nbytes
        self.total += arr.nbytes
        if self.cur_bytes >= self.shard_bytes:
            self.flush()

    def flush(self):
        if not self.cur:
            return
        tmp = self.out / f"tmp-{len(self.files):05d}.safetensors"
        mx.save_safetensors(str(tmp), self.cur, metadata={"format": "mlx"})
        self.files.append((tmp, list(self.cur)))
        self.cur, self.cur_bytes = {}, 0
        mx.clear_cache()

    def close(self):
        self.flush()
        n = len(self.files)
        for i, (tmp, names) in enumerate(self.files):
            name = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            tmp.rename(self.out / name)
            for k in names:
                self.weight_map[k] = name
        index = {"metadata": {"total_size": self.total},
                 "weight_map": dict(sorted(self.weight_map.items()))}
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return n


def build(out: Path, tok_dir: Path, seed: int, scale_down: bool, shard_gb: float,
          layers: int = 12):
    from mlx_lm.models import gemma4

    tc = text_config(scale_down, layers)
    cfg = top_config(tc)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # Constructing the module only records lazy initializers: nothing is computed here.
    args_cfg = {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}
    model = gemma4.Model(gemma4.ModelArgs.from_dict(json.loads(json.dumps(args_cfg))))
    qpaths = quantized_paths(model)
    params = tree_flatten(model.parameters())
    writer = ShardWriter(out, int(shard_gb * (1 << 30)))
    n_params = 0
    t0 = time.perf_counter()
    for idx, (k, p) in enumerate(params):
        shape = tuple(p.shape)
        n_params += math.prod(shape)
        kind = init_std_or_kind(k, shape)
        tkey = mx.random.key(seed * 1_000_003 + idx)
        module = k.rsplit(".", 1)[0]
        if module in qpaths and k.endswith(".weight"):
            rows = max(1, min(shape[0], CHUNK_ELEMS // max(1, math.prod(shape[1:]))))
            starts = list(range(0, shape[0], rows))
            ckeys = mx.random.split(tkey, len(starts)) if len(starts) > 1 else [tkey]
            parts_w, parts_s, parts_b = [], [], []
            for r0, ckey in zip(starts, ckeys):
                r = min(rows, shape[0] - r0)
                w = draw(kind, (r,) + shape[1:], ckey).astype(mx.bfloat16)
                wq, s, b = mx.quantize(w, group_size=GROUP, bits=BITS)
                mx.eval(wq, s, b)
                parts_w.append(wq), parts_s.append(s), parts_b.append(b)
                del w
            cat = (lambda xs: xs[0] if len(xs) == 1 else mx.concatenate(xs, axis=0))
            writer.add(module + ".weight", cat(parts_w))
            writer.add(module + ".scales", cat(parts_s))
            writer.add(module + ".biases", cat(parts_b))
        else:
            writer.add(k, draw(kind, shape, tkey).astype(mx.bfloat16))
        if math.prod(shape) > 50_000_000:
            print(f"  {k} {shape} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    n_files = writer.close()
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0, "do_sample": False}, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = tok_dir / f
        if not src.exists():
            raise SystemExit(f"tokenizer folder {tok_dir} lacks {f} (run scripts/setup.sh here first)")
        shutil.copy(src, out / f)
    info = {"params": n_params, "bytes": writer.total, "files": n_files, "seconds": time.perf_counter() - t0,
            "quantized_modules": len(qpaths), "layers": tc["num_hidden_layers"], "hidden": tc["hidden_size"]}
    (out / "generator.json").write_text(json.dumps({"seed": seed, "scale_down": scale_down, **info}, indent=2))
    print(f"[make_e4b_random] {out}: {n_params / 1e9:.3f} B params, {writer.total / 1e9:.2f} GB in {n_files} "
          f"file(s), {info['seconds']:.1f} s on {mx.default_device()}", file=sys.stderr)
    return info


def check(out: Path, n_tokens: int = 32):
    """Greedy-decode a few chat prompts with mlx-lm; a usable random model varies its tokens."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tok = load(str(out))
    texts = ["Extract the people and projects mentioned in this conversation.",
             "Is this message about billing? Answer yes or no.",
             "Summarize in one line: the staging cluster ran out of disk again last night."]
    report = []
    for t in texts:
        # render, then encode without specials: the template already wrote <bos> (and
        # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True))
        text = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                       enable_thinking=False, tokenize=False)
        ids = tok.encode(text, add_special_tokens=False)
        out_ids = []
        t0 = time.perf_counter()
        for y, _ in generate_step(mx.array(ids), model, max_tokens=n_tokens,
                                  sampler=lambda x: mx.argmax(x, axis=-1)):
            out_ids.append(int(y))
        dt = time.perf_counter() - t0
        report.append({"prompt_len": len(ids), "ids": out_ids, "distinct": len(set(out_ids)),
                       "tok_s_incl_prefill": len(out_ids) / dt})
        print(f"[check] prompt {len(ids)} tok -> {len(set(out_ids))} distinct of {len(out_ids)}: "
              f"{out_ids[:16]} ({len(out_ids) / dt:.1f} tok/s incl. prefill)", file=sys.stderr)
    degenerate = all(r["distinct"] <= 2 for r in report)
    if degenerate:
        print("[check] WARNING: every prompt decodes to <= 2 distinct tokens (degenerate)", file=sys.stderr)
    return {"prompts": report, "degenerate": degenerate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json, "
                    "tokenizer_config.json, chat_template.jinja (Gemma-4 turn tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale-down", action="store_true")
    ap.add_argument("--layers", type=int, default=12, help="with --scale-down (see above)")
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--device", choices=["cpu", "gpu"])
    a = ap.parse_args()
    if a.device:
        mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    if a.layers != 12 and not a.scale_down:
        raise SystemExit("--layers goes with --scale-down (the e4b has 42)")
    info = build(a.out, a.tokenizer, a.seed, a.scale_down, a.shard_gb, a.layers)
    if a.check:
        info["check"] = check(a.out)
        (a.out / "generator.json").write_text(json.dumps(
            {"seed": a.seed, "scale_down": a.scale_down, **info}, indent=2))
        # A degenerate model still times correctly; identical-output counts would mean little.
        # Not fatal: a failed device call costs more than the warning in generator.json.


if __name__ == "__main__":
    main()
