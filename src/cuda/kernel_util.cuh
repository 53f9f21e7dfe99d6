// Device-side helpers shared by the .cu files of the CUDA backend (internal:
// not part of the ops.h contract). Reductions here combine in a fixed order,
// so results do not depend on scheduling.
#pragma once
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace rt::cuda::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks of a grid-stride loop over n items (at most 65536: the loop covers the rest).
inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>(ceil_div(n, threads), 65536));
}
// Blocks of a kernel with one item per thread (or warp): every item gets one.
inline unsigned blocks_each(int64_t n, int per_block) { return static_cast<unsigned>(ceil_div(n, per_block)); }

inline void check_aligned(const void* p, const char* what) {
  RT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "[cuda ops] ", what,
           " must be 16-byte aligned (cudaMalloc'd base plus offsets of whole 8-element bf16 groups)");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets
// the result. `shared` holds >= 32 floats. Contains __syncthreads.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < nwarps ? shared[lane] : 0.f;
  return warp_sum(t);
}

// 8 bf16 <-> 8 floats through one 16-byte access.
struct alignas(16) bf16x8 {
  __nv_bfloat162 h[4];
};
__device__ __forceinline__ void bf16x8_to_float(const bf16x8& v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(v.h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ bf16x8 float_to_bf16x8(const float* f) {
  bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

}  // namespace rt::cuda::detail
