// See newton_schulz.h.
#include "cuda/newton_schulz.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "cuda/check.h"
#include "cuda/cuda_ops.h"
#include "cuda/newton_schulz_workspace.h"

namespace rt::cuda {

namespace {

// out (column-major [m, n], ld ldc) = alpha op(a) op(b) + beta out, bf16 in and
// out, fp32 accumulation (the same GEMM every call for a shape: deterministic).
void gemm(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          float alpha, const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* out, int64_t ldc) {
  CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
                            CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &beta, out,
                            CUDA_R_16BF, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// x = bf16_rn(u / d), IEEE division (u: fp32 U; d: fp32 held as a double)
__global__ void divide_to_bf16(const float* __restrict__ u, int64_t n, const double* d, bf16* __restrict__ x) {
  const float dv = static_cast<float>(*d);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __float2bfloat16_rn(__fdiv_rn(u[i], dv));
}

int64_t norm_blocks(int64_t n) { return (n + kNewtonSchulzNormBlock - 1) / kNewtonSchulzNormBlock; }

}  // namespace

NewtonSchulz::NewtonSchulz(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small, float a, float b, float c,
                           int steps)
    : max_numel_(max_numel),
      max_small_(max_small),
      a_coef_(a),
      b_coef_(b),
      c_coef_(c),
      steps_(steps),
      u_(alloc, max_numel, "the Muon Newton-Schulz workspace (U in fp32; X's copy)"),
      x_(alloc, max_numel, "the Muon Newton-Schulz workspace (X)"),
      a_(alloc, max_small * max_small, "the Muon Newton-Schulz workspace (A)"),
      b_(alloc, max_small * max_small, "the Muon Newton-Schulz workspace (B)"),
      norm_(alloc, static_cast<int64_t>(newton_schulz_norm_doubles(max_numel)),
            "the Muon Newton-Schulz workspace (norm block sums)"),
      host_sum_(sizeof(double), "the Muon Newton-Schulz norm (host copy)") {
  RT_CHECK(max_numel >= 1 && max_small >= 1 && max_small * max_small <= max_numel * max_numel && steps >= 1,
           "[cuda muon] bad Newton-Schulz workspace: ", max_numel, " elements, smaller side ", max_small, ", ", steps,
           " steps");
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  // split-K partial sums in fp32, never in the bf16 output type
  cublasStatus_t st = cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(h, stream_.get());
  if (st != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);  // the destructor does not run for a throwing constructor
  CUBLAS_CHECK(st);
  h_ = h;
}

NewtonSchulz::~NewtonSchulz() {
  if (h_) {
    cudaStreamSynchronize(stream_.get());
    cublasDestroy(h_);
  }
}

bf16* NewtonSchulz::steps(bf16* x, int64_t R, int64_t C) {
  const int64_t s = std::min(R, C), n = R * C;
  RT_CHECK(R >= 1 && C >= 1 && n <= max_numel_ && s <= max_small_ && R <= INT_MAX && C <= INT_MAX,
           "[cuda muon] matrix ", R, " x ", C, " does not fit the Newton-Schulz workspace (", max_numel_,
           " elements, smaller side ", max_small_, ")");
  cudaStream_t st = stream_.get();
  bf16* x2 = reinterpret_cast<bf16*>(u_.data());  // U is spent once X is made
  bf16* cur = x;
  bf16* other = x == x2 ? x_.data() : x2;
  bf16* A = a_.data();
  bf16* B = b_.data();
  const size_t xbytes = static_cast<size_t>(n) * 2, abytes = static_cast<size_t>(s * s) * 2;
  // The row-major [R, C] buffer is the column-major [C, R] matrix Z^T (ld C).
  for (int k = 0; k < steps_; ++k) {
    if (R <= C)  // X = Z: A = Z Z^T = (Z^T)^T (Z^T)
      gemm(h_, CUBLAS_OP_T, CUBLAS_OP_N, s, s, C, 1.f, cur, C, cur, C, 0.f, A, s);
    else  // X = Z^T: A = Z^T Z = (Z^T) (Z^T)^T
      gemm(h_, CUBLAS_OP_N, CUBLAS_OP_T, s, s, R, 1.f, cur, C, cur, C, 0.f, A, s);
    CUDA_CHECK(cudaMemcpyAsync(B, A, abytes, cudaMemcpyDeviceToDevice, st));
    gemm(h_, CUBLAS_OP_N, CUBLAS_OP_N, s, s, s, c_coef_, A, s, A, s, b_coef_, B, s);  // B = c A A + b A
    CUDA_CHECK(cudaMemcpyAsync(other, cur, xbytes, cudaMemcpyDeviceToDevice, st));
    if (R <= C)  // X' = a X + B X, stored as Z'^T = a Z^T + Z^T B^T
      gemm(h_, CUBLAS_OP_N, CUBLAS_OP_T, C, R, R, 1.f, cur, C, B, s, a_coef_, other, C);
    else  // X = Z^T: X' = a X + B X, X' = Z'^T as stored
      gemm(h_, CUBLAS_OP_N, CUBLAS_OP_N, C, R, C, 1.f, B, s, cur, C, a_coef_, other, C);
    std::swap(cur, other);
  }
  return cur;
}

void NewtonSchulz::run_device(bf16* x, int64_t R, int64_t C) {
  bf16* cur = steps(x, R, C);
  if (cur != x)
    CUDA_CHECK(cudaMemcpyAsync(x, cur, static_cast<size_t>(R * C) * 2, cudaMemcpyDeviceToDevice, stream_.get()));
}

void NewtonSchulz::run(uint16_t* x, int64_t R, int64_t C) {
  RT_CHECK(R >= 1 && C >= 1 && R * C <= max_numel_, "[cuda muon] matrix ", R, " x ", C,
           " does not fit the Newton-Schulz workspace (", max_numel_, " elements)");
  cudaStream_t st = stream_.get();
  const size_t bytes = static_cast<size_t>(R * C) * 2;
  CUDA_CHECK(cudaMemcpyAsync(x_.data(), x, bytes, cudaMemcpyHostToDevice, st));
  run_device(x_.data(), R, C);
  CUDA_CHECK(cudaMemcpyAsync(x, x_.data(), bytes, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
}

void NewtonSchulz::submit(const float* u, uint16_t* o, int64_t R, int64_t C) {
  const int64_t n = R * C;
  RT_CHECK(R >= 1 && C >= 1 && n <= max_numel_ && std::min(R, C) <= max_small_, "[cuda muon] matrix ", R, " x ", C,
           " does not fit the Newton-Schulz workspace (", max_numel_, " elements, smaller side ", max_small_, ")");
  cudaStream_t st = stream_.get();
  const int64_t nb = norm_blocks(n);
  double* norm = norm_.data();
  CUDA_CHECK(cudaEventRecord(ev_start_.get(), st));
  CUDA_CHECK(cudaMemcpyAsync(u_.data(), u, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, st));
  sum_squares_ordered(norm + nb, u_.data(), n, norm, kNewtonSchulzNormEps, st);  // the blocks' sums, then out
  CUDA_CHECK(cudaMemcpyAsync(host_sum_.as<double>(), norm + nb, sizeof(double), cudaMemcpyDeviceToHost, st));
  const int64_t grid = std::min<int64_t>((n + 255) / 256, 8192);
  divide_to_bf16<<<static_cast<unsigned>(grid), 256, 0, st>>>(u_.data(), n, norm + nb + 1, x_.data());
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaEventRecord(ev_normed_.get(), st));
  const bf16* res = steps(x_.data(), R, C);
  CUDA_CHECK(cudaEventRecord(ev_stepped_.get(), st));
  CUDA_CHECK(cudaMemcpyAsync(o, res, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaEventRecord(ev_done_.get(), st));
}

void NewtonSchulz::wait() { CUDA_CHECK(cudaEventSynchronize(ev_done_.get())); }

NewtonSchulz::Times NewtonSchulz::last_times() const {
  Times t{};
  CUDA_CHECK(cudaEventElapsedTime(&t.in_ms, ev_start_.get(), ev_normed_.get()));
  CUDA_CHECK(cudaEventElapsedTime(&t.steps_ms, ev_normed_.get(), ev_stepped_.get()));
  CUDA_CHECK(cudaEventElapsedTime(&t.out_ms, ev_stepped_.get(), ev_done_.get()));
  return t;
}

}  // namespace rt::cuda
