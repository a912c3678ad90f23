#!/usr/bin/env python3
"""Compare two mlx-lm oracle files (scripts/fixtures/oracle.py, schema memexec-oracle/1) of the
same model and prompts, e.g. the CPU oracle that travelled vs the one made on the GPU:
per prompt, whether the greedy ids are identical (over the shorter of the two), where they first diverge, and the largest
difference of the last-position top-k logits they share. Prints a table and a summary line;
exit status 0 always (a report, not a test: CPU and GPU kernels round differently).

Usage: compare_oracle.py A.json B.json
"""
import json
import sys


def main():
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    pa = {p["name"]: p for p in a["prompts"]}
    same = total = 0
    print(f"{'prompt':<10} {'len':>5} {'greedy':>9} {'n':>4} {'diverge@':>8} {'argmax':>7} {'max|dlogit| topk':>16}")
    for p in b["prompts"]:
        q = pa.get(p["name"])
        if q is None or q["prompt_ids"] != p["prompt_ids"]:
            print(f"{p['name']:<10} prompt differs or missing in {sys.argv[1]}")
            continue
        n = min(len(q["greedy_ids"]), len(p["greedy_ids"]))  # files may differ in max-new
        ga, gb = q["greedy_ids"][:n], p["greedy_ids"][:n]
        div = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
        ident = ga == gb
        same += ident
        total += 1
        la, lb = q["last_logits"]["top_k"], p["last_logits"]["top_k"]
        va = dict(zip(la["ids"], la.get("values", la.get("logits", []))))
        vb = dict(zip(lb["ids"], lb.get("values", lb.get("logits", []))))
        common = set(va) & set(vb)
        dmax = max((abs(va[i] - vb[i]) for i in common), default=float("nan"))
        am = "same" if q["last_logits"]["argmax"] == p["last_logits"]["argmax"] else "DIFF"
        print(f"{p['name']:<10} {len(p['prompt_ids']):>5} {'identical' if ident else 'differs':>9} {n:>4} "
              f"{'-' if div is None else div:>8} {am:>7} {dmax:>16.3g}")
    print(f"greedy ids identical: {same}/{total} ({sys.argv[1]} vs {sys.argv[2]})")


if __name__ == "__main__":
    main()
