// See newton_schulz.h.
#include "cuda/newton_schulz.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "cuda/check.h"

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

}  // namespace

NewtonSchulz::NewtonSchulz(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small, float a, float b, float c,
                           int steps)
    : max_numel_(max_numel),
      max_small_(max_small),
      a_coef_(a),
      b_coef_(b),
      c_coef_(c),
      steps_(steps),
      x_(alloc, max_numel, "the Muon Newton-Schulz workspace (X)"),
      x2_(alloc, max_numel, "the Muon Newton-Schulz workspace (X copy)"),
      a_(alloc, max_small * max_small, "the Muon Newton-Schulz workspace (A)"),
      b_(alloc, max_small * max_small, "the Muon Newton-Schulz workspace (B)") {
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

void NewtonSchulz::run_device(bf16* x, int64_t R, int64_t C) {
  const int64_t s = std::min(R, C), n = R * C;
  RT_CHECK(R >= 1 && C >= 1 && n <= max_numel_ && s <= max_small_ && R <= INT_MAX && C <= INT_MAX,
           "[cuda muon] matrix ", R, " x ", C, " does not fit the Newton-Schulz workspace (", max_numel_,
           " elements, smaller side ", max_small_, ")");
  cudaStream_t st = stream_.get();
  bf16* cur = x;
  bf16* other = x == x2_.data() ? x_.data() : x2_.data();
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
  if (cur != x) CUDA_CHECK(cudaMemcpyAsync(x, cur, xbytes, cudaMemcpyDeviceToDevice, st));
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

}  // namespace rt::cuda
