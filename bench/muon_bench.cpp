// Muon's Newton-Schulz (NS5) on the GPU (cuda/newton_schulz.h,
// engine/cuda/muon_gpu.h) on the matrices of one Qwen2.5-7B layer. Per matrix:
// the five quintic steps alone on a device buffer (bf16 operands, fp32
// sums); the lane's whole job as the engine queues it, timed by its events
// (U in as fp32 + the device norm and bf16 division, the steps, O out as
// bf16); and the synchronous call (orthogonalize: the job + the host's
// copies into and out of the pinned staging). Per layer: the optimizer's
// whole Muon update of one Qwen2.5-7B layer unit (split master and fp32
// momentum, as `train --optimizer muon` on the CUDA engine), with NS5 called
// one matrix at a time, pipelined over the lanes (the engine's form), and
// with a stand-in that returns O = 0 at once (the host's share alone).
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
#include "core/thread_pool.h"
#include "cuda/check.h"
#include "engine/backend.h"
#include "engine/cuda/muon_gpu.h"
#include "model/spec.h"
#include "optim/unit_update.h"
#include "state/host_state.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The pipelined form with no NS5: O = 0 at once (the host's share of the update alone).
struct ZeroLanes final : rt::Orthogonalizer {
  std::vector<float> in[2];
  std::vector<uint16_t> zeros;
  void orthogonalize(const float*, float* o, int64_t rows, int64_t cols) override {
    std::fill(o, o + rows * cols, 0.0f);
  }
  int lanes() const override { return 2; }
  float* input(int lane, int64_t n) override {
    in[lane].resize(static_cast<size_t>(n));
    if (zeros.size() < static_cast<size_t>(n)) zeros.assign(static_cast<size_t>(n), 0);
    return in[lane].data();
  }
  void submit(int, int64_t, int64_t) override {}
  const uint16_t* result(int) override { return zeros.data(); }
};

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
    constexpr int kLayers = 28;
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
    std::printf("%s\n", orth.describe().c_str());
    std::printf(
        "NS5 on the GPU, %d repeats each (medians): steps = the five steps alone on the device; job = the lane's "
        "whole device job (U in fp32 + norm + division | steps | O out bf16, by its events); call = "
        "orthogonalize(), synchronous, with the host's copies\n",
        repeats);
    double layer_flop = 0, layer_dev_s = 0, layer_job_s = 0, layer_call_s = 0;
    for (const Shape& s : shapes) {
      const int64_t n = s.R * s.C, m = std::min(s.R, s.C), l = std::max(s.R, s.C);
      const double flop = 5.0 * (4.0 * m * m * l + 2.0 * m * m * m);
      std::mt19937_64 rng(1);
      std::normal_distribution<float> nd(0.f, 1e-3f);
      std::vector<float> u(static_cast<size_t>(n)), o(u.size());
      for (float& v : u) v = nd(rng);
      // steps only: a normalised bf16 input, five steps in place
      const float scale = 1.0f / (1e-3f * std::sqrt(static_cast<float>(n)));
      std::vector<uint16_t> xb(u.size());
      for (size_t i = 0; i < u.size(); ++i) xb[i] = rt::f32_to_bf16(u[i] * scale);
      // on ns's stream: a pageable cudaMemcpy (legacy stream) may return before its DMA lands, and ns's
      // non-blocking stream would not wait for it
      const auto load = [&] {
        CUDA_CHECK(cudaMemcpyAsync(x.data(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, ns.stream()));
        CUDA_CHECK(cudaStreamSynchronize(ns.stream()));
      };
      load();
      ns.run_device(x.data(), s.R, s.C);  // warm-up (cuBLAS heuristics)
      CUDA_CHECK(cudaStreamSynchronize(ns.stream()));
      std::vector<double> dev, call, job_in, job_steps, job_out;
      for (int r = 0; r < repeats; ++r) {
        load();
        const auto t0 = std::chrono::steady_clock::now();
        ns.run_device(x.data(), s.R, s.C);
        CUDA_CHECK(cudaStreamSynchronize(ns.stream()));
        dev.push_back(seconds_since(t0));
      }
      orth.orthogonalize(u.data(), o.data(), s.R, s.C);  // warm-up
      for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        orth.orthogonalize(u.data(), o.data(), s.R, s.C);
        call.push_back(seconds_since(t0));
        const rt::cuda::NewtonSchulz::Times t = orth.lane(0).last_times();
        job_in.push_back(t.in_ms * 1e-3);
        job_steps.push_back(t.steps_ms * 1e-3);
        job_out.push_back(t.out_ms * 1e-3);
      }
      const double d = median(dev), c = median(call), ji = median(job_in), js = median(job_steps),
                   jo = median(job_out), j = ji + js + jo;
      std::printf(
          "  %-20s %6lld x %-6lld %8.2f GFLOP  steps %7.3f ms %6.1f TFLOP/s | job %7.3f ms (in+norm %.3f, steps "
          "%.3f, out %.3f) %6.1f TFLOP/s | call %7.3f ms %6.1f TFLOP/s\n",
          s.what, (long long)s.R, (long long)s.C, flop / 1e9, d * 1e3, flop / d / 1e12, j * 1e3, ji * 1e3, js * 1e3,
          jo * 1e3, flop / j / 1e12, c * 1e3, flop / c / 1e12);
      layer_flop += s.count * flop;
      layer_dev_s += s.count * d;
      layer_job_s += s.count * j;
      layer_call_s += s.count * c;
    }
    std::printf(
        "one Qwen2.5-7B layer (7 matrices): %.1f GFLOP; steps %.1f ms (%.1f TFLOP/s), jobs %.1f ms, calls %.1f ms\n",
        layer_flop / 1e9, layer_dev_s * 1e3, layer_flop / layer_dev_s / 1e12, layer_job_s * 1e3, layer_call_s * 1e3);

    // The optimizer's whole update of one layer unit, as the engine calls it (split master, fp32 momentum)
    rt::ModelSpec spec = rt::spec_preset("qwen2.5-7b");
    spec.n_layers = 1;
    spec.vocab = 4096;  // the layer is what is timed; a small embedding and head
    spec.bos_id = -1;
    spec.eos_ids.clear();
    rt::HostState st(spec, false, rt::MomentStorage::fp32, rt::MasterStorage::split, rt::UpdateRule::muon);
    st.init_random(5);
    rt::StateUnit& unit = st.units()[1];
    std::vector<float> g(static_cast<size_t>(unit.numel));
    rt::parallel_for(unit.numel, 1 << 16, [&](int64_t i0, int64_t i1) {
      std::mt19937_64 r(static_cast<uint64_t>(i0));
      std::normal_distribution<float> nd(0.f, 1e-4f);
      for (int64_t i = i0; i < i1; ++i) g[static_cast<size_t>(i)] = nd(r);
    });
    ZeroLanes zero;
    struct Mode {
      const char* what;
      rt::Orthogonalizer* o;
      bool pipelined;
    };
    const Mode modes[] = {{"NS5 one matrix at a time", &orth, false},
                          {"NS5 pipelined over 2 lanes (the engine)", &orth, true},
                          {"no NS5 (O = 0 at once: the host's share)", &zero, true}};
    std::printf("one layer unit's whole Muon update (%lld params, %d threads; split master, fp32 momentum):\n",
                (long long)unit.numel, rt::global_pool().size());
    double piped_s = 0;
    for (const Mode& md : modes) {
      orth.set_pipelined(md.pipelined);
      rt::OptimStep o;
      o.lr = 1e-5;
      o.weight_decay = 0.1;
      o.orthogonalizer = md.o;
      std::vector<double> ts;
      for (int r = 0; r <= repeats; ++r) {  // the first is a warm-up (scratch, page faults)
        o.t = r + 1;
        const auto t0 = std::chrono::steady_clock::now();
        rt::update_unit(unit, g.data(), o, 1.0f, unit.shadow(0));
        if (r > 0) ts.push_back(seconds_since(t0));
      }
      const double t = median(ts);
      if (md.o == &orth && md.pipelined) piped_s = t;
      std::printf("  %-44s %8.1f ms per layer, x %d layers: %.2f s of the optimizer thread per step\n", md.what,
                  t * 1e3, kLayers, t * kLayers);
    }
    orth.set_pipelined(true);
    std::printf(
        "per step (%d layers): NS5 %.0f TFLOP, %.3f s of device time in the steps alone (%.3f s as whole jobs: "
        "+ U in, norm, O out); the optimizer thread's Muon layers %.2f s pipelined\n",
        kLayers, kLayers * layer_flop / 1e12, kLayers * layer_dev_s, kLayers * layer_job_s, kLayers * piped_s);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
