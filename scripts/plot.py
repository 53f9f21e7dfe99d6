#!/usr/bin/env python3
"""Draws a ramtrain run's curves (loss, validation/eval loss, learning rate,
throughput) from its metrics file into a PNG.

  python3 scripts/plot.py runs/demo                 # reads runs/demo/metrics.jsonl, writes runs/demo/curves.png
  python3 scripts/plot.py runs/demo --out docs/images/demo_loss.png --title "tiny-byte demo"
  python3 scripts/plot.py path/to/metrics.jsonl

Needs matplotlib (pip install matplotlib); nothing else in ramtrain does.
Records are the JSON lines `ramtrain train` writes (--metrics, default
OUT/metrics.jsonl): step records {"step", "loss", "lr", "tokens", "time", ...}
and evaluation records {"step", "val_loss", "eval_loss"?, "final"?}. A resumed
run appends to the file; a step that appears twice (the steps redone after a
kill -9) is drawn once, from its last record. Throughput is tokens per second
of wall-clock time between consecutive step records (gaps longer than a minute,
e.g. a restart, are left out).
"""
import argparse
import json
import os
import sys


def read_records(path):
    steps, evals = {}, {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                print(f"{path}:{n}: not JSON (a cut last line?), skipped", file=sys.stderr)
                continue
            if "loss" in r:
                steps[r["step"]] = r
            elif "val_loss" in r or "eval_loss" in r:
                evals[r["step"]] = r
    return [steps[k] for k in sorted(steps)], [evals[k] for k in sorted(evals)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run's output directory (holding metrics.jsonl) or a metrics .jsonl file")
    ap.add_argument("--out", help="PNG to write (default: next to the metrics file, curves.png)")
    ap.add_argument("--title", help="figure title (default: the run's path)")
    args = ap.parse_args()
    path = os.path.join(args.run, "metrics.jsonl") if os.path.isdir(args.run) else args.run
    if not os.path.isfile(path):
        sys.exit(f"plot.py: {path}: no such metrics file (train with --out DIR, or --metrics FILE)")
    steps, evals = read_records(path)
    if not steps:
        sys.exit(f"plot.py: {path}: holds no step records")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: needs matplotlib: pip install matplotlib")

    ok = [r for r in steps if not r.get("skipped") and r["loss"] is not None]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot([r["step"] for r in ok], [r["loss"] for r in ok], lw=1, label="train loss")
    for key, label in (("val_loss", "validation loss"), ("eval_loss", "eval-data loss")):
        pts = [(r["step"], r[key]) for r in evals if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", ms=4, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax = axes[1]
    ax.plot([r["step"] for r in steps], [r["lr"] for r in steps], lw=1, color="tab:green")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
    ax = axes[2]
    xs, ys = [], []
    for a, b in zip(steps, steps[1:]):
        dt = b.get("time", 0) - a.get("time", 0)
        if b["step"] == a["step"] + 1 and 0 < dt < 60:
            xs.append(b["step"])
            ys.append(b["tokens"] / dt)
    if xs:
        ax.plot(xs, ys, lw=1, color="tab:red")
    else:
        ax.text(0.5, 0.5, "no wall-clock times in the records", ha="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s")
    ax.grid(alpha=0.3)
    fig.suptitle(args.title or os.path.dirname(os.path.abspath(path)))
    fig.tight_layout()
    out = args.out or os.path.join(os.path.dirname(path) or ".", "curves.png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(steps)} steps, {len(evals)} evaluations)")


if __name__ == "__main__":
    main()
