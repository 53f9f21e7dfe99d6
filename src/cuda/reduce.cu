// Deterministic reductions for the streaming engine (gradient norms).
#include "cuda/cuda_ops.h"
#include "cuda/check.h"

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

}  // namespace rt::cuda
