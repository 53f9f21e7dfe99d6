// Device primitives both attention kernel sets use (attention.cu: mma.sync,
// sm_80+; attention_sm90.cu: TMA + wgmma, sm_90a). Internal to the CUDA
// backend; include only from those files.
//
// Accumulator fragments: both sets hold a warp's 16-row slice of a 16 x 8N
// fp32 accumulator as the mma.sync m16n8 C layout repeated over n: element
// (j, e), j < N, e < 4, is row lane/4 + 8*(e/2), column 8j + 2*(lane%4) + e%2.
// The mma.sync kernels store it as float[N][4], the wgmma ones (one m64nN
// accumulator per warpgroup) as float[4N]; frag(a, j, e) reads either.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/shape.h"
#include "cuda/check.h"
#include "cuda/ops.h"

namespace rt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x, flushing subnormal results to 0 (they would vanish next to the row's
// sum of at least 1 anyway); one MUFU.EX2, none of exp2f's range fix-up.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---- accumulator fragments (layout above)
template <class A>
struct Frag;
template <int N>
struct Frag<float[N][4]> {
  static constexpr int n = N;  // 8-column groups
  __device__ static float& at(float(&a)[N][4], int j, int e) { return a[j][e]; }
};
template <int M>
struct Frag<float[M]> {
  static_assert(M % 4 == 0, "a flat fragment holds 4 floats per 8-column group");
  static constexpr int n = M / 4;
  __device__ static float& at(float (&a)[M], int j, int e) { return a[4 * j + e]; }
};
template <class A>
__device__ __forceinline__ float& frag(A& a, int j, int e) {
  return Frag<A>::at(a, j, e);
}
template <class A>
constexpr int frag_n = Frag<A>::n;

template <class A>
__device__ __forceinline__ void frag_zero(A& acc) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j) frag(acc, j, 0) = frag(acc, j, 1) = frag(acc, j, 2) = frag(acc, j, 3) = 0.f;
}

// Accumulators of N 8-column groups (16 x 8N) -> bf16 A fragments of the
// m16n8k16 (and wgmma register-A) layout over k = 8N: the fragment's pairs
// in order, a[k] from groups 2k and 2k + 1.
template <class A>
__device__ __forceinline__ void frag_to_a(uint32_t (&a)[frag_n<A> / 2][4], A& acc) {
#pragma unroll
  for (int k = 0; k < frag_n<A> / 2; ++k) {
    a[k][0] = pack_bf16(frag(acc, 2 * k, 0), frag(acc, 2 * k, 1));
    a[k][1] = pack_bf16(frag(acc, 2 * k, 2), frag(acc, 2 * k, 3));
    a[k][2] = pack_bf16(frag(acc, 2 * k + 1, 0), frag(acc, 2 * k + 1, 1));
    a[k][3] = pack_bf16(frag(acc, 2 * k + 1, 2), frag(acc, 2 * k + 1, 3));
  }
}

// Host: lets `kernel` use `bytes` of dynamic shared memory.
template <class K>
void smem_allow(K kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace rt::cuda::attn
