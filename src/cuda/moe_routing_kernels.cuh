// The MoE routing kernels (cuda/moe.cu's only include of this file: its
// anonymous namespace keeps them private to that translation unit):
// softmax over the router logits, top-k per token, the per-expert counts,
// their scan into offsets, the permutation by expert, and the per-expert
// probability sums of the load-balancing loss. Deterministic: one thread per
// row or a fixed tree, ties to the lower expert.
#pragma once
#include <cstdint>

#include "cuda/kernel_util.cuh"

namespace rt::cuda {
namespace {

constexpr int kMaxK = 32;  // experts per token the routing kernels hold in registers

// p[N,E]: logits in, row softmax out (max subtracted, fp32), one thread per row.
__global__ void softmax_rows_kernel(float* p, int64_t N, int64_t E) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float* r = p + n * E;
  float mx = r[0];
  for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, r[e]);
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) {
    const float v = expf(r[e] - mx);
    r[e] = v;
    sum += v;
  }
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < E; ++e) r[e] *= inv;
}

// idx/w [N,K]: each row's K largest probabilities (ties: lower index), as
// moe_topk; topk_softmax (gpt-oss): p holds logits and w is the softmax of the
// K selected. One warp per row: lane l holds the row's entries l, l + 32, ...
// (E <= kMaxTopkE), and each of the K rounds takes the warp's arg-max of the
// entries not yet taken (the larger value, on a tie the lower index: the
// CPU's first maximum).
constexpr int64_t kMaxTopkE = 64 * 32;  // the per-lane taken mask's bits x 32 lanes
__global__ void topk_kernel(int32_t* idx, float* w, const float* p, int64_t N, int64_t E, int K, bool norm_topk,
                            bool topk_softmax) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const float* r = p + n * E;
  uint64_t taken = 0;  // bit i: entry lane + 32 i
  int sel[kMaxK];
  float wt[kMaxK];
  for (int j = 0; j < K; ++j) {
    float bv = 0.f;
    int bi = -1;  // -1: none
    int i = 0;
    for (int64_t e = lane; e < E; e += 32, ++i)
      if (!((taken >> i) & 1u) && (bi < 0 || r[e] > bv)) bv = r[e], bi = static_cast<int>(e);
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    sel[j] = bi;
    wt[j] = bv;
    if ((bi & 31) == lane) taken |= uint64_t{1} << (bi >> 5);
  }
  if (lane != 0) return;
  if (topk_softmax) {  // wt[0] is the largest: the max to subtract
    float z = 0.f;
    for (int j = 0; j < K; ++j) z += (wt[j] = expf(wt[j] - r[sel[0]]));
    const float inv = 1.f / z;
    for (int j = 0; j < K; ++j) {
      idx[n * K + j] = sel[j];
      w[n * K + j] = wt[j] * inv;
    }
    return;
  }
  float sum = 0.f;
  if (norm_topk)
    for (int j = 0; j < K; ++j) sum += wt[j];
  for (int j = 0; j < K; ++j) {
    idx[n * K + j] = sel[j];
    w[n * K + j] = norm_topk ? wt[j] / sum : wt[j];
  }
}

// counts[1 + e] = slots routed to expert e; one block per expert.
__global__ void count_kernel(int32_t* offsets, const int32_t* idx, int64_t NK) {
  const int e = blockIdx.x;
  int total = 0;
  for (int64_t start = 0; start < NK; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    total += __syncthreads_count(i < NK && idx[i] == e);
  }
  if (threadIdx.x == 0) offsets[e + 1] = total;
}

// offsets[0..E]: exclusive prefix of the counts; starts[0..E] (null: not
// made): the same with each count rounded up to a multiple of chunk rows (the
// padded layout's expert starts; starts[E] its rows). E is small: one thread.
__global__ void scan_kernel(int32_t* offsets, int32_t* starts, int64_t E, int chunk) {
  offsets[0] = 0;
  if (starts) starts[0] = 0;
  for (int64_t e = 1; e <= E; ++e) {
    if (starts) starts[e] = starts[e - 1] + (offsets[e] + chunk - 1) / chunk * chunk;
    offsets[e] += offsets[e - 1];
  }
}

// dst[i] = src[i] for i < n, dst in mapped pinned host memory: the device's
// stores cross PCIe as writes of their own, beside whatever the copy
// engines are busy with (a cudaMemcpyAsync of these few bytes would wait for
// the gradient landing's copy ahead of it, tens of milliseconds).
__global__ void publish_kernel(int32_t* dst, const int32_t* src, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// perm[starts[e] + k] = the k-th slot (in increasing slot order) routed to e;
// row_of is its inverse. One block per expert; blockDim a multiple of 32. The
// padding rows' perm stays as it was (the caller's -1).
__global__ void permute_kernel(int32_t* perm, int32_t* row_of, const int32_t* idx, const int32_t* starts, int64_t NK) {
  __shared__ int warp_total[32];
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int base = starts[e];
  for (int64_t start = 0; start < NK; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    const bool mine = i < NK && idx[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, tile = 0;
    for (int k = 0; k < nwarps; ++k) {
      if (k < warp) before += warp_total[k];
      tile += warp_total[k];
    }
    if (mine) {
      const int pos = base + before + __popc(ballot & ((1u << lane) - 1u));
      perm[pos] = static_cast<int32_t>(i);
      row_of[i] = pos;
    }
    base += tile;
    __syncthreads();
  }
}

// psum[e] += sum over n of p[n, e] (of softmax(p[n, :])[e] when p holds
// logits: gpt-oss), the sum in double; one block of 256 per expert, fixed tree.
__global__ void prob_sum_kernel(double* psum, const float* p, int64_t N, int64_t E, bool logits) {
  __shared__ double part[256];
  const int e = blockIdx.x;
  double s = 0;
  for (int64_t n = threadIdx.x; n < N; n += 256) {
    const float* r = p + n * E;
    if (!logits) {
      s += static_cast<double>(r[e]);
      continue;
    }
    float mx = r[0], z = 0.f;
    for (int64_t i = 1; i < E; ++i) mx = fmaxf(mx, r[i]);
    for (int64_t i = 0; i < E; ++i) z += expf(r[i] - mx);
    s += static_cast<double>(expf(r[e] - mx) / z);
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int h = 128; h > 0; h >>= 1) {
    if (threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) psum[e] += part[0];
}

}  // namespace
}  // namespace rt::cuda
