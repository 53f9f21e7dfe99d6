// The CUDA MoE layer alone (cuda/moe.cu) at OLMoE-1B-7B's shape (issue 32):
// per iteration one training forward (with the routing statistics), the
// router-only forward of the recompute and one backward (with the
// load-balancing gradient), as the streaming engine calls them, the expert
// GEMMs looped and grouped (MoeBlas's two modes), on random inputs whose
// routing is roughly balanced. Per mode: milliseconds of the forward and of
// the recompute + backward (CUDA events on the stream; the calls' waits for
// the expert counts included), and the expert TFLOP/s of the model's 9
// GEMMs of 2 N K C F FLOPs each (forward 3; backward: d_a, the 2 input
// gradients and the 3 weight gradients) and of the 11 that run (the
// backward recomputes gate and up). Each expert's gate and up lie in one
// block, gate first, as in the engine. The grouped mode runs three times:
// its weight gradients on the call's stream (lanes 0), on MoeBlas's default
// lanes with gate and up apart in the backward (the pair off), and as the
// engine runs it (gate and up as one: MoeBlas::merged_gate_up).
//   moe_bench [N C E K F] (default 32768 2048 64 8 1024: 16 x 2048 tokens)
// Not a test: timings only.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/check.h"
#include "cuda/ops.h"
#include "bench_device.cuh"

using rt::cuda::bf16;

namespace {

using rt::bench::Dev;
using rt::bench::fill;

}  // namespace

int main(int argc, char** argv) {
  int64_t v[5] = {32768, 2048, 64, 8, 1024};
  if (argc != 1 && argc != 6) {
    std::fprintf(stderr, "usage: moe_bench [N C E K F]\n");
    return 2;
  }
  for (int i = 1; i < argc; ++i) v[i - 1] = std::atoll(argv[i]);
  const int64_t N = v[0], C = v[1], E = v[2], K = v[3], F = v[4];
  try {
    const rt::cuda::MoeDims d{N, C, E, K, F, false};
    // each expert's gate and up weights (and gradients) in one [2F, C] block,
    // gate first: the engine's layout (HF names in natural order)
    Dev x(N * C * 2), router(E * C * 2), gate_up(E * 2 * F * C * 2), down(E * C * F * 2);
    Dev dgate_up(E * 2 * F * C * 4), ddown(E * C * F * 4), drouter(E * C * 4);
    Dev probs(N * E * 4), out(N * C * 2), dout(N * C * 2), dx(N * C * 2);
    Dev tokens(E * 8), psum(E * 8), dprob(E * 4);
    Dev scratch(rt::cuda::moe_scratch_bytes(d));
    fill(x, N * C, 1, 1.f);
    fill(router, E * C, 2, 0.05f);  // small logits: a roughly balanced routing
    fill(gate_up, E * 2 * F * C, 3, 0.02f);
    fill(down, E * C * F, 5, 0.02f);
    fill(dout, N * C, 6, 1e-3f);
    CUDA_CHECK(cudaMemset(dgate_up.p, 0, E * 2 * F * C * 4));
    CUDA_CHECK(cudaMemset(ddown.p, 0, E * C * F * 4));
    CUDA_CHECK(cudaMemset(drouter.p, 0, E * C * 4));
    CUDA_CHECK(cudaMemset(dprob.p, 0, E * 4));
    std::vector<const bf16*> pg, pu, pd;
    std::vector<float*> gg, gu, gd;
    for (int64_t e = 0; e < E; ++e) {
      pg.push_back(gate_up.as<bf16>() + e * 2 * F * C);
      pu.push_back(pg.back() + F * C);
      pd.push_back(down.as<bf16>() + e * C * F);
      gg.push_back(dgate_up.as<float>() + e * 2 * F * C);
      gu.push_back(gg.back() + F * C);
      gd.push_back(ddown.as<float>() + e * C * F);
    }
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1, e2;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventCreate(&e2));
    const rt::cuda::Scratch sc{scratch.p, rt::cuda::moe_scratch_bytes(d)};
    const double gemm = 2.0 * static_cast<double>(N * K) * static_cast<double>(C) * static_cast<double>(F);
    const double flops = 9.0 * gemm, hw_flops = 11.0 * gemm;
    std::printf(
        "MoE layer N %lld, C %lld, E %lld, K %lld, F %lld: %.2f expert TFLOP per forward + backward (model; %.2f "
        "run)\n",
        (long long)N, (long long)C, (long long)E, (long long)K, (long long)F, flops / 1e12, hw_flops / 1e12);
    struct Run {
      rt::cuda::MoeGemm mode;
      int lanes;         // -1: the default
      bool pair = true;  // false: gate and up apart in the backward (two products, two weight-gradient GEMMs)
    };
    for (const Run run : {Run{rt::cuda::MoeGemm::looped, -1}, Run{rt::cuda::MoeGemm::grouped, 0},
                          Run{rt::cuda::MoeGemm::grouped, -1, false}, Run{rt::cuda::MoeGemm::grouped, -1}}) {
      const auto mode = run.mode;
      rt::cuda::MoeBlas blas;
      blas.set_gemm_mode(mode);
      if (!run.pair) blas.set_wgrad_pair(false);
      if (run.lanes >= 0) blas.set_wgrad_lanes(run.lanes);
      double fwd = 0, bwd = 0, wall = 0;
      const int warm = 2, iters = 5;
      for (int it = 0; it < warm + iters; ++it) {
        const auto t0 = std::chrono::steady_clock::now();
        CUDA_CHECK(cudaEventRecord(e0, s));
        rt::cuda::moe_forward(blas, out.as<bf16>(), probs.as<float>(), x.as<bf16>(), router.as<bf16>(), pg.data(),
                              pu.data(), pd.data(), d, tokens.as<int64_t>(), psum.as<double>(), sc, s);
        CUDA_CHECK(cudaEventRecord(e1, s));
        rt::cuda::moe_forward(blas, nullptr, probs.as<float>(), x.as<bf16>(), router.as<bf16>(), pg.data(), pu.data(),
                              pd.data(), d, nullptr, nullptr, sc, s);
        rt::cuda::moe_backward(blas, dx.as<bf16>(), drouter.as<float>(), gg.data(), gu.data(), gd.data(),
                               dout.as<bf16>(), x.as<bf16>(), probs.as<float>(), router.as<bf16>(), pg.data(),
                               pu.data(), pd.data(), d, dprob.as<float>(), sc, s);
        CUDA_CHECK(cudaEventRecord(e2, s));
        CUDA_CHECK(cudaEventSynchronize(e2));
        const double w = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        float f = 0, b = 0;
        CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
        CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
        if (it < warm) continue;
        fwd += f / iters, bwd += b / iters, wall += w / iters;
      }
      std::printf(
          "%-8s lanes %2d  forward %8.2f ms   recompute + backward %8.2f ms   wall %8.2f ms   %6.1f expert model "
          "TFLOP/s (%6.1f run)   grouped calls %lld   gate+up as one %lld\n",
          mode == rt::cuda::MoeGemm::grouped ? "grouped" : "looped", blas.wgrad_lanes(), fwd, bwd, wall,
          flops / (wall * 1e-3) / 1e12, hw_flops / (wall * 1e-3) / 1e12, (long long)blas.grouped_calls(),
          (long long)blas.merged_calls());
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s\n", ex.what());
    return 1;
  }
  return 0;
}
