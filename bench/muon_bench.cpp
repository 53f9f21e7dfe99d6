// Muon's Newton-Schulz (NS5) on the GPU (cuda/newton_schulz.h) on the
// matrices of one Qwen2.5-7B layer: the five quintic steps on a device
// buffer (bf16 operands, fp32 sums), and the whole GpuOrthogonalizer call the
// optimizer makes (host norm and bf16 conversion, copies in and out, widening).
// FLOPs per matrix, m = min(R, C), n = max(R, C): 5 x (4 m^2 n + 2 m^3)
// (A = X X^T: 2 m^2 n, A A: 2 m^3, B X: 2 m^2 n). Not a test: timings only.
//   ramtrain_muon_bench [repeats]      (default 5; needs a CUDA device)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "cuda/check.h"
#include "engine/backend.h"
#include "engine/cuda/muon_gpu.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
    if (repeats < 1) rt::fail("[muon_bench] repeats must be >= 1");
    if (!rt::cuda_backend_available()) {
      std::printf("muon_bench: no CUDA device\n");
      return 1;
    }
    struct Shape {
      const char* what;
      int64_t R, C;
      int count;  // per layer
    };
    // Qwen2.5-7B: hidden 3584, 28 heads / 4 KV heads of 128, MLP 18944
    const Shape shapes[] = {{"q_proj / o_proj", 3584, 3584, 2},
                            {"k_proj / v_proj", 512, 3584, 2},
                            {"gate_proj / up_proj", 18944, 3584, 2},
                            {"down_proj", 3584, 18944, 1}};
    int64_t max_numel = 0, max_small = 0;
    for (const Shape& s : shapes) {
      max_numel = std::max(max_numel, s.R * s.C);
      max_small = std::max(max_small, std::min(s.R, s.C));
    }
    rt::cuda::DeviceAllocator alloc(8ull << 30);
    rt::cuda::GpuOrthogonalizer orth(alloc, max_numel, max_small);
    rt::cuda::NewtonSchulz ns(alloc, max_numel, max_small, static_cast<float>(rt::kMuonNsA),
                              static_cast<float>(rt::kMuonNsB), static_cast<float>(rt::kMuonNsC), rt::kMuonNsSteps);
    rt::cuda::DevBuf<rt::cuda::bf16> x(alloc, max_numel, "bench input");
    std::printf("NS5 on the GPU, %d repeats each (median of the device-only runs; the optimizer's whole call)\n",
                repeats);
    double layer_flop = 0, layer_dev_s = 0, layer_call_s = 0;
    for (const Shape& s : shapes) {
      const int64_t n = s.R * s.C, m = std::min(s.R, s.C), l = std::max(s.R, s.C);
      const double flop = 5.0 * (4.0 * m * m * l + 2.0 * m * m * m);
      std::mt19937_64 rng(1);
      std::normal_distribution<float> nd(0.f, 1e-3f);
      std::vector<float> u(static_cast<size_t>(n)), o(u.size());
      for (float& v : u) v = nd(rng);
      // device-only: a normalised bf16 input, five steps in place
      const float scale = 1.0f / (1e-3f * std::sqrt(static_cast<float>(n)));
      std::vector<uint16_t> xb(u.size());
      for (size_t i = 0; i < u.size(); ++i) xb[i] = rt::f32_to_bf16(u[i] * scale);
      CUDA_CHECK(cudaMemcpy(x.data(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
      ns.run_device(x.data(), s.R, s.C);  // warm-up (cuBLAS heuristics)
      CUDA_CHECK(cudaStreamSynchronize(ns.stream()));
      std::vector<double> dev;
      for (int r = 0; r < repeats; ++r) {
        CUDA_CHECK(cudaMemcpy(x.data(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
        const auto t0 = std::chrono::steady_clock::now();
        ns.run_device(x.data(), s.R, s.C);
        CUDA_CHECK(cudaStreamSynchronize(ns.stream()));
        dev.push_back(seconds_since(t0));
      }
      std::sort(dev.begin(), dev.end());
      const double d = dev[dev.size() / 2];
      orth.orthogonalize(u.data(), o.data(), s.R, s.C);  // warm-up
      std::vector<double> call;
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        orth.orthogonalize(u.data(), o.data(), s.R, s.C);
        call.push_back(seconds_since(t0));
      }
      std::sort(call.begin(), call.end());
      const double c = call[call.size() / 2];
      std::printf(
          "  %-20s %6lld x %-6lld %8.2f GFLOP  device %8.3f ms  %7.1f TFLOP/s   whole call %8.3f ms  %7.1f TFLOP/s\n",
          s.what, (long long)s.R, (long long)s.C, flop / 1e9, d * 1e3, flop / d / 1e12, c * 1e3, flop / c / 1e12);
      layer_flop += s.count * flop;
      layer_dev_s += s.count * d;
      layer_call_s += s.count * c;
    }
    std::printf(
        "one Qwen2.5-7B layer (7 matrices): %.1f GFLOP, device %.1f ms (%.1f TFLOP/s), whole calls %.1f ms "
        "(%.1f TFLOP/s); 28 layers: %.2f s of optimizer time per step\n",
        layer_flop / 1e9, layer_dev_s * 1e3, layer_flop / layer_dev_s / 1e12, layer_call_s * 1e3,
        layer_flop / layer_call_s / 1e12, 28 * layer_call_s);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
