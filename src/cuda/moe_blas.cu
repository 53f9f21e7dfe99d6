// MoeBlas (cuda/ops.h): the cuBLAS handle, event and pinned staging the MoE
// expert GEMMs run through, its mode (RAMTRAIN_MOE_GEMM: looped or grouped)
// and its row-major matmul_nt/nn/tn over cublasGemmEx. The MoE layer that
// calls it is moe.cu.
#include <cublas_v2.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "cuda/check.h"
#include "cuda/ops.h"

namespace rt::cuda {

namespace {

MoeGemm gemm_mode_from_env() {
  const char* v = std::getenv("RAMTRAIN_MOE_GEMM");
  // auto: grouped where the experts' groups are small (cuda/ops.h MoeGemm::by_size)
  if (!v || !*v || std::string(v) == "auto") return MoeGemm::by_size;
  if (std::string(v) == "looped") return MoeGemm::looped;
  if (std::string(v) == "grouped") return MoeGemm::grouped;
  fail("[cuda moe] RAMTRAIN_MOE_GEMM (the MoE expert GEMMs) must be auto, grouped or looped, got '", v,
       "': unset it for auto");
}

}  // namespace

MoeBlas::MoeBlas() : mode_(gemm_mode_from_env()) {
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  // split-K partial sums in fp32, never in the bf16 output type
  const cublasStatus_t st = cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (st != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);  // the destructor does not run for a throwing constructor
  CUBLAS_CHECK(st);
  const cudaError_t ev = cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming);
  if (ev != cudaSuccess) cublasDestroy(h);
  CUDA_CHECK(ev);
  h_ = h;
}

MoeBlas::~MoeBlas() {
  if (h_) cublasDestroy(h_);
  if (ev_) cudaEventDestroy(ev_);
  if (host_) cudaFreeHost(host_);
}

MoeBlas::MoeBlas(MoeBlas&& o) noexcept
    : h_(o.h_),
      ev_(o.ev_),
      host_(o.host_),
      host_bytes_(o.host_bytes_),
      mode_(o.mode_),
      grouped_calls_(o.grouped_calls_) {
  o.h_ = nullptr, o.ev_ = nullptr, o.host_ = nullptr, o.host_bytes_ = 0;
}

void* MoeBlas::host_staging(size_t bytes) {
  if (bytes <= host_bytes_) return host_;
  if (host_) {  // a copy queued by an earlier call may still read it
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr, host_bytes_ = 0;
  }
  CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocPortable));
  host_bytes_ = bytes;
  return host_;
}

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

void check_gemm(const char* what, int64_t M, int64_t N, int64_t K, float beta, DType t) {
  RT_CHECK(M > 0 && N > 0 && K > 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX, "[cuda moe gemm] ", what,
           ": bad shape M=", M, " N=", N, " K=", K, " (each in 1..2^31-1)");
  RT_CHECK(beta == 0.f || (beta == 1.f && t == DType::f32), "[cuda moe gemm] ", what,
           ": beta must be 0, or 1 with an fp32 output; got ", beta);
}

// Row-major out[M,N] is column-major out^T[N,M]: each product is issued as
// out^T = op(b) op(a) with cuBLAS's m = N, n = M (as linear.cu does).
void gemm(cublasHandle_t h, cublasOperation_t op_b, cublasOperation_t op_a, void* out, DType t, const bf16* a,
          int64_t lda, const bf16* b, int64_t ldb, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasSetStream(h, stream));
  CUBLAS_CHECK(cublasGemmEx(h, op_b, op_a, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b,
                            CUDA_R_16BF, static_cast<int>(ldb), a, CUDA_R_16BF, static_cast<int>(lda), &beta, out,
                            cuda_type(t), static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void MoeBlas::matmul_nt(void* out, DType t, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                        cudaStream_t stream) {
  check_gemm("matmul_nt", M, N, K, beta, t);
  // b [N,K] row-major = column-major [K,N], transposed; a [M,K] = column-major [K,M]
  gemm(h_, CUBLAS_OP_T, CUBLAS_OP_N, out, t, a, K, b, K, M, N, K, beta, stream);
}
void MoeBlas::matmul_nn(void* out, DType t, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                        cudaStream_t stream) {
  check_gemm("matmul_nn", M, N, K, beta, t);
  // b [K,N] = column-major [N,K]; a [M,K] = column-major [K,M]
  gemm(h_, CUBLAS_OP_N, CUBLAS_OP_N, out, t, a, K, b, N, M, N, K, beta, stream);
}
void MoeBlas::matmul_tn(void* out, DType t, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K, float beta,
                        cudaStream_t stream) {
  check_gemm("matmul_tn", M, N, K, beta, t);
  // b [K,N] = column-major [N,K]; a [K,M] = column-major [M,K], transposed
  gemm(h_, CUBLAS_OP_N, CUBLAS_OP_T, out, t, a, M, b, N, M, N, K, beta, stream);
}

}  // namespace rt::cuda
