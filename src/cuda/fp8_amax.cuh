// The amax keys of FP8 per-tensor scaling (internal to the CUDA backend): what
// the producers that make the amax of what they write use (rms_norm.cu,
// swiglu.cu; Fp8Linear's taps, fp8.h), and the block commit they share with
// the amax pass (fp8_quantize.cu).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/kernel_util.cuh"

namespace rt::cuda::detail {

// FP8 per-tensor scaling's amax key of a bf16 value, as the amax pass
// (cuda/fp8_quantize.cu) makes it from the value as fp32 with fabsf: the bits
// of |v|, i.e. its magnitude bits shifted up 16 (bf16 -> fp32 is a shift),
// and for a NaN the canonical 0x7FFFFFFF that fabsf returned on the H100
// (tests/gpu/fp8_test.cpp checks both ways agree). An unsigned max over keys
// is the float max; a key >= 0x7F800000 marks Inf or NaN (the slot's scale
// then is NaN whatever the key's payload). Integer work only.
__device__ __forceinline__ uint32_t bf16_magnitude_key(uint32_t m) { return m > 0x7F80u ? 0x7FFFFFFFu : m << 16; }
__device__ __forceinline__ uint32_t bf16_amax_key(__nv_bfloat16 v) {
  return bf16_magnitude_key(static_cast<uint32_t>(__bfloat16_as_ushort(v)) & 0x7FFFu);
}
__device__ __forceinline__ uint32_t bf16x8_amax_key(const bf16x8& v) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(&v.h[i]);
    m = max(m, max(w & 0x7FFFu, (w >> 16) & 0x7FFFu));
  }
  return bf16_magnitude_key(m);  // the largest magnitude is a NaN's whenever one is there
}
// The max of every thread's key over the block, then one atomicMax into *out
// (zero keys skip it); the result is the max whatever the order. Every thread
// of the block calls it (it contains __syncthreads, one first so that a kernel
// may call it more than once); blockDim.x a multiple of 32, <= 1024.
__device__ __forceinline__ void block_amax_commit(uint32_t key, uint32_t* out) {
  __shared__ uint32_t red[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xffffffffu, key, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t m = 0;
    for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) m = max(m, red[i]);
    if (m) atomicMax(out, m);
  }
}

}  // namespace rt::cuda::detail
