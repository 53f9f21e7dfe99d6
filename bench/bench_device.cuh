// Device buffers and deterministic pseudo-random bf16 fills for the CUDA
// benchmarks (bench/*.cu): a raw cudaMalloc'd buffer freed on scope exit, and
// fill(d, n, seed, amp): n values uniform in [-amp, amp) from a hash of the
// index and the seed (no RNG state, the same values on every run); time_ms,
// the benches' event timing.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/check.h"

namespace rt::bench {

using bf16 = __nv_bfloat16;

inline __global__ void fill_kernel(bf16* p, int64_t n, uint32_t seed, float amp) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  p[i] = __float2bfloat16(amp * (static_cast<float>(h & 0xFFFFFF) / 8388608.f - 1.f));
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Mean milliseconds of f() over `iters` calls on the default stream (CUDA
// events), after `warmup` calls (cuBLAS's heuristics, caches).
template <class F>
double time_ms(F&& f, int iters = 10, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

inline void fill(const Dev& d, int64_t n, uint32_t seed, float amp) {
  fill_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d.as<bf16>(), n, seed, amp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::bench
