// MoeBlas (cuda/ops.h): the cuBLAS handle, event and pinned staging the MoE
// expert GEMMs run through, its mode (RAMTRAIN_MOE_GEMM: looped or grouped),
// its weight-gradient lanes (RAMTRAIN_MOE_WGRAD_LANES) and its row-major
// matmul_nt/nn/tn over cublasGemmEx. The MoE layer that
// calls it is moe.cu.
#include <cublas_v2.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

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

int lanes_from_env() {
  const char* v = std::getenv("RAMTRAIN_MOE_WGRAD_LANES");
  if (!v || !*v) return MoeBlas::kWgradLanes;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  RT_CHECK(*end == '\0' && n >= 0 && n <= MoeBlas::kMaxWgradLanes,
           "[cuda moe] RAMTRAIN_MOE_WGRAD_LANES (streams for the expert weight gradients) must be an integer in 0..",
           MoeBlas::kMaxWgradLanes, ", got '", v, "': unset it for ", MoeBlas::kWgradLanes);
  return static_cast<int>(n);
}

// A handle whose split-K partial sums stay in fp32, never in the bf16 output type.
cublasHandle_t make_handle() {
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  const cublasStatus_t st = cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (st != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);
  CUBLAS_CHECK(st);
  return h;
}

bool pair_from_env() {
  const char* v = std::getenv("RAMTRAIN_MOE_WGRAD_PAIR");
  if (!v || !*v) return MoeBlas::kWgradPair;
  RT_CHECK(
      std::string(v) == "0" || std::string(v) == "1",
      "[cuda moe] RAMTRAIN_MOE_WGRAD_PAIR (an expert's gate and up taken as one in the backward: one input-gradient "
      "product and one weight-gradient call) ",
      "must be 0 or 1, got '", v, "': unset it for ", MoeBlas::kWgradPair ? 1 : 0);
  return std::string(v) == "1";
}

}  // namespace

MoeBlas::MoeBlas() : mode_(gemm_mode_from_env()), lanes_(lanes_from_env()), pair_(pair_from_env()) {
  cublasHandle_t h = make_handle();
  const cudaError_t ev = cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming);
  if (ev != cudaSuccess) cublasDestroy(h);  // the destructor does not run for a throwing constructor
  CUDA_CHECK(ev);
  h_ = h;
}

MoeBlas::~MoeBlas() {
  if (h_) cublasDestroy(h_);
  if (ev_) cudaEventDestroy(ev_);
  if (host_) cudaFreeHost(host_);
  for (Lane& l : lane_) {
    if (l.h) cublasDestroy(l.h);
    if (l.done) cudaEventDestroy(l.done);
    if (l.stream) cudaStreamDestroy(l.stream);
  }
  if (fork_) cudaEventDestroy(fork_);
}

MoeBlas::MoeBlas(MoeBlas&& o) noexcept
    : h_(o.h_),
      ev_(o.ev_),
      host_(o.host_),
      host_dev_(o.host_dev_),
      host_bytes_(o.host_bytes_),
      mode_(o.mode_),
      grouped_calls_(o.grouped_calls_),
      wgrad_pairs_(o.wgrad_pairs_),
      merged_calls_(o.merged_calls_),
      lanes_(o.lanes_),
      pair_(o.pair_),
      lane_(std::move(o.lane_)),
      fork_(o.fork_) {
  o.h_ = nullptr, o.ev_ = nullptr, o.host_ = nullptr, o.host_dev_ = nullptr, o.host_bytes_ = 0, o.fork_ = nullptr;
  o.lane_.clear();
}

void MoeBlas::set_wgrad_lanes(int n) {
  RT_CHECK(n >= 0 && n <= kMaxWgradLanes, "[cuda moe] weight-gradient lanes must be in 0..", kMaxWgradLanes, ", got ",
           n);
  if (n == lanes_) return;
  if (!lane_.empty()) {  // made for another count: joined by every call, so idle once the device is
    CUDA_CHECK(cudaDeviceSynchronize());
    for (Lane& l : lane_) {
      CUBLAS_CHECK(cublasDestroy(l.h));
      CUDA_CHECK(cudaEventDestroy(l.done));
      CUDA_CHECK(cudaStreamDestroy(l.stream));
    }
    lane_.clear();
  }
  lanes_ = n;
}

void MoeBlas::make_lanes() {
  if (!fork_) CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  while (static_cast<int>(lane_.size()) < lanes_) {
    Lane l;
    CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    lane_.push_back(l);  // owned from here: the destructor frees what exists
    Lane& m = lane_.back();
    CUDA_CHECK(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming));
    m.h = make_handle();
    CUBLAS_CHECK(cublasSetStream(m.h, m.stream));
  }
}

void MoeBlas::lanes_fork(cudaStream_t stream) {
  if (lanes_ == 0) return;
  make_lanes();
  CUDA_CHECK(cudaEventRecord(fork_, stream));
  for (Lane& l : lane_) CUDA_CHECK(cudaStreamWaitEvent(l.stream, fork_, 0));
}

void MoeBlas::lanes_join(cudaStream_t stream) {
  for (Lane& l : lane_) {
    CUDA_CHECK(cudaEventRecord(l.done, l.stream));
    CUDA_CHECK(cudaStreamWaitEvent(stream, l.done, 0));
  }
}

cudaStream_t MoeBlas::lane_stream(int lane) const {
  RT_CHECK(lane >= 0 && lane < static_cast<int>(lane_.size()), "[cuda moe] internal: lane ", lane, " of ", lane_.size(),
           " (lanes_fork makes them)");
  return lane_[static_cast<size_t>(lane)].stream;
}

void* MoeBlas::host_staging(size_t bytes) {
  if (bytes <= host_bytes_) return host_;
  if (host_) {  // a write queued by an earlier call may still reach it
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaFreeHost(host_));
    host_ = host_dev_ = nullptr, host_bytes_ = 0;
  }
  CUDA_CHECK(cudaHostAlloc(&host_, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(&host_dev_, host_, 0));
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
void MoeBlas::lane_matmul_tn(int lane, void* out, DType t, const bf16* a, const bf16* b, int64_t M, int64_t N,
                             int64_t K, float beta) {
  check_gemm("matmul_tn", M, N, K, beta, t);
  const Lane& l = lane_.at(static_cast<size_t>(lane));
  gemm(l.h, CUBLAS_OP_N, CUBLAS_OP_T, out, t, a, M, b, N, M, N, K, beta, l.stream);
}

bool MoeBlas::matmul_tn_pair(int lane, float* out0, float* out1, const bf16* a0, const bf16* a1, const bf16* b,
                             int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream) {
  check_gemm("matmul_tn_pair", M, N, K, beta, DType::f32);
  if (!pair_) return false;
  const auto at = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  if (!(at(out1) > at(out0) && at(a1) > at(a0))) return false;
  cublasHandle_t h = h_;
  if (lane >= 0) {
    const Lane& l = lane_.at(static_cast<size_t>(lane));
    h = l.h, stream = l.stream;
  }
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasSetStream(h, stream));
  // as matmul_tn: out^T [N,M] = b^T-as-stored (column-major [N,K]) times a (column-major [M,K], transposed)
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b,
      CUDA_R_16BF, static_cast<int>(N), 0, a0, CUDA_R_16BF, static_cast<int>(M), a1 - a0, &beta, out0, CUDA_R_32F,
      static_cast<int>(N), out1 - out0, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  ++wgrad_pairs_;
  return true;
}

}  // namespace rt::cuda
