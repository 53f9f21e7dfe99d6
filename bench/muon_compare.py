#!/usr/bin/env python3
"""Issue 35's numbers from tests/gpu/run.sh's `muonperf` part: Qwen2.5-7B at
16 x 2048 tokens per step with --grads fold, AdamW against Muon (logs of
bench/lean_size.sh), and NS5's device time per step from ramtrain_muon_bench.

  bench/muon_compare.py BENCH_LOG ADAMW_LOG MUON_LOG [--tokens-per-step N]

Tokens/s: the median of the step lines from step 2 on (step 1 holds the
start-up). The bound: if the AdamW step is GPU-bound and NS5 adds its device
time to it (no idle GPU time to fill), Muon's step is at least
S_adamw + t_ns5, so muon / adamw tokens/s <= S_adamw / (S_adamw + t_ns5)."""
import argparse
import re
import statistics
import sys

STEP = re.compile(r"step\s+(\d+)/(\d+) \|.*?\|\s*([\d.]+) tok/s")
PER_STEP = re.compile(r"per step \((\d+) layers\): NS5 ([\d.]+) TFLOP, ([\d.]+) s of device time in the steps alone "
                      r"\(([\d.]+) s as whole jobs.*?pipelined")
LAYER = re.compile(r"^\s+(.+?)\s+([\d.]+) ms per layer, x (\d+) layers: ([\d.]+) s", re.M)


def tok_s(path):
    vals = []
    with open(path, errors="replace") as f:
        for line in f:
            m = STEP.search(line)
            if m and int(m.group(1)) >= 2:
                vals.append(float(m.group(3)))
    if not vals:
        sys.exit(f"{path}: no step lines past step 1 (did the run fail? see the log)")
    return statistics.median(vals), min(vals), max(vals)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_log")
    ap.add_argument("adamw_log")
    ap.add_argument("muon_log")
    ap.add_argument("--tokens-per-step", type=int, default=16 * 2048)
    a = ap.parse_args()
    text = open(a.bench_log, errors="replace").read()
    m = PER_STEP.search(text)
    if not m:
        sys.exit(f"{a.bench_log}: no 'per step' line (did ramtrain_muon_bench fail?)")
    layers, tflop, steps_s, jobs_s = int(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4))
    for w, ms, n, s in LAYER.findall(text):
        print(f"optimizer thread, {w}: {float(ms):.1f} ms per layer, {float(s):.2f} s per step ({n} layers)")
    aw, aw_lo, aw_hi = tok_s(a.adamw_log)
    mu, mu_lo, mu_hi = tok_s(a.muon_log)
    s_aw, s_mu = a.tokens_per_step / aw, a.tokens_per_step / mu
    print(f"AdamW {aw:.0f} tok/s ({aw_lo:.0f}-{aw_hi:.0f}), step {s_aw:.2f} s")
    print(f"Muon  {mu:.0f} tok/s ({mu_lo:.0f}-{mu_hi:.0f}), step {s_mu:.2f} s")
    print(f"NS5 per step: {tflop:.0f} TFLOP, {steps_s:.3f} s on the device in the steps alone "
          f"({tflop / steps_s:.0f} TFLOP/s), {jobs_s:.3f} s as whole lane jobs (+ U in, norm, O out)")
    bound = s_aw / (s_aw + steps_s)
    print(f"bound (GPU-bound AdamW step + NS5's device time): {s_aw:.2f} / ({s_aw:.2f} + {steps_s:.3f}) = "
          f"{bound:.3f}x; the issue asks >= 0.9x")
    ratio = mu / aw
    print(f"MUON/ADAMW {ratio:.3f}x tokens/s ({ratio / bound:.1%} of the bound); Muon's step is "
          f"{s_mu - s_aw:.2f} s longer than AdamW's (NS5 alone on the device: {steps_s:.2f} s)")


if __name__ == "__main__":
    main()
