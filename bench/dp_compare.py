#!/usr/bin/env python3
"""Compares data-parallel runs by their metrics.jsonl (docs/multi_gpu.md).

  dp_compare.py REF.jsonl RUN.jsonl [--tol R] [--skip K]

Per step: the loss of both and their relative difference; the largest is
checked against --tol (exit 1 above it). Then tokens/s of each run, over the
steps after the first K (warm-up), from the records' wall-clock times.
"""
import argparse
import json
import sys


def read(path):
    steps = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "loss" in r and "step" in r:
                steps[r["step"]] = r
    return steps


def tok_per_s(steps, skip):
    ks = sorted(steps)
    ks = ks[skip:]
    if len(ks) < 2:
        return float("nan")
    t = steps[ks[-1]]["time"] - steps[ks[0]]["time"]
    tokens = sum(steps[k]["tokens"] for k in ks[1:])
    return tokens / t if t > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("run")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--skip", type=int, default=1)
    a = ap.parse_args()
    ref, run = read(a.ref), read(a.run)
    common = sorted(set(ref) & set(run))
    if not common:
        print("no common steps")
        return 1
    worst = 0.0
    for k in common:
        l0, l1 = ref[k]["loss"], run[k]["loss"]
        rel = abs(l1 - l0) / max(abs(l0), 1e-12)
        worst = max(worst, rel)
        print(f"step {k:4d}  loss {l0:.6f} {l1:.6f}  rel {rel:.2e}  tokens {ref[k]['tokens']} {run[k]['tokens']}")
    r0, r1 = tok_per_s(ref, a.skip), tok_per_s(run, a.skip)
    print(f"max relative loss difference {worst:.3e} over {len(common)} steps")
    print(f"tokens/s: ref {r0:.1f}, run {r1:.1f}, ratio {r1 / r0:.3f}")
    if a.tol is not None and worst > a.tol:
        print(f"FAIL: above the tolerance {a.tol:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
