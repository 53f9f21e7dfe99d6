// Causal masks on accumulator fragments (layout in utils.cuh), shared by both
// attention kernel sets. A fragment covers rows row0 + {0, 8} (row0 =
// first row + lane/4) and columns col0 + 8j + 2*(lane%4) + {0, 1}.
#pragma once
#include "cuda/attention/utils.cuh"

namespace rt::cuda::attn {

// Column of fragment element (j, e) relative to the fragment's first column.
__device__ __forceinline__ int frag_col(int j, int e) { return 8 * j + 2 * (threadIdx.x & 3) + (e & 1); }
// Row of element e relative to the thread's first row (row0).
__device__ __forceinline__ int frag_row(int e) { return 8 * (e >> 1); }

// Scores of queries (rows row0 + ...) against keys (columns k0 + ...): keys
// after the query become -inf.
template <class A>
__device__ __forceinline__ void mask_causal_scores(A& sc, int k0, int row0) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (k0 + frag_col(j, e) > row0 + frag_row(e)) frag(sc, j, e) = -INFINITY;
}

}  // namespace rt::cuda::attn
