"""Speed and exactness of `memexec generate --speculate` next to plain `memexec generate`.

Runs THERE through scripts/gpu/remote.sh (or here on a fixture). Per round: plain greedy on the
prompt (the reference ids and the serial tok/s), then --speculate with prompt-lookup drafts,
then --speculate K --drafts-from <the reference ids> for each K (every draft right: the
ceiling of the mechanism's speed), and with `--wrong N[,N]` also drafts from the reference ids
with every Nth one replaced (partly right drafts: how speculation fares when a step's later
drafts miss). `--arms` repeats the speculative configs under extra environment settings or
`memexec generate` flags (e.g. `rows1:MEMEXEC_ROWS_PER_PRODUCT=1`, `fixed:--fixed-drafts`,
`decoder:--decoder`: the batched decoder's lone row); `--plain-arms` also runs each extra arm
without drafts (`serial@ARM`).
Every run's ids must equal the reference's; exit 1 if not.
Every timed run first generates once untimed in the same process (`--warmup 1`): the first use
of each step shape compiles kernels and captures CUDA graphs, and each run is a fresh process.

usage: speculate.py MEMEXEC MODEL_DIR [--len 400] [--tokens 128] [--ks 1,2,4,6] [--rounds 2]
       [--no-lookup] [--wrong N[,N]] [--arms NAME:VAR=VAL[;--flag],...] [--plain-arms]
       [--out FILE]
"""
import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time


def run(memexec, model, prompt, tokens, extra, env=None):
    cmd = [memexec, "generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(tokens), "--ignore-eos", "--json", "--warmup", "1"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}).stdout
    return json.loads(out)


def parse_arms(text):
    """`name:VAR=VAL;--flag,name2:...` -> [(name, {VAR: VAL}, [--flag])], the default arm first:
    a setting that starts with `--` is a `memexec generate` flag, the others environment."""
    arms = [("default", {}, [])]
    for item in filter(None, (text or "").split(",")):
        name, _, settings = item.partition(":")
        parts = [kv for kv in settings.split(";") if kv]
        env = dict(kv.split("=", 1) for kv in parts if not kv.startswith("--"))
        arms.append((name, env, [kv for kv in parts if kv.startswith("--")]))
    return arms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("memexec")
    ap.add_argument("model")
    ap.add_argument("--len", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--ks", default="1,2,4,6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=200000)
    ap.add_argument("--no-lookup", action="store_true", help="skip the prompt-lookup config")
    ap.add_argument("--wrong", default="",
                    help="also draft from the reference with every Nth id replaced (N[,N...])")
    ap.add_argument("--arms", default="", help="extra environments for the speculative configs")
    ap.add_argument("--plain-arms", action="store_true",
                    help="also run each extra arm without drafts (e.g. decoder:--decoder)")
    ap.add_argument("--out")
    a = ap.parse_args()
    r = random.Random(0)
    prompt = [r.randrange(3, a.vocab) for _ in range(a.len)]
    ks = [int(k) for k in a.ks.split(",") if k]
    ref = run(a.memexec, a.model, prompt, a.tokens, [])
    ids = ref["ids"]
    given = ["--drafts-from", ",".join(map(str, ids))]
    spec = [] if a.no_lookup else [("lookup4", ["--speculate", "4"])]
    spec += [(f"given{k}", ["--speculate", str(k)] + given) for k in ks]
    for n in [int(v) for v in a.wrong.split(",") if v]:
        # Position i drafts output token i: every Nth draft is a token the model did not pick.
        wrong = [t if (i + 1) % n else (t + 1) % a.vocab for i, t in enumerate(ids)]
        spec += [(f"given{k}-wrong{n}",
                  ["--speculate", str(k), "--drafts-from", ",".join(map(str, wrong))])
                 for k in ks]
    arms = parse_arms(a.arms)
    # With --plain-arms each extra arm also runs without drafts ("serial@ARM").
    plain = [(f"serial@{arm}", flags, env) for arm, env, flags in arms
             if arm != "default" and a.plain_arms]
    configs = [("serial", [], {})] + plain + [
        (name if arm == "default" else f"{name}@{arm}", extra + flags, env)
        for arm, env, flags in arms for name, extra in spec]
    rows, ok = [], True
    for rnd in range(1, a.rounds + 1):
        for name, extra, env in configs:
            t = time.time()
            d = run(a.memexec, a.model, prompt, a.tokens, extra, env)
            same = d["ids"] == ids
            ok &= same
            p = d["decode_profile_ms_per_step"]
            s = d.get("speculation") or {}
            row = {"round": rnd, "config": name, "tok_s": round(d["decode_tokens_per_s"], 1),
                   "steps": p["steps"], "build_ms": round(p["build"], 2),
                   "queue_ms": round(p["queue"], 2), "wait_ms": round(p["wait"], 2),
                   "drafted": s.get("drafted"), "accepted": s.get("accepted"),
                   "paused_steps": s.get("paused_steps"), "same_ids": same,
                   "ids_hash": hashlib.sha1(str(d["ids"]).encode()).hexdigest()[:10],
                   "process_s": round(time.time() - t, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prompt_len": a.len, "tokens": a.tokens, "runs": rows}, f, indent=1)
    print("all ids equal to plain greedy" if ok else "IDS DIFFER", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
