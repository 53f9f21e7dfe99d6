// Times rt::cuda::attention_forward / attention_backward (causal, bf16) and
// reports TFLOP/s with causal FLOP counts:
//   fwd = 2 GEMMs * 2*B*H*T*T*D / 2 (half the T x T scores are computed)
//   bwd = 2.5 * fwd (the FlashAttention convention: 5 GEMMs; our deterministic
//         backward actually runs 7, its extra recompute is not credited)
// It also checks that a second backward gives bitwise the same dq, dk, dv
// (exit 2 if not).
// Median of --reps timed calls after --warmup untimed ones, CUDA events.
// Inputs are uniform random (never zeros). With --dump DIR it also writes
// q, k, v, dout, out, lse, dq, dk, dv of the first shape as raw little-endian
// files for bench/attention_sdpa.py --check DIR.
//
// --kernels auto|mma|wgmma[,...] times each kernel set (rt::cuda::
// set_attention_kernels); the first column names it. --dump writes into
// DIR/<kernels>/ then.
//
// --doc-len N packs each sequence with documents of N tokens (the last one
// shorter; doc_start of ops.h): FLOPs are then credited over the visible
// (query, key) pairs only, sum n^2/2 over the documents instead of T^2/2.
// --window W: a sliding window (Gemma 3: --D 256 --window 1024; gpt-oss:
// --D 64 --window 128); FLOPs over the visible pairs, counted exactly.
// --sinks 1: gpt-oss's per-head sink logits (and their gradient).
// --softcap C: Gemma 2's attention-logit soft cap (Gemma 2: --D 256 --softcap
// 50, with --window 4096 on its local layers; 27B: --D 128).
// --kernels masked times the one-warp-per-row fallback for windows, sinks and
// the soft cap (RAMTRAIN_ATTENTION=masked: what those layers ran before the
// fused kernels).
//
// usage: attention_bench [--T 4096] [--H 32] [--G 32] [--D 128 (64, 96, 128, 256)] [--B 1,2]
//                        [--kernels auto] [--reps 20] [--warmup 5] [--dump DIR] [--doc-len 0]
//                        [--window 0] [--sinks 0] [--softcap 0]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/ops.h"

namespace {

using rt::cuda::bf16;

__global__ void fill_uniform(bf16* p, int64_t n, uint32_t seed, float scale) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  float u = (static_cast<float>(x >> 8) + 0.5f) / 16777216.f;  // (0, 1)
  p[i] = __float2bfloat16((2.f * u - 1.f) * scale);
}

bf16* alloc_random(int64_t n, uint32_t seed, float scale) {
  bf16* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * 2));
  fill_uniform<<<static_cast<unsigned>((n + 255) / 256), 256>>>(p, n, seed, scale);
  CUDA_CHECK_LAUNCH();
  return p;
}

template <class F>
double median_ms(F&& f, int warmup, int reps) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    f();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void dump(const std::string& path, const void* dev, size_t bytes) {
  std::vector<char> h(bytes);
  CUDA_CHECK(cudaMemcpy(h.data(), dev, bytes, cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(h.data(), 1, bytes, f) != bytes) rt::fail("[attention_bench] cannot write ", path);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t T = 4096, H = 32, G = 32, D = 128;
  int reps = 20, warmup = 5;
  int64_t doc_len = 0, window = 0;
  bool with_sinks = false;
  float softcap = 0.f;
  std::vector<int64_t> batches = {1, 2};
  std::vector<std::string> kernel_names = {"auto"};
  std::string dump_dir;
  auto split = [](const std::string& v) {
    std::vector<std::string> r;
    for (size_t p = 0; p < v.size();) {
      size_t q = v.find(',', p);
      r.push_back(v.substr(p, q - p));
      p = q == std::string::npos ? v.size() : q + 1;
    }
    return r;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--T")
      T = std::stoll(v);
    else if (a == "--H")
      H = std::stoll(v);
    else if (a == "--G")
      G = std::stoll(v);
    else if (a == "--D")
      D = std::stoll(v);
    else if (a == "--reps")
      reps = std::stoi(v);
    else if (a == "--warmup")
      warmup = std::stoi(v);
    else if (a == "--dump")
      dump_dir = v;
    else if (a == "--doc-len")
      doc_len = std::stoll(v);
    else if (a == "--window")
      window = std::stoll(v);
    else if (a == "--sinks")
      with_sinks = std::stoi(v) != 0;
    else if (a == "--softcap")
      softcap = std::stof(v);
    else if (a == "--kernels")
      kernel_names = split(v);
    else if (a == "--B") {
      batches.clear();
      for (const std::string& b : split(v)) batches.push_back(std::stoll(b));
    } else
      rt::fail("[attention_bench] unknown option ", a);
  }
  if (doc_len < 0 || (doc_len > 0 && !dump_dir.empty()))
    rt::fail("[attention_bench] --doc-len must be >= 0 and cannot go with --dump (attention_sdpa.py has no documents)");
  if (window < 0 || ((window > 0 || with_sinks) && !dump_dir.empty()))
    rt::fail("[attention_bench] --window must be >= 0; --window and --sinks go without --dump (no SDPA reference)");
  if (softcap < 0.f || (softcap > 0.f && !dump_dir.empty()))
    rt::fail("[attention_bench] --softcap must be >= 0 and goes without --dump (no SDPA reference)");
  std::vector<rt::cuda::AttentionKernels> kernel_sets;
  for (const std::string& n : kernel_names) {
    if (n == "auto")
      kernel_sets.push_back(rt::cuda::AttentionKernels::automatic);
    else if (n == "mma")
      kernel_sets.push_back(rt::cuda::AttentionKernels::mma_sync);
    else if (n == "wgmma")
      kernel_sets.push_back(rt::cuda::AttentionKernels::wgmma);
    else if (n == "masked")
      kernel_sets.push_back(rt::cuda::AttentionKernels::masked);
    else
      rt::fail("[attention_bench] --kernels: ", n, " is not auto, mma, wgmma or masked");
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (doc_len > 0)
    std::printf("packed documents of %lld tokens: TFLOP/s over the visible (query, key) pairs\n",
                static_cast<long long>(doc_len));
  if (window > 0)
    std::printf("sliding window of %lld keys: TFLOP/s over the visible (query, key) pairs\n",
                static_cast<long long>(window));
  if (with_sinks) std::printf("with sinks\n");
  if (softcap > 0.f) std::printf("attention-logit soft cap %g\n", static_cast<double>(softcap));
  std::printf("%-8s %-4s %-6s %-4s %-4s %-4s %10s %10s %10s %10s %10s\n", "kernels", "B", "T", "H", "G", "D", "fwd_ms",
              "bwd_ms", "fwd_TF/s", "bwd_TF/s", "fb_TF/s");
  int status = 0;
  for (rt::cuda::AttentionKernels ks : kernel_sets) {
    rt::cuda::set_attention_kernels(ks);
    const char* kname = ks == rt::cuda::AttentionKernels::masked
                            ? "masked"
                            : rt::cuda::attention_kernels_name(rt::cuda::attention_kernels_in_use(D, softcap));
    bool first = true;
    for (int64_t B : batches) {
      const int64_t nq = B * T * H * D, nkv = B * T * G * D;
      bf16* q = alloc_random(nq, 1, 2.f);
      bf16* k = alloc_random(nkv, 2, 1.f);
      bf16* v = alloc_random(nkv, 3, 1.f);
      bf16* dout = alloc_random(nq, 4, 1.f);
      bf16 *out, *dq, *dk, *dv;
      float* lse;
      void* scratch;
      const size_t scratch_bytes = rt::cuda::attention_backward_scratch_bytes(B, T, H);
      CUDA_CHECK(cudaMalloc(&out, nq * 2));
      CUDA_CHECK(cudaMalloc(&dq, nq * 2));
      CUDA_CHECK(cudaMalloc(&dk, nkv * 2));
      CUDA_CHECK(cudaMalloc(&dv, nkv * 2));
      CUDA_CHECK(cudaMalloc(&lse, B * H * T * 4));
      CUDA_CHECK(cudaMalloc(&scratch, scratch_bytes));
      // --doc-len: doc_start [B, T] and the visible (query, key) pairs per head
      int32_t* doc = nullptr;
      double pairs = static_cast<double>(T) * T / 2.0;
      if (doc_len > 0) {
        std::vector<int32_t> h(static_cast<size_t>(B * T));
        pairs = 0;
        for (int64_t t0 = 0; t0 < T; t0 += doc_len) {
          const int64_t n = std::min(doc_len, T - t0);
          pairs += static_cast<double>(n) * n / 2.0;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = t0; t < t0 + n; ++t) h[b * T + t] = static_cast<int32_t>(t0);
        }
        CUDA_CHECK(cudaMalloc(&doc, h.size() * 4));
        CUDA_CHECK(cudaMemcpy(doc, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
      }
      if (window > 0) {  // each row sees t - first + 1 keys, first = max(its document's start, t - window + 1)
        pairs = 0;
        for (int64_t t = 0; t < T; ++t) {
          const int64_t d = doc_len > 0 ? t / doc_len * doc_len : 0;
          pairs += static_cast<double>(t - std::max(d, t - window + 1) + 1);
        }
      }
      bf16* sinks = with_sinks ? alloc_random(H, 5, 2.f) : nullptr;
      float* dsinks = nullptr;
      if (with_sinks) {
        CUDA_CHECK(cudaMalloc(&dsinks, H * 4));
        CUDA_CHECK(cudaMemset(dsinks, 0, H * 4));
      }
      auto fwd = [&] {
        rt::cuda::attention_forward(out, lse, q, k, v, B, T, H, G, D, nullptr, doc, window, sinks, softcap);
      };
      auto bwd = [&] {
        rt::cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, G, D, {scratch, scratch_bytes},
                                     nullptr, doc, window, sinks, dsinks, softcap);
      };
      const double fwd_ms = median_ms(fwd, warmup, reps);
      const double bwd_ms = median_ms(bwd, warmup, reps);
      CUDA_CHECK(cudaDeviceSynchronize());
      // the backward promises determinism: one more run, from poisoned outputs, must be bitwise equal
      std::vector<uint16_t> before(static_cast<size_t>(nq + 2 * nkv)), after(before.size());
      auto grads = [&](std::vector<uint16_t>& h) {
        CUDA_CHECK(cudaMemcpy(h.data(), dq, nq * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(h.data() + nq, dk, nkv * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(h.data() + nq + nkv, dv, nkv * 2, cudaMemcpyDeviceToHost));
      };
      grads(before);
      CUDA_CHECK(cudaMemset(dq, 0xff, nq * 2));
      CUDA_CHECK(cudaMemset(dk, 0xff, nkv * 2));
      CUDA_CHECK(cudaMemset(dv, 0xff, nkv * 2));
      bwd();
      CUDA_CHECK(cudaDeviceSynchronize());
      grads(after);
      const bool same = before == after;
      const double fwd_flop = 4.0 * B * H * pairs * D;
      const double bwd_flop = 2.5 * fwd_flop;
      std::printf("%-8s %-4lld %-6lld %-4lld %-4lld %-4lld %10.3f %10.3f %10.1f %10.1f %10.1f\n", kname,
                  static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
                  static_cast<long long>(G), static_cast<long long>(D), fwd_ms, bwd_ms, fwd_flop / fwd_ms / 1e9,
                  bwd_flop / bwd_ms / 1e9, (fwd_flop + bwd_flop) / (fwd_ms + bwd_ms) / 1e9);
      if (!same) std::printf("NOT DETERMINISTIC: a second backward gave different dq/dk/dv bits\n");
      if (first && !dump_dir.empty()) {
        const std::string dir = dump_dir + "/" + kname;
        std::filesystem::create_directories(dir);
        dump(dir + "/q.bin", q, nq * 2);
        dump(dir + "/k.bin", k, nkv * 2);
        dump(dir + "/v.bin", v, nkv * 2);
        dump(dir + "/dout.bin", dout, nq * 2);
        dump(dir + "/out.bin", out, nq * 2);
        dump(dir + "/lse.bin", lse, B * H * T * 4);
        dump(dir + "/dq.bin", dq, nq * 2);
        dump(dir + "/dk.bin", dk, nkv * 2);
        dump(dir + "/dv.bin", dv, nkv * 2);
        FILE* f = std::fopen((dir + "/shape.txt").c_str(), "w");
        if (!f) rt::fail("[attention_bench] cannot write ", dir, "/shape.txt");
        std::fprintf(f, "%lld %lld %lld %lld %lld\n", static_cast<long long>(B), static_cast<long long>(T),
                     static_cast<long long>(H), static_cast<long long>(G), static_cast<long long>(D));
        std::fclose(f);
      }
      first = false;
      if (!same) status = 2;
      for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(dout),
                      static_cast<void*>(out), static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv),
                      static_cast<void*>(lse), scratch, static_cast<void*>(doc), static_cast<void*>(sinks),
                      static_cast<void*>(dsinks)})
        CUDA_CHECK(cudaFree(p));
    }
  }
  return status;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
