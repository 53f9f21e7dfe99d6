// Causal masks on accumulator fragments (layout in utils.cuh), shared by both
// attention kernel sets. A fragment covers rows row0 + {0, 8} (row0 =
// first row + lane/4) and columns col0 + 8j + 2*(lane%4) + {0, 1}.
#pragma once
#include <type_traits>

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

// Packed documents and sliding windows (row_first_key below): row i sees keys from start(i) on.
// Queries as rows: keys k0 + col before the row's start (start[0] for row0,
// start[1] for row0 + 8) become `fill`.
template <class A>
__device__ __forceinline__ void mask_doc_rows(A& sc, int k0, const int (&start)[2], float fill) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (k0 + frag_col(j, e) < start[e >> 1]) frag(sc, j, e) = fill;
}
// Keys as rows (row0 + {0, 8}), queries as columns: start[col] is the start of
// the tile's query column col; keys before it give 0.
template <class A>
__device__ __forceinline__ void mask_doc_cols(A& pt, const int* start, int row0) {
#pragma unroll
  for (int j = 0; j < frag_n<A>; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (row0 + frag_row(e) < start[frag_col(j, e)]) frag(pt, j, e) = 0.f;
}

// Which rows have a first key before which keys are masked: the kernels'
// ROWS template argument. kCausal: none (plain causal); kDocs: packed
// documents (doc_start, see ops.h); kWindow: a sliding window, with or
// without documents. kDocs and kWindow run the DOC code paths; the window has
// its own instances so that the documents' kernels stay as they were.
enum RowStarts : int { kCausal = 0, kDocs = 1, kWindow = 2 };

// Host side: calls f(std::integral_constant<int, ROWS>) for a call's row
// starts: a window (s.window > 0, with or without documents), documents
// alone (doc_start), or neither.
template <class F>
void rows_dispatch(const int32_t* doc_start, const AttnShape& s, F&& f) {
  if (s.window > 0)
    f(std::integral_constant<int, kWindow>{});
  else if (doc_start)
    f(std::integral_constant<int, kDocs>{});
  else
    f(std::integral_constant<int, kCausal>{});
}

// Host side: calls f(std::integral_constant<bool, CAP>{}): the soft-capped
// instances (Gemma 2) when the shape has a cap (AttnShape::cap_k > 0).
template <class F>
void cap_dispatch(const AttnShape& s, F&& f) {
  if (s.cap_k > 0.f)
    f(std::integral_constant<bool, true>{});
  else
    f(std::integral_constant<bool, false>{});
}

// The first key query row t sees: its document's start (doc: the sequence's
// doc_start row; kWindow: nullptr for one document) and, with a window,
// t - window + 1 (window > 0). What the DOC code paths rely on holds for both
// and their max: it is at most t (every row sees its own key) and
// non-decreasing in t (key tiles before a block's first row's start are
// skipped; dK/dV stops at the first row that starts past its keys).
template <int ROWS>
__device__ __forceinline__ int row_first_key(const int32_t* doc, int t, int window) {
  if constexpr (ROWS == kDocs) {
    return doc[t];
  } else {
    const int d = doc ? doc[t] : 0;
    return max(d, t - window + 1);
  }
}

// The first row t in [lo, hi) of a sequence with row_first_key(doc, t,
// window) > key (hi if none): the rows from there on see no key <= key.
template <int ROWS>
__device__ __forceinline__ int doc_rows_end(const int32_t* doc, int window, int lo, int hi, int key) {
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (row_first_key<ROWS>(doc, mid, window) > key)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

}  // namespace rt::cuda::attn
