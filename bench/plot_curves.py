#!/usr/bin/env python3
"""Loss curves of several runs' metrics.jsonl (ramtrain train --metrics).

    bench/plot_curves.py --table RUN.jsonl...          a table: final training loss (mean of the
                                                        last --window steps), final validation loss,
                                                        each against the reference run's (the first
                                                        file named lq_adamw.jsonl, else the first)
    bench/plot_curves.py --plot OUT.png RUN.jsonl...   also a plot (needs matplotlib)

A run's name is its file name without the lq_ prefix and .jsonl suffix."""
import argparse
import json
import os
import sys


def load(path):
    steps, losses, evals, final = [], [], [], None
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in r and not r.get("skipped"):
                steps.append(r["step"])
                losses.append(r["loss"])
            if "val_loss" in r:
                evals.append((r["step"], r["val_loss"]))
                if r.get("final"):
                    final = r["val_loss"]
    return steps, losses, evals, final


def name_of(path):
    n = os.path.basename(path)
    n = n[3:] if n.startswith("lq_") else n
    return n[:-6] if n.endswith(".jsonl") else n


def smooth(xs, w):
    out, s = [], 0.0
    for i, x in enumerate(xs):
        s += x
        if i >= w:
            s -= xs[i - w]
        out.append(s / min(i + 1, w))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--plot")
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    runs = {name_of(p): load(p) for p in a.runs}
    ref = "adamw" if "adamw" in runs else name_of(a.runs[0])
    rs, rl, _, rv = runs[ref]
    ref_train = sum(rl[-a.window:]) / max(1, len(rl[-a.window:]))
    print("%-20s %6s %12s %9s %10s %9s" % ("mode", "steps", "train loss", "vs " + ref, "val loss", "vs " + ref))
    for n, (s, l, e, v) in sorted(runs.items(), key=lambda kv: (kv[0] != ref, kv[0])):
        if not l:
            print("%-20s (no steps)" % n)
            continue
        t = sum(l[-a.window:]) / len(l[-a.window:])
        vs = "%+8.2f%%" % (100 * (t / ref_train - 1))
        vv = "%10.4f" % v if v is not None else "%10s" % "-"
        dv = "%+8.2f%%" % (100 * (v / rv - 1)) if (v is not None and rv) else "%9s" % "-"
        print("%-20s %6d %12.4f %9s %s %s" % (n, s[-1], t, vs, vv, dv))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for n, (s, l, e, v) in sorted(runs.items()):
            ax1.plot(s, smooth(l, a.window), label=n, lw=1)
            if e:
                ax2.plot([x for x, _ in e], [y for _, y in e], marker="o", ms=3, label=n, lw=1)
        ax1.set_title("training loss (mean of %d steps)" % a.window)
        ax2.set_title("validation loss")
        for ax in (ax1, ax2):
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        ax1.set_ylim(top=min(ax1.get_ylim()[1], 5.0))
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=90)
        print("plot:", a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
