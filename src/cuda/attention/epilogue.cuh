// Epilogue shared by both attention kernel sets: accumulator rows (layout in
// utils.cuh) to bf16 in global memory.
#pragma once
#include "cuda/attention/utils.cuh"

namespace rt::cuda::attn {

// Row r (0: lane/4, 1: lane/4 + 8) of this warp's 16 rows of a 16 x 8N
// accumulator, times scale, as bf16 into the row that starts at p: this
// thread's column pairs 8j + 2 (lane % 4).
template <class A>
__device__ __forceinline__ void store_row(bf16* p, A& acc, int r, float scale) {
  p += 2u * (threadIdx.x & 3u);
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
    *reinterpret_cast<__nv_bfloat162*>(p + 8 * j) =
        __floats2bfloat162_rn(frag(acc, j, 2 * r) * scale, frag(acc, j, 2 * r + 1) * scale);
}

}  // namespace rt::cuda::attn
