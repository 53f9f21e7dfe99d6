// Deterministic reductions for the streaming engine (gradient norms), and
// the sum of squares in rt::sum_squares's exact order (cuda/sum_squares_order.h).
#include "cuda/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/sum_squares_order.h"

namespace rt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 1 << 16;  // elements per block: fixed, so the result never depends on the grid

__global__ void sumsq_partial(double* part, const float* x, int64_t n) {
  __shared__ double sh[kThreads];
  const int64_t b = blockIdx.x * kChunk, e = min(b + kChunk, n);
  double s = 0;
  for (int64_t i = b + threadIdx.x; i < e; i += kThreads) {
    double v = x[i];
    s += v * v;
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void sum_in_order(double* out, const double* part, int64_t n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += part[i];
    *out = s;
  }
}

// rt::sum_squares's exact order (cuda/sum_squares_order.h): its blocks and lanes.
constexpr int64_t kSqBlock = kSumSquaresBlock;
constexpr int kSqLanes = kSumSquaresLanes;
constexpr int kSqThreads = 256;  // 16 blocks x 16 lanes per CUDA block

// partial[b] = sum over lanes j in order of (sum over i = j mod 16 in block b, in index order, of u[i]^2)
__global__ void sum_squares_blocks(const float* __restrict__ u, int64_t n, int64_t nblocks, double* partial) {
  __shared__ double acc[kSqThreads];
  const int t = threadIdx.x, lane = t % kSqLanes;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (kSqThreads / kSqLanes) + t / kSqLanes;
  double s = 0;
  if (b < nblocks) {
    const int64_t e = min(n, (b + 1) * kSqBlock);
#pragma unroll 8  // loads ahead; the adds stay in index order
    for (int64_t i = b * kSqBlock + lane; i < e; i += kSqLanes) {
      const double x = u[i];
      s += x * x;
    }
  }
  acc[t] = s;
  __syncthreads();
  if (lane == 0 && b < nblocks) {
    double c = 0;
    for (int j = 0; j < kSqLanes; ++j) c += acc[t + j];
    partial[b] = c;
  }
}

// out[0] = the blocks' sums added in order; out[1] = fp32(sqrt(out[0]) + eps) (held as a double).
// One CUDA block: the sums come into shared memory a chunk at a time (all
// threads), thread 0 adds them in order.
constexpr int kFinishChunk = 2048;
__global__ void sum_squares_finish(const double* __restrict__ partial, int64_t nblocks, double eps, double* out) {
  __shared__ double chunk[kFinishChunk];
  double s = 0;
  for (int64_t c0 = 0; c0 < nblocks; c0 += kFinishChunk) {
    const int64_t k = min(static_cast<int64_t>(kFinishChunk), nblocks - c0);
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) chunk[i] = partial[c0 + i];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t i = 0; i < k; ++i) s += chunk[i];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out[0] = s;
    out[1] = static_cast<double>(__double2float_rn(sqrt(s) + eps));
  }
}

}  // namespace

size_t sum_squares_scratch_bytes(int64_t n) { return static_cast<size_t>((n + kChunk - 1) / kChunk) * sizeof(double); }

void sum_squares(double* out, const float* x, int64_t n, Scratch scratch, cudaStream_t stream) {
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  RT_CHECK(scratch.bytes >= sum_squares_scratch_bytes(n), "[cuda] sum_squares: scratch too small");
  if (blocks == 0) {
    CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  double* part = static_cast<double*>(scratch.ptr);
  sumsq_partial<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(part, x, n);
  CUDA_CHECK_LAUNCH();
  sum_in_order<<<1, 32, 0, stream>>>(out, part, blocks);
  CUDA_CHECK_LAUNCH();
}

void sum_squares_ordered(double* out, const float* x, int64_t n, double* partial, double eps, cudaStream_t stream) {
  RT_CHECK(n >= 0, "[cuda] sum_squares_ordered: n = ", n, " is negative");
  const int64_t nb = (n + kSqBlock - 1) / kSqBlock;
  const int per_block = kSqThreads / kSqLanes;
  const auto grid = static_cast<unsigned>((nb + per_block - 1) / per_block);
  if (grid > 0) {
    sum_squares_blocks<<<grid, kSqThreads, 0, stream>>>(x, n, nb, partial);
    CUDA_CHECK(cudaGetLastError());
  }
  sum_squares_finish<<<1, 256, 0, stream>>>(partial, nb, eps, out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace rt::cuda
