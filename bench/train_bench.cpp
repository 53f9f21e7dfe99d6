// ramtrain_bench: throughput of the CUDA engine on random-init models of real
// shapes (a command, not a test). For each mode (streaming, resident) it runs
// warm-up steps, then timed steps, and prints tokens/s, model TFLOP/s and MFU
// against a bf16 GEMM peak measured in the same run, copy rates, GPU idle
// time, peak device memory, host bytes per parameter and the CPU optimizer's
// rate.
//
// Model FLOPs per token (stated in the output; engine/step_model.h
// model_flops_per_token, the one count plan and the bench share): 6 * N_matmul
// + 6 * L * H * D * T where N_matmul = every parameter that takes part in a
// token's matrix products (the decoder layers -- for MoE models the router and
// the top-k experts a token uses, the active parameters -- and the LM head;
// the embedding lookup is not counted) and the attention term is the causal
// half of 12 * L * H * D * T. Recompute is not counted (model FLOPs, not
// hardware FLOPs: the engine's start line prints their ratio). Only real
// tokens are counted.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda/check.h"
#include "cuda/device_memory.h"
#include "cuda/ops.h"
#include "engine/backend.h"
#include "engine/step_model.h"
#include "model/spec.h"
#include "state/host_state.h"

namespace {

double gemm_peak_tflops() {
  using namespace rt::cuda;
  const int64_t n = 8192;
  DeviceAllocator a(3ull * n * n * 4 + (64 << 20));
  DevBuf<bf16> A(a, n * n, "bench A"), B(a, n * n, "bench B"), C(a, n * n, "bench C");
  std::vector<uint16_t> h(static_cast<size_t>(n * n));
  std::mt19937 g(1);
  for (auto& x : h) x = static_cast<uint16_t>(0x3c00 + (g() & 0x3ff));  // random bf16 in [0.0078, 0.0156)
  CUDA_CHECK(cudaMemcpy(A.data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(B.data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  Blas blas;
  Stream s;
  Event e0(true), e1(true);
  for (int i = 0; i < 3; ++i) blas.matmul_nt(C.data(), DType::bf16, A.data(), B.data(), n, n, n, 0.f, s.get());
  const int reps = 10;
  CUDA_CHECK(cudaEventRecord(e0.get(), s.get()));
  for (int i = 0; i < reps; ++i) blas.matmul_nt(C.data(), DType::bf16, A.data(), B.data(), n, n, n, 0.f, s.get());
  CUDA_CHECK(cudaEventRecord(e1.get(), s.get()));
  CUDA_CHECK(cudaEventSynchronize(e1.get()));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
  return 2.0 * n * n * n * reps / (ms * 1e-3) / 1e12;
}

// The process's resident and peak resident host memory (/proc/self/status
// VmRSS, VmHWM; pinned buffers count once touched), in bytes; 0 where unknown.
std::pair<uint64_t, uint64_t> host_rss() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return {0, 0};
  char line[256];
  uint64_t rss = 0, hwm = 0;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long kb = 0;
    if (std::sscanf(line, "VmRSS: %llu kB", &kb) == 1) rss = kb << 10;
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) hwm = kb << 10;
  }
  std::fclose(f);
  return {rss, hwm};
}

struct Args {
  std::string preset = "qwen2.5-7b";
  int64_t seq = 2048, batch = 4, accum = 1, steps = 4, warmup = 2, layers = 0, slots = 3;
  std::string modes = "streaming,resident";
  uint64_t max_gpu = 0;
  std::string trace;
  std::string grads = "auto", checkpoints = "auto", layer_major = "auto";
  std::string master = "auto";  // --master auto|fp32|split (host storage of the fp32 master)
  bool low_memory = false;
  int64_t landing_mib = -1;  // -1: the engine's default
  int64_t keep = -1;         // --keep-activations: -1 auto
  int64_t keep_attn = -1;    // --keep-attention: -1 auto
  int64_t mlp_chunk = -1;    // --mlp-chunk-tokens: -1 auto, 0 off, N tokens
  rt::MatmulMode matmul = rt::MatmulMode::bf16;  // --matmul bf16|fp8 and --fp8-scaling block|tensor (as ramtrain train)
  bool fp8_tensor = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto v = [&]() -> std::string {
      if (i + 1 >= argc) rt::fail("[bench] ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--preset")
      a.preset = v();
    else if (k == "--seq-len")
      a.seq = std::stoll(v());
    else if (k == "--micro-batch")
      a.batch = std::stoll(v());
    else if (k == "--grad-accum")
      a.accum = std::stoll(v());
    else if (k == "--steps")
      a.steps = std::stoll(v());
    else if (k == "--warmup")
      a.warmup = std::stoll(v());
    else if (k == "--layers")
      a.layers = std::stoll(v());
    else if (k == "--slots")
      a.slots = std::stoll(v());
    else if (k == "--modes")
      a.modes = v();
    else if (k == "--max-gpu-memory")
      a.max_gpu = std::stoull(v()) << 30;
    else if (k == "--trace")
      a.trace = v();
    else if (k == "--grads")
      a.grads = v();
    else if (k == "--checkpoints")
      a.checkpoints = v();
    else if (k == "--layer-major")
      a.layer_major = v();
    else if (k == "--master")
      a.master = v();
    else if (k == "--low-memory")
      a.low_memory = true;
    else if (k == "--matmul") {
      const std::string x = v();
      if (x != "bf16" && x != "fp8") rt::fail("[bench] --matmul must be bf16 or fp8, got ", x);
      a.matmul = x == "bf16" ? rt::MatmulMode::bf16 : a.fp8_tensor ? rt::MatmulMode::fp8_tensor : rt::MatmulMode::fp8;
    } else if (k == "--fp8-scaling") {
      const std::string x = v();
      if (x != "block" && x != "tensor") rt::fail("[bench] --fp8-scaling must be block or tensor, got ", x);
      a.fp8_tensor = x == "tensor";
      if (rt::matmul_is_fp8(a.matmul)) a.matmul = a.fp8_tensor ? rt::MatmulMode::fp8_tensor : rt::MatmulMode::fp8;
    }
    else if (k == "--threads")
      rt::set_global_threads(static_cast<int>(std::stoll(v())));  // the CPU optimizer's pool (0: all cores)
    else if (k == "--landing-chunk-mib")
      a.landing_mib = std::stoll(v());
    else if (k == "--mlp-chunk-tokens") {
      const std::string x = v();
      a.mlp_chunk = x == "auto" ? -1 : std::stoll(x);
      if (a.mlp_chunk < 0) rt::fail("[bench] --mlp-chunk-tokens must be auto, 0 (off) or a token count > 0, got ", x);
    } else if (k == "--keep-activations") {
      const std::string x = v();
      a.keep = x == "auto" ? -1 : std::stoll(x);
    } else if (k == "--keep-attention") {
      const std::string x = v();
      a.keep_attn = x == "auto" ? -1 : std::stoll(x);
    } else if (k == "--help") {
      std::puts(
          "ramtrain_bench [--preset qwen2.5-7b] [--seq-len 2048] [--micro-batch 4] [--grad-accum 1]\n"
          "               [--steps 4] [--warmup 2]\n"
          "               [--layers N (override depth)] [--slots 3]\n"
          "               [--modes streaming,resident (also: delayed, resident-delayed = delayed update)]\n"
          "               [--max-gpu-memory GiB] [--trace FILE.json] [--grads auto|device|host|fold] [--threads N]\n"
          "               [--checkpoints auto|device|host] [--low-memory (as ramtrain train --low-memory)]\n"
          "               [--master auto|fp32|split (host storage of the fp32 master, as ramtrain train)]\n"
          "               [--matmul bf16|fp8 (the projections' GEMMs, as ramtrain train; fp8: sm_90)]\n"
          "               [--fp8-scaling block|tensor (with --matmul fp8, as ramtrain train; tensor: sm_89+)]\n"
          "               [--landing-chunk-mib N (device gradients: optimizer copy-out chunk, 0 = whole units)]\n"
          "               [--keep-activations auto|N (layers not recomputed in the backward; every mode)]\n"
          "               [--keep-attention auto|N (layers keeping their attention half: selective recompute)]\n"
          "               [--mlp-chunk-tokens auto|0|N (MLP over chunks of N tokens; auto: the fit's last step)]\n"
          "               [--layer-major auto|on|off (grad-accum > 1: each layer's weights once per step for\n"
          "                every micro-batch; auto: on when the weights stream and the embedding is untied)]\n"
          "A mode may end in :N to set the landing chunk for that mode only (e.g. streaming:0,streaming:16).");
      std::exit(0);
    } else
      rt::fail("[bench] unknown option ", k);
  }
  if (a.fp8_tensor && a.matmul == rt::MatmulMode::bf16)
    rt::fail("[bench] --fp8-scaling applies to --matmul fp8 only; add --matmul fp8 or drop --fp8-scaling");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a = parse(argc, argv);
  if (a.batch < 1 || a.seq < 1 || a.accum < 1 || a.steps < 1 || a.warmup < 0)
    rt::fail("[bench] --micro-batch, --seq-len, --grad-accum and --steps must be >= 1, --warmup >= 0");
  rt::ModelSpec spec = rt::spec_preset(a.preset);
  if (a.layers > 0) spec.n_layers = a.layers;
  const double peak = gemm_peak_tflops();
  std::printf("bf16 GEMM peak (8192^3, cuBLASLt, this run): %.1f TFLOP/s\n", peak);
  const int64_t L = spec.n_layers, Tq = a.seq;
  const double n_matmul = static_cast<double>(spec.active_params_per_layer() * L + spec.vocab * spec.hidden);
  const double flops_tok = rt::model_flops_per_token(spec, Tq);
  std::printf(
      "model %s%s: %.3fB params (%.3fB in a token's matmuls), %lld layers; %lld micro-batch%s of %lld x %lld tokens "
      "per step\n",
      a.preset.c_str(), a.layers ? " (depth overridden)" : "", spec.params_total() / 1e9, n_matmul / 1e9, (long long)L,
      (long long)a.accum, a.accum == 1 ? "" : "es", (long long)a.batch, (long long)a.seq);
  std::printf("FLOPs/token = 6*N_matmul + 6*L*H*D*T (causal attention) = %.1f GFLOP\n", flops_tok / 1e9);
  auto t0 = std::chrono::steady_clock::now();
  if (a.low_memory) a.grads = a.checkpoints = "host";
  // without gradients: the engine adds them when its plan sends gradients to the
  // host, after it has chosen the master storage (split needs less host RAM)
  rt::HostState st(spec, false);
  st.init_random(0);
  std::printf(
      "host state: %.1f GiB (%.2f B/param fp32 master + AdamW m, v, before the engine's master storage and "
      "gradients), init %.1f s\n",
      st.bytes_total() / double(1ull << 30), st.bytes_per_param(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  {
    const double n = static_cast<double>(st.n_params());
    std::printf(
        "host plans (B/param incl. pinned bf16 shadows): fp32 %.3f, split %.3f; delayed update fp32 %.3f, "
        "split %.3f; + host fp32 gradients: fp32 %.3f, split %.3f\n",
        rt::HostState::planned_bytes(spec, rt::MasterStorage::fp32, 1, false) / n,
        rt::HostState::planned_bytes(spec, rt::MasterStorage::split, 1, false) / n,
        rt::HostState::planned_bytes(spec, rt::MasterStorage::fp32, 2, false) / n,
        rt::HostState::planned_bytes(spec, rt::MasterStorage::split, 2, false) / n,
        rt::HostState::planned_bytes(spec, rt::MasterStorage::fp32, 1, true) / n,
        rt::HostState::planned_bytes(spec, rt::MasterStorage::split, 1, true) / n);
  }
  std::mt19937_64 g(1);
  std::vector<rt::Batch> batches(static_cast<size_t>(a.accum));  // one step: a.accum micro-batches of random ids
  for (rt::Batch& b : batches) {
    b.B = a.batch;
    b.T = a.seq;
    for (int64_t i = 0; i < a.batch * a.seq; ++i) {
      b.inputs.push_back(static_cast<int32_t>(g() % static_cast<uint64_t>(spec.vocab)));
      b.targets.push_back(static_cast<int32_t>(g() % static_cast<uint64_t>(spec.vocab)));
    }
  }
  const int64_t tokens = a.accum * a.batch * a.seq;
  std::printf("\n%-10s %9s %10s %9s %7s %9s %9s %9s %10s %12s\n", "mode", "step s", "tokens/s", "TFLOP/s", "MFU",
              "H2D GB/s", "D2H GB/s", "GPU idle", "peak GiB", "opt Gparam/s");
  size_t pos = 0;
  while (pos <= a.modes.size()) {
    size_t e = a.modes.find(',', pos);
    if (e == std::string::npos) e = a.modes.size();
    std::string mode = a.modes.substr(pos, e - pos);
    pos = e + 1;
    if (mode.empty()) continue;
    rt::CudaOptions co;
    // MODE:N sets the optimizer's gradient landing chunk to N MiB (0: whole units)
    if (size_t c = mode.find(':'); c != std::string::npos)
      co.landing_chunk_bytes = std::stoull(mode.substr(c + 1)) << 20;
    else if (a.landing_mib >= 0)
      co.landing_chunk_bytes = static_cast<uint64_t>(a.landing_mib) << 20;
    co.resident = mode.rfind("resident", 0) == 0;
    co.delayed_update = mode.find("delayed") != std::string::npos;
    co.slots = static_cast<int>(a.slots);
    co.max_gpu_memory = a.max_gpu;
    co.grads = a.grads;
    co.checkpoints = a.checkpoints;
    co.layer_major = a.layer_major;
    co.micro_batches = a.accum;
    co.master = a.master;
    co.keep_activations = a.keep;
    co.keep_attention = a.keep_attn;
    co.mlp_chunk_tokens = a.mlp_chunk;
    co.matmul = a.matmul;
    if (a.low_memory) rt::set_low_memory(co);
    co.fit = !co.resident;  // the resident baseline is that plan or nothing (skipped below)
    co.verbose = true;
    std::string tag = mode;
    std::replace(tag.begin(), tag.end(), ':', '_');
    co.trace_path = a.trace.empty() ? std::string("/tmp/ramtrain_bench_trace.json") : a.trace + "." + tag + ".json";
    std::unique_ptr<rt::Backend> be;
    try {
      be = rt::make_cuda_backend(st, a.batch, a.seq, co);
    } catch (const rt::Error& err) {
      std::printf("%-10s skipped: %s\n", mode.c_str(), err.what());
      continue;
    }
    rt::OptimStep o;
    o.lr = 1e-5;
    o.hyper.beta2 = 0.95;
    std::vector<double> times;
    rt::EngineStats es;
    for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
      o.t = s + 1;
      auto ts = std::chrono::steady_clock::now();
      rt::StepStats r = be->train_step(batches, tokens, o);
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      if (s >= a.warmup) times.push_back(dt);
      es = be->stats();
      std::printf("  %s step %lld: %.3f s, loss %.4f, grad norm %.3f, compute busy %.3f s, optimizer %.3f s\n",
                  mode.c_str(), (long long)s + 1, dt, r.loss_sum / r.n_valid, r.grad_norm, es.compute_busy_seconds,
                  es.optimizer_seconds);
      std::fflush(stdout);
    }
    be->sync();
    es = be->stats();
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double tflops = flops_tok * tokens / t / 1e12;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    std::printf("%-10s %9.3f %10.0f %9.1f %6.1f%% %9.1f %9.1f %8.1f%% %10.2f %12.2f\n", mode.c_str(), t, tokens / t,
                tflops, 100 * tflops / peak, es.h2d_bytes / t / 1e9, es.d2h_bytes / t / 1e9,
                es.compute_busy_seconds >= 0 ? 100 * (1 - es.compute_busy_seconds / t) : -1.0,
                es.device_peak_bytes / double(1ull << 30),
                es.optimizer_seconds > 0 ? es.optimizer_params / es.optimizer_seconds / 1e9 : 0.0);
    const auto [rss, hwm] = host_rss();
    std::printf("%-10s host memory: RSS %.1f GiB (%.2f B/param), peak RSS %.1f GiB (%.2f B/param)\n", mode.c_str(),
                rss / double(1ull << 30), rss / double(spec.params_total()), hwm / double(1ull << 30),
                hwm / double(spec.params_total()));
    std::printf(
        "%-10s device memory in use by the process after the run (cudaMemGetInfo: engine buffers, CUDA "
        "context, cuBLAS workspaces): %.2f GiB\n",
        mode.c_str(), (total_b - free_b) / double(1ull << 30));
    std::fflush(stdout);
  }
  std::printf(
      "\n(step s: median of %lld timed steps after %lld warm-up; GPU idle: 1 - compute-stream busy / step time; "
      "peak GiB: engine allocations; opt Gparam/s: CPU AdamW incl. bf16 shadow write, %d threads)\n",
      (long long)a.steps, (long long)a.warmup, rt::global_pool().size());
  return 0;
} catch (const rt::Error& e) {
  std::fprintf(stderr, "ramtrain_bench: error: %s\n", e.what());
  return 1;
}
