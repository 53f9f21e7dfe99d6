#!/usr/bin/env python3
"""Where the GPU waits: idle gaps of the compute stream in a ramtrain --trace file.

  python3 bench/trace_gaps.py TRACE.json [--min-ms 1] [--top 12]

For every step after the first: the step's compute-busy and idle time, the
idle split by phase (turn-around = from the end of a step's compute to the
first forward kernel of the next; inside the forward; head; backward), and
the largest gaps with the spans on either side. Then the CPU optimizer lane:
per step, its busy time and when it finished relative to the forward.
A command for reading traces, not a test.
"""
import argparse
import json
import sys
from collections import defaultdict


def load(path):
    try:
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace_gaps: cannot read {path}: {e}")
    spans = defaultdict(list)  # lane -> [(t0, t1, name, step)]
    for e in ev:
        if e.get("ph") != "X":
            continue
        spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"], e["args"]["step"]))
    for v in spans.values():
        v.sort()
    return spans


def phase(name):
    if name.startswith("forward") or name == "embed":
        return "forward"
    if name == "head":
        return "head"
    return "backward"  # backward, norm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--min-ms", type=float, default=1.0, help="list gaps at least this long (ms)")
    ap.add_argument("--top", type=int, default=12, help="how many of the largest gaps to list")
    a = ap.parse_args()
    spans = load(a.trace)
    comp = spans.get(2, [])
    if not comp:
        sys.exit(f"trace_gaps: {a.trace} has no compute-stream spans")
    # merge overlapping compute spans, remembering the names at the edges
    merged = []
    for t0, t1, name, step in comp:
        if merged and t0 <= merged[-1][1]:
            if t1 > merged[-1][1]:
                merged[-1][1], merged[-1][3] = t1, name
        else:
            merged.append([t0, t1, name, name, step])
    steps = sorted({s for *_, s in comp})
    gaps = []  # (ms, step, before, after)
    for prev, nxt in zip(merged, merged[1:]):
        g = (nxt[0] - prev[1]) / 1000.0
        if g > 0:
            gaps.append((g, nxt[4], prev[3], nxt[2], nxt[0]))
    print(f"{a.trace}: {len(comp)} compute spans, steps {steps[0]}..{steps[-1]}")
    print(f"{'step':>4} {'span s':>8} {'busy s':>8} {'idle ms':>8} {'turn-around':>11} {'forward':>8} "
          f"{'head':>6} {'backward':>8}   (idle ms by phase of the span after the gap)")
    for s in steps[1:]:
        first = min(t0 for t0, _, _, st in comp if st == s)
        last = max(t1 for _, t1, _, st in comp if st == s)
        prev_last = max((t1 for _, t1, _, st in comp if st == s - 1), default=first)
        busy = sum(m[1] - m[0] for m in merged if m[4] == s)
        fw0 = min((t0 for t0, _, name, st in comp if st == s and name.startswith("forward")), default=first)
        by = defaultdict(float)
        for g, st, before, after, end in gaps:
            if st == s:
                by["turn" if end <= fw0 else phase(after)] += g
        span = (last - prev_last) / 1e6
        print(f"{s:>4} {span:8.3f} {busy / 1e6:8.3f} {sum(by.values()):8.1f} {by['turn']:11.1f} "
              f"{by['forward']:8.1f} {by['head']:6.1f} {by['backward']:8.1f}")
    big = sorted((g for g in gaps if g[0] >= a.min_ms and g[1] != steps[0]), reverse=True)[: a.top]
    print(f"\nlargest gaps (>= {a.min_ms} ms, first step left out):")
    for g, st, before, after, _ in big:
        print(f"  step {st}: {g:8.2f} ms  after '{before}'  before '{after}'")
    opt = spans.get(4, [])
    if opt:
        print("\nCPU optimizer lane (adamw spans):")
        for s in steps[1:]:
            o = [x for x in opt if x[3] == s - 1 and x[2].startswith("adamw")]  # step s-1's update runs in step s
            if not o:
                continue
            fw = [x for x in comp if x[3] == s and x[2].startswith("forward")]
            fw_end = max(x[1] for x in fw) if fw else float("nan")
            fw_start = min(x[0] for x in fw) if fw else float("nan")
            busy = sum(x[1] - x[0] for x in o) / 1e6
            print(f"  update of step {s - 1}: busy {busy:.3f} s, from {(o[0][0] - fw_start) / 1e3:+.1f} ms to "
                  f"{(o[-1][1] - fw_end) / 1e3:+.1f} ms relative to step {s}'s forward start / end")


if __name__ == "__main__":
    main()
