"""memexec's greedy ids vs an mlx-lm oracle file, prompt by prompt (run where both ran).

usage: memexec_parity.py MEMEXEC MODEL_DIR ORACLE.json [--tokens N]
Runs `MEMEXEC generate --ignore-eos` on each oracle prompt (raw greedy ids, as the oracle
records them) and prints, per prompt, how many of the first N ids agree and where they first
differ. Exit code 1 if any prompt differs.
"""
import argparse, json, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("memexec"); ap.add_argument("model"); ap.add_argument("oracle")
ap.add_argument("--tokens", type=int, default=32)
a = ap.parse_args()
oracle = json.load(open(a.oracle))
bad = 0
for p in oracle["prompts"]:
    want = p["greedy_ids"][: a.tokens]
    out = subprocess.run([a.memexec, "generate", "--model", a.model, "--prompt-ids",
                          ",".join(map(str, p["prompt_ids"])), "--max-tokens", str(len(want)),
                          "--ignore-eos", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{p['name']}: memexec failed: {out.stderr.strip()}"); bad += 1; continue
    got = json.loads(out.stdout)["ids"]
    first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
    same = sum(x == y for x, y in zip(got, want))
    print(f"{p['name']}: {same}/{len(want)} identical" + ("" if first is None else f", first diff at {first}"))
    bad += first is not None or len(got) != len(want)
print(f"memexec vs {a.oracle}: {len(oracle['prompts']) - bad}/{len(oracle['prompts'])} prompts identical")
sys.exit(1 if bad else 0)
