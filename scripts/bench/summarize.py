#!/usr/bin/env python3
"""Prints the table of one or more `memexec bench --json-out` files, recomputing each
configuration's time as the LOWER median of its repetitions (`e2e_ms_all`) and the ratios from
those, so files written before the bench used the lower median read the same way.

usage: scripts/bench/summarize.py FILE.json [FILE.json ...]
"""
import json
import sys


def lower_median(xs):
    xs = sorted(xs)
    return xs[(len(xs) - 1) // 2] if xs else 0.0


def main(paths):
    for path in paths:
        doc = json.load(open(path))
        print(f"# {path}: model {doc.get('model')}, weights {doc.get('weights', '?')}, "
              f"reps {doc.get('reps')}, blas {doc.get('blas', '?')}")
        print(f"{'workload':<8} {'engine':<8} {'mode':<11} {'ms':>9} {'reps ms':>22} "
              f"{'x serial':>8} {'identical':>9}")
        serial = {}
        for r in doc["results"]:
            if r["engine"] == "memexec" and r["mode"] == "serial":
                serial[r["workload"]] = lower_median(r.get("e2e_ms_all") or [r["e2e_ms"]])
        for r in doc["results"]:
            runs = r.get("e2e_ms_all") or [r["e2e_ms"]]
            ms = lower_median(runs)
            base = serial.get(r["workload"])
            ratio = base / ms if base and ms else 0.0
            reps = ",".join(f"{x:.0f}" for x in runs)
            print(f"{r['workload']:<8} {r['engine']:<8} {r['mode']:<11} {ms:>9.0f} {reps:>22} "
                  f"{ratio:>8.2f} {r['identical_to_serial']:>5}/{r['rows']:<3}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
