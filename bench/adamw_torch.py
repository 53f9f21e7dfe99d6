#!/usr/bin/env python3
"""PyTorch's CPU AdamW on the same cores, the reference for ramtrain_optim_bench.

Times torch.optim.AdamW(fused=True) (and foreach) on one flat fp32 parameter of
N elements with an fp32 gradient: the same 28 bytes per parameter ramtrain's
update moves, less the 2-byte bf16 shadow ramtrain also writes. A command, not
a test.
  python3 bench/adamw_torch.py [--params N] [--reps R] [--threads T]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=256 << 20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.params / 1e6:.0f}M params")
    for mode in ("fused", "foreach"):
        p = torch.nn.Parameter(torch.randn(a.params))
        p.grad = torch.randn(a.params) * 1e-3
        kw = {"fused": True} if mode == "fused" else {"foreach": True}
        try:
            opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, **kw)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{mode}: unavailable ({e})")
            continue
        opt.step()  # allocates m, v
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
        gps = a.params / best / 1e9
        print(f"torch AdamW {mode:8s} {gps:6.2f} Gparam/s  ({gps * 28:.0f} GB/s at 28 B/param)")
        if mode == "fused":  # the same job as ramtrain's update: also write the bf16 copy the GPU computes with
            shadow = torch.empty(a.params, dtype=torch.bfloat16)
            best = float("inf")
            for _ in range(a.reps):
                t0 = time.perf_counter()
                opt.step()
                shadow.copy_(p.detach())
                best = min(best, time.perf_counter() - t0)
            gps = a.params / best / 1e9
            print(f"torch AdamW fused + bf16 copy {gps:6.2f} Gparam/s  (the job ramtrain's update does, 30 B/param "
                  "when fused)")
        del opt, p


if __name__ == "__main__":
    main()
