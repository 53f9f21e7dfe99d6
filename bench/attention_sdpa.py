#!/usr/bin/env python3
"""PyTorch SDPA causal attention, timed like bench/attention_bench.cu.

FLOPs counted as causal: fwd = 2 GEMMs * 2*B*H*T*T*D / 2, bwd = 2.5 * fwd.
Median of --reps CUDA-event timings after --warmup calls; bwd time is
(fwd + bwd) - fwd measured separately. Inputs uniform random, bf16.

--check DIR: load the tensors attention_bench --dump DIR wrote, recompute the
reference in fp32 (SDPA math on upcast inputs, on the GPU) and print
||got - ref|| / ||ref|| and max |err| / max |ref| for out, lse, dq, dk, dv.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn.functional as F


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench(B, T, H, G, D, warmup, reps):
    dev = "cuda"
    q = (torch.rand(B, H, T, D, device=dev) * 4 - 2).bfloat16().requires_grad_()
    k = (torch.rand(B, G, T, D, device=dev) * 2 - 1).bfloat16().requires_grad_()
    v = (torch.rand(B, G, T, D, device=dev) * 2 - 1).bfloat16().requires_grad_()
    dout = (torch.rand(B, H, T, D, device=dev) * 2 - 1).bfloat16()
    gqa = G != H

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        o.backward(dout)

    f_ms = median_ms(fwd, warmup, reps)
    fb_ms = median_ms(fwd_bwd, warmup, reps)
    b_ms = fb_ms - f_ms
    fwd_flop = 4.0 * B * H * T * T * D / 2
    bwd_flop = 2.5 * fwd_flop
    print(f"{B:<4} {T:<6} {H:<4} {G:<4} {D:<4} {f_ms:10.3f} {b_ms:10.3f} {fwd_flop / f_ms / 1e9:10.1f} "
          f"{bwd_flop / b_ms / 1e9:10.1f} {(fwd_flop + bwd_flop) / fb_ms / 1e9:10.1f}", flush=True)


def load(dirname, name, dtype, shape):
    raw = np.fromfile(os.path.join(dirname, name), dtype=np.uint16 if dtype == "bf16" else np.float32)
    t = torch.from_numpy(raw.astype(np.int32) if dtype == "bf16" else raw)
    if dtype == "bf16":
        t = (t.to(torch.int32) << 16).view(torch.float32)
    return t.reshape(shape).cuda()


def check(dirname):
    torch.backends.cuda.matmul.allow_tf32 = False
    B, T, H, G, D = (int(x) for x in open(os.path.join(dirname, "shape.txt")).read().split())
    # files are [B, T, heads, D]; SDPA wants [B, heads, T, D]
    def bthd(name, heads):
        return load(dirname, name, "bf16", (B, T, heads, D)).transpose(1, 2)
    q, k, v, dout = bthd("q.bin", H), bthd("k.bin", G), bthd("v.bin", G), bthd("dout.bin", H)
    out, dq, dk, dv = bthd("out.bin", H), bthd("dq.bin", H), bthd("dk.bin", G), bthd("dv.bin", G)
    lse = load(dirname, "lse.bin", "f32", (B, H, T))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    rep = H // G
    ke, ve = kr.repeat_interleave(rep, dim=1), vr.repeat_interleave(rep, dim=1)
    s = (qr @ ke.transpose(-1, -2)) / D ** 0.5
    mask = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    lse_ref = torch.logsumexp(s, dim=-1)
    o = torch.softmax(s, dim=-1) @ ve
    o.backward(dout)
    print("check vs fp32 reference (rel_l2, max_err/max_ref):")
    for name, got, ref in [("out", out, o), ("lse", lse, lse_ref), ("dq", dq, qr.grad), ("dk", dk, kr.grad),
                           ("dv", dv, vr.grad)]:
        ref = ref.detach().float()
        rel = ((got - ref).norm() / ref.norm()).item()
        mx = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"  {name:4} rel_l2 {rel:.2e}  max {mx:.2e}  {'ok' if rel < 1e-2 else 'FAIL'}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=4096)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--G", type=int, default=32)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--B", default="1,2")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--check", default="")
    a = p.parse_args()
    if a.check:
        check(a.check)
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'B':<4} {'T':<6} {'H':<4} {'G':<4} {'D':<4} {'fwd_ms':>10} {'bwd_ms':>10} {'fwd_TF/s':>10} "
          f"{'bwd_TF/s':>10} {'fb_TF/s':>10}")
    for B in (int(x) for x in a.B.split(",")):
        bench(B, a.T, a.H, a.G, a.D, a.warmup, a.reps)


if __name__ == "__main__":
    main()
