#!/usr/bin/env python3
"""mlx-lm side of the memexec benchmark (BENCH.md): run mlx-lm on the SAME prompt ids that
`memexec bench` uses, serial `generate_step` and batched `batch_generate`, and write JSON that
memexec merges into its table (ratios, identical-output counts vs memexec serial).

Usage:
  mlx_lm_bench.py --model DIR --workloads W.json --out R.json
                  [--widths 1,2,4,8,16] [--reps 3] [--modes serial,batch] [--device cpu|gpu]
  mlx_lm_bench.py --model DIR --synthetic W.json [--seed 0]   # write BENCH-shaped random ids
  mlx_lm_bench.py --table R.json                               # print the table of a result

Input (W.json): either a list of workloads or {"workloads": [...]}; each workload is
  {"name": str, "max_tokens": int, "prompts": [[int, ...], ...]}
(prompt ids exactly as fed to the model: already rendered, special tokens included).

Method (the same for every configuration):
- greedy: the sampler is argmax over the log-probabilities (lowest id on exact ties);
- stop: a row ends at max_tokens or at the first id in the model's eos ids (the tokenizer
  wrapper's `eos_token_ids`, i.e. config.json/generation_config.json `eos_token_id` plus the
  tokenizer's eos); the eos id itself is NOT part of the output ids (as batch_generate does);
- serial: for each prompt in order, `generate_step(prompt)` (prefill prompt[:-1], then step
  the last token); the workload's time is the sum over its prompts;
- batch width W: one `batch_generate(prompts, completion_batch_size=W, prefill_batch_size=W)`
  over all the workload's prompts (mlx-lm's continuous batching: at most W rows at a time);
  a width >= the number of prompts is measured once and copied to the larger widths;
- every configuration runs once untimed first (MLX compiles/JITs kernels per shape; with
  --warmup-tokens N that run stops after N tokens, which still meets the prefill and batch-width shapes), then
  the timed repetitions are interleaved (rep 1 of every config, rep 2 of every config, ...);
  reported numbers are medians over the repetitions; output ids come from the last rep and
  `stable` says whether every rep (and a full warm-up) produced the same ids;
- peak memory: mx.reset_peak_memory() before a run, mx.get_peak_memory() after (bytes, the
  whole process incl. weights); mx.clear_cache() before every run.

Output (R.json), schema 1:
{
  "schema": 1, "tool": "mlx_lm_bench",
  "mlx": "0.32.2", "mlx_lm": "0.32.2", "device": "Device(gpu, 0)", "model": DIR,
  "model_type": str, "eos_ids": [int], "reps": int, "warmup_tokens": int | null,
  "widths": [int], "date": ISO-8601 UTC,
  "host": {"platform": str, "cpus": int},
  "load_s": float,                # model load time
  "workloads": [{
    "name": str, "max_tokens": int, "n_prompts": int, "prompt_lens": [int],
    "runs": [{
      "engine": "mlx-lm",
      "mode": "serial" | "batch",   # generate_step | batch_generate
      "width": int,                 # requested width (1 for serial)
      "effective_width": int,       # min(width, n_prompts)
      "copied_from_width": int?,    # present when this entry copies a measured width
      "e2e_ms": float,              # median wall time of the whole workload
      "e2e_ms_all": [float],        # every timed rep
      "prefill_ms": float,          # median time spent in prompt processing
      "decode_ms": float,           # median time spent decoding
      "prompt_tokens": int,         # tokens prefilled (sum of prompt lengths)
      "generated_tokens": int,      # tokens generated (sum over rows, eos excluded)
      "prefill_tok_s": float,       # prompt_tokens / prefill time (median over reps)
      "decode_tok_s": float,        # generated tokens / decode time (median over reps)
      "tok_s": float,               # generated_tokens / e2e
      "peak_memory_bytes": int,     # max over reps
      "ids": [[int]],               # generated ids per prompt, in input order
      "finish": ["stop" | "length"],
      "stable": bool,
      "identical_to_serial": int?   # batch only: rows whose ids equal mlx-lm serial's
    }]
  }]
}
Timing definitions. Serial: prefill time = from the call to the first generated token being
available (prefill of prompt[:-1] plus the first step), decode time = the rest; decode tok/s
counts the tokens after the first. Batch: mlx-lm's own BatchStats (prompt_time covers the
prefill of prompt[:-1]; decode time = wall - prompt_time; every generated token counts).
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx


def argmax_sampler(logprobs):
    return mx.argmax(logprobs, axis=-1)


def load_workloads(path):
    data = json.loads(Path(path).read_text())
    wls = data["workloads"] if isinstance(data, dict) else data
    for w in wls:
        for k in ("name", "max_tokens", "prompts"):
            if k not in w:
                raise SystemExit(f"{path}: workload without '{k}'")
        if not w["prompts"] or any(len(p) == 0 for p in w["prompts"]):
            raise SystemExit(f"{path}: workload {w['name']} has an empty prompt list or prompt")
    return wls


def synthetic_workloads(vocab, seed, low=None, high=None, small=False):
    """BENCH.md-shaped workloads of random ids (timing only: not realistic text).
    `small` shrinks them (a quarter of the lengths, half the prompts) for smoke tests."""
    rng = random.Random(seed)
    low = low if low is not None else min(1000, vocab // 8)
    high = high if high is not None else vocab - 1

    def prompt(n):
        return [2] + [rng.randrange(low, high) for _ in range(n - 1)]

    f, k = (4, 2) if small else (1, 1)
    return [
        {"name": "EXTRACT", "max_tokens": 96 // f,
         "prompts": [prompt(rng.randint(330, 470) // f) for _ in range(8 // k)]},
        {"name": "SHORT", "max_tokens": 24 // f, "prompts": [prompt(rng.randint(30, 90) // f) for _ in range(8 // k)]},
        {"name": "UNIFORM", "max_tokens": 64 // f,
         "prompts": [prompt(rng.randint(18, 24) // f + 2) for _ in range(16 // k)]},
    ]


class Runner:
    def __init__(self, model, tokenizer, eos_ids):
        self.model = model
        self.tokenizer = tokenizer
        self.eos = set(eos_ids)

    def serial(self, prompts, max_tokens):
        from mlx_lm.generate import generate_step

        ids, finish = [], []
        prefill_s = decode_s = 0.0
        decoded_after_first = 0
        t_all = time.perf_counter()
        for p in prompts:
            out = []
            reason = "length"
            t0 = time.perf_counter()
            t_first = None
            for tok, _ in generate_step(mx.array(p), self.model, max_tokens=max_tokens, sampler=argmax_sampler):
                if t_first is None:
                    t_first = time.perf_counter()
                if tok in self.eos:
                    reason = "stop"
                    break
                out.append(int(tok))
            t1 = time.perf_counter()
            t_first = t_first if t_first is not None else t1
            prefill_s += t_first - t0
            decode_s += t1 - t_first
            # tokens produced after the first one (the eos step counts: it was computed)
            decoded_after_first += len(out) - 1 + (1 if reason == "stop" else 0)
            ids.append(out)
            finish.append(reason)
        wall = time.perf_counter() - t_all
        return {
            "ids": ids, "finish": finish, "wall_s": wall, "prefill_s": prefill_s, "decode_s": decode_s,
            "prompt_tokens": sum(len(p) for p in prompts),
            "decode_tokens": max(decoded_after_first, 0),
        }

    def batch(self, prompts, max_tokens, width):
        from mlx_lm.generate import batch_generate

        t0 = time.perf_counter()
        r = batch_generate(
            self.model, self.tokenizer, prompts, max_tokens=max_tokens, return_token_ids=True,
            completion_batch_size=width, prefill_batch_size=width, sampler=argmax_sampler,
        )
        wall = time.perf_counter() - t0
        ids = [list(map(int, t)) for t in r.token_ids]
        # batch_generate drops the stop token, keeps a max_tokens one: a short row stopped.
        finish = ["length" if len(t) >= max_tokens else "stop" for t in ids]
        s = r.stats
        return {
            "ids": ids, "finish": finish, "wall_s": wall, "prefill_s": s.prompt_time,
            "decode_s": s.generation_time, "prompt_tokens": sum(len(p) for p in prompts),
            "prefill_tokens_counted": s.prompt_tokens, "decode_tokens": s.generation_tokens,
        }

    def run(self, cfg, wl):
        mx.synchronize()
        mx.clear_cache()
        mx.reset_peak_memory()
        if cfg["mode"] == "serial":
            r = self.serial(wl["prompts"], wl["max_tokens"])
        else:
            r = self.batch(wl["prompts"], wl["max_tokens"], cfg["width"])
        mx.synchronize()
        r["peak"] = int(mx.get_peak_memory())
        return r


def median(xs):
    return float(statistics.median(xs)) if xs else 0.0


def summarize(cfg, wl, reps, warm):
    n = len(wl["prompts"])
    last = reps[-1]
    pre_tokens = last.get("prefill_tokens_counted", last["prompt_tokens"])
    entry = {
        "engine": "mlx-lm",
        "mode": cfg["mode"],
        "width": cfg["width"],
        "effective_width": min(cfg["width"], n),
        "e2e_ms": median([r["wall_s"] * 1e3 for r in reps]),
        "e2e_ms_all": [round(r["wall_s"] * 1e3, 3) for r in reps],
        "prefill_ms": median([r["prefill_s"] * 1e3 for r in reps]),
        "decode_ms": median([r["decode_s"] * 1e3 for r in reps]),
        "prompt_tokens": last["prompt_tokens"],
        "generated_tokens": sum(len(t) for t in last["ids"]),
        "prefill_tok_s": median([pre_tokens / r["prefill_s"] for r in reps if r["prefill_s"] > 0]),
        "decode_tok_s": median([r["decode_tokens"] / r["decode_s"] for r in reps if r["decode_s"] > 0]),
        "peak_memory_bytes": max(r["peak"] for r in reps),
        "ids": last["ids"],
        "finish": last["finish"],
        "stable": all(r["ids"] == last["ids"] for r in reps + ([warm] if warm else [])),
    }
    entry["tok_s"] = entry["generated_tokens"] / (entry["e2e_ms"] / 1e3) if entry["e2e_ms"] > 0 else 0.0
    return entry


def bench(args):
    from mlx_lm import load
    import mlx_lm

    if args.device:
        mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    wls = load_workloads(args.workloads)
    if args.only:
        keep = set(args.only.split(","))
        wls = [w for w in wls if w["name"] in keep]
        if not wls:
            raise SystemExit(f"--only {args.only}: no such workload in {args.workloads}")
    t0 = time.perf_counter()
    model, tokenizer = load(args.model)
    load_s = time.perf_counter() - t0
    eos_ids = sorted(int(e) for e in (args.eos if args.eos else tokenizer.eos_token_ids))
    tokenizer.eos_token_ids = eos_ids
    runner = Runner(model, tokenizer, eos_ids)
    modes = args.modes.split(",")
    widths = [int(w) for w in args.widths.split(",")] if args.widths else []

    # Configurations per workload; widths beyond the prompt count are measured once.
    plan = []  # (workload index, cfg)
    copies = []  # (workload index, width, measured width)
    for wi, wl in enumerate(wls):
        n = len(wl["prompts"])
        if "serial" in modes:
            plan.append((wi, {"mode": "serial", "width": 1}))
        if "batch" in modes:
            measured_full = None
            for w in widths:
                if w >= n and measured_full is not None:
                    copies.append((wi, w, measured_full))
                    continue
                if w >= n:
                    measured_full = w
                plan.append((wi, {"mode": "batch", "width": w}))

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    warm = {}
    for k, (wi, cfg) in enumerate(plan):
        t = time.perf_counter()
        wl = wls[wi]
        if args.warmup_tokens:
            wl = dict(wl, max_tokens=min(wl["max_tokens"], args.warmup_tokens))
        warm[k] = runner.run(cfg, wl)
        log(f"[warm-up] {wls[wi]['name']} {cfg['mode']} w={cfg['width']}: {time.perf_counter() - t:.2f} s")
    reps = {k: [] for k in range(len(plan))}
    for rep in range(args.reps):
        for k, (wi, cfg) in enumerate(plan):
            r = runner.run(cfg, wls[wi])
            reps[k].append(r)
            log(f"[rep {rep + 1}/{args.reps}] {wls[wi]['name']} {cfg['mode']} w={cfg['width']}: "
                f"{r['wall_s'] * 1e3:.1f} ms")

    out_wls = []
    for wi, wl in enumerate(wls):
        runs = [summarize(cfg, wl, reps[k], None if args.warmup_tokens else warm[k])
                for k, (wj, cfg) in enumerate(plan) if wj == wi]
        for wj, w, src in copies:
            if wj == wi:
                base = next(r for r in runs if r["mode"] == "batch" and r["width"] == src)
                runs.append(dict(base, width=w, copied_from_width=src))
        serial = next((r for r in runs if r["mode"] == "serial"), None)
        if serial is not None:
            for r in runs:
                if r["mode"] == "batch":
                    r["identical_to_serial"] = sum(a == b for a, b in zip(r["ids"], serial["ids"]))
        out_wls.append({
            "name": wl["name"], "max_tokens": wl["max_tokens"], "n_prompts": len(wl["prompts"]),
            "prompt_lens": [len(p) for p in wl["prompts"]], "runs": runs,
        })

    cfg_json = json.loads((Path(args.model) / "config.json").read_text())
    result = {
        "schema": 1,
        "tool": "mlx_lm_bench",
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "model": str(args.model),
        "model_type": cfg_json.get("model_type"),
        "eos_ids": eos_ids,
        "reps": args.reps,
        "warmup_tokens": args.warmup_tokens or None,
        "widths": widths,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "load_s": load_s,
        "workloads": out_wls,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)


def print_table(result):
    print(f"mlx-lm {result['mlx_lm']} (mlx {result['mlx']}) on {result['device']}, "
          f"model {result['model']} ({result['model_type']}), median of {result['reps']}")
    hdr = (f"{'workload':<9} {'engine/mode':<14} {'w':>3} {'e2e ms':>10} {'tok/s':>8} {'prefill t/s':>11} "
           f"{'decode t/s':>10} {'vs serial':>9} {'=serial':>8} {'peak MB':>8} {'stable':>6}")
    print(hdr)
    print("-" * len(hdr))
    for wl in result["workloads"]:
        serial = next((r for r in wl["runs"] if r["mode"] == "serial"), None)
        for r in wl["runs"]:
            ratio = f"{serial['e2e_ms'] / r['e2e_ms']:.2f}x" if serial and r["e2e_ms"] > 0 else "-"
            same = (f"{r['identical_to_serial']}/{wl['n_prompts']}" if "identical_to_serial" in r else "-")
            mode = ("generate_step" if r["mode"] == "serial" else "batch_generate")
            w = f"{r['width']}" + ("*" if "copied_from_width" in r else "")
            print(f"{wl['name']:<9} {mode:<14} {w:>3} {r['e2e_ms']:>10.1f} {r['tok_s']:>8.1f} "
                  f"{r['prefill_tok_s']:>11.1f} {r['decode_tok_s']:>10.1f} {ratio:>9} {same:>8} "
                  f"{r['peak_memory_bytes'] / 1e6:>8.0f} {str(r['stable']):>6}")
    print("(* = width >= prompts: copy of the measured width; '=serial': rows identical to mlx-lm serial)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--workloads", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--modes", default="serial,batch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup-tokens", type=int, default=0,
                    help="cap max_tokens of the untimed warm-up runs (0: the full workload)")
    ap.add_argument("--device", choices=["cpu", "gpu"], help="default: MLX's default device")
    ap.add_argument("--eos", type=lambda s: [int(x) for x in s.split(",")], help="override eos ids")
    ap.add_argument("--synthetic", type=Path, help="write BENCH-shaped random-id workloads here and exit")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small", action="store_true", help="with --synthetic: smaller workloads (smoke tests)")
    ap.add_argument("--only", help="comma-separated workload names to run")
    ap.add_argument("--table", type=Path, help="print the table of an existing result and exit")
    a = ap.parse_args()
    if a.table:
        print_table(json.loads(a.table.read_text()))
        return
    if a.synthetic:
        if not a.model:
            ap.error("--synthetic needs --model (for the vocabulary size)")
        cfg = json.loads((a.model / "config.json").read_text())
        vocab = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
        a.synthetic.write_text(json.dumps({"workloads": synthetic_workloads(int(vocab), a.seed, small=a.small)}))
        print(f"wrote {a.synthetic} (vocab {vocab})", file=sys.stderr)
        return
    if not (a.model and a.workloads and a.out):
        ap.error("--model, --workloads and --out are required")
    bench(a)


if __name__ == "__main__":
    main()
