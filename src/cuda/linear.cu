// GEMMs through cuBLASLt (Blas) and the linear layer built on them.
// Row-major out[M,N] is column-major out^T[N,M], so every product is issued
// as out^T = op(b) op(a) with cuBLAS's m = N, n = M. Plans are cached per
// (layout, M, N, K, out dtype, beta != 0, bias) and never rebuilt; only the
// bias pointer attribute is set per call. dbias is a separate deterministic
// column-sum kernel (fixed row split, then a fixed-order reduction).
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/lt_plan.h"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

enum class Layout { nt, nn, tn };

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int, bool, bool>;

}  // namespace

struct Blas::Impl {
  explicit Impl(size_t workspace_bytes) : lt(workspace_bytes) {}
  LtContext lt;  // first: the plans go before the handle
  std::map<PlanKey, std::unique_ptr<LtPlan>> plans;

  LtPlan& plan_get(Layout layout, int64_t M, int64_t N, int64_t K, DType out_type, bool accumulate, bool bias) {
    PlanKey key{static_cast<int>(layout), M, N, K, static_cast<int>(out_type), accumulate, bias};
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;

    auto p = std::make_unique<LtPlan>();
    // cuBLAS operands: A := b (m x k after op), B := a (k x n after op), m = N, n = M.
    cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    uint64_t a_rows = 0, a_cols = 0, a_ld = 0, b_rows = 0, b_cols = 0, b_ld = 0;  // stored (column-major) shapes
    switch (layout) {
      case Layout::nt:  // b [N,K] row-major = col-major [K,N]; a [M,K] = col-major [K,M]
        op_a = CUBLAS_OP_T;
        a_rows = K, a_cols = N, a_ld = K;
        b_rows = K, b_cols = M, b_ld = K;
        break;
      case Layout::nn:  // b [K,N] = col-major [N,K]; a [M,K] = col-major [K,M]
        a_rows = N, a_cols = K, a_ld = N;
        b_rows = K, b_cols = M, b_ld = K;
        break;
      case Layout::tn:  // b [K,N] = col-major [N,K]; a [K,M] = col-major [M,K], transposed
        op_b = CUBLAS_OP_T;
        a_rows = N, a_cols = K, a_ld = N;
        b_rows = M, b_cols = K, b_ld = M;
        break;
    }
    const cudaDataType_t ct = out_type == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (bias) {
      cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      cudaDataType_t bt = CUDA_R_16BF;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, a_rows, a_cols, a_ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, b_rows, b_cols, b_ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, ct, N, M, N));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &lt.workspace_bytes, sizeof(lt.workspace_bytes));
    uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt.handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    CUBLAS_CHECK(st);
    RT_CHECK(found > 0, "[cuda gemm] cuBLASLt found no algorithm for M=", M, " N=", N, " K=", K,
             " layout=", static_cast<int>(layout), "; check that dimensions are multiples of 8");
    p->algo = result.algo;
    auto& ref = *p;
    plans.emplace(key, std::move(p));
    return ref;
  }

  void run(Layout layout, void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K,
           float beta, const bf16* bias, cudaStream_t stream) {
    RT_CHECK(beta == 0.f || beta == 1.f, "[cuda gemm] beta must be 0 or 1, got ", beta);
    RT_CHECK(beta == 0.f || out_type == DType::f32, "[cuda gemm] accumulation (beta=1) needs an fp32 output");
    RT_CHECK(!bias || (beta == 0.f && out_type == DType::bf16), "[cuda gemm] bias needs beta=0 and a bf16 output");
    // Leading dimensions must be multiples of 8 elements (16 bytes): N always,
    // K for nt/nn (row length of a), M for tn (row length of a).
    const int64_t other = layout == Layout::tn ? M : K;
    RT_CHECK(M > 0 && N > 0 && K > 0 && N % 8 == 0 && other % 8 == 0, "[cuda gemm] bad shape M=", M, " N=", N, " K=", K,
             " (all > 0; N and the row length of a multiples of 8)");
    detail::check_aligned(out, "gemm out");
    detail::check_aligned(a, "gemm a");
    detail::check_aligned(b, "gemm b");
    LtPlan& p = plan_get(layout, M, N, K, out_type, beta != 0.f, bias != nullptr);
    if (bias) {
      detail::check_aligned(bias, "gemm bias");
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    const float alpha = 1.f;
    CUBLAS_CHECK(cublasLtMatmul(lt.handle, p.desc, &alpha, b, p.la, a, p.lb, &beta, out, p.lc, out, p.lc, &p.algo,
                                lt.workspace, lt.workspace_bytes, stream));
  }
};

Blas::Blas(size_t workspace_bytes) : impl_(std::make_unique<Impl>(workspace_bytes)) {
}
Blas::~Blas() = default;
Blas::Blas(Blas&&) noexcept = default;
Blas& Blas::operator=(Blas&&) noexcept = default;

void Blas::matmul_nt(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream, const bf16* bias) {
  impl_->run(Layout::nt, out, out_type, a, b, M, N, K, beta, bias, stream);
}
void Blas::matmul_nn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream) {
  impl_->run(Layout::nn, out, out_type, a, b, M, N, K, beta, nullptr, stream);
}
void Blas::matmul_tn(void* out, DType out_type, const bf16* a, const bf16* b, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream) {
  impl_->run(Layout::tn, out, out_type, a, b, M, N, K, beta, nullptr, stream);
}
size_t Blas::plans_cached() const { return impl_->plans.size(); }

namespace {

// dbias[o] += sum_n dout[n, o], deterministic and independent of N's size:
// a block owns 32 columns and all rows; thread (x, y) sums columns 2x, 2x + 1
// over the rows y, y + 64, y + 128, ... in order (eight loads in flight, added
// in row order), then the 64 row lanes combine in order. Pairs need an even O
// and a 4-byte aligned dout; else one column per thread and 32 row lanes
// (kPairs false).
// Bytes: one read of dout; 1024 threads a block keep ~32 KB in flight per
// block, so even O = 512 (16 blocks) reads at several hundred GB/s.
template <bool kPairs>
__global__ void __launch_bounds__(1024) bias_grad_kernel(float* dbias, const bf16* dout, int64_t N, int64_t O) {
  constexpr int kBgLanes = kPairs ? 64 : 32;  // x 16 column pairs or 32 columns = 1024 threads
  __shared__ float part[kBgLanes][33];
  constexpr int kPer = kPairs ? 2 : 1;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + kPer * threadIdx.x;
  float s0 = 0.f, s1 = 0.f;
  if (c < O) {
    int64_t n = threadIdx.y;
    constexpr int kU = 8;
    for (; n + (kU - 1) * kBgLanes < N; n += kU * kBgLanes) {
      float2 v[kU];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const bf16* p = dout + (n + j * kBgLanes) * O + c;
        if constexpr (kPairs)
          v[j] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
        else
          v[j] = make_float2(__bfloat162float(*p), 0.f);
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        s0 += v[j].x;
        s1 += v[j].y;
      }
    }
    for (; n < N; n += kBgLanes) {
      const bf16* p = dout + n * O + c;
      if constexpr (kPairs) {
        const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
        s0 += v.x;
        s1 += v.y;
      } else {
        s0 += __bfloat162float(*p);
      }
    }
  }
  part[threadIdx.y][kPer * threadIdx.x] = s0;
  if constexpr (kPairs) part[threadIdx.y][2 * threadIdx.x + 1] = s1;
  __syncthreads();
  // 32 threads finish the block's 32 columns, lanes in order
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + t;
  if (t < 32 && col < O) {
    float s = 0.f;
    for (int r = 0; r < kBgLanes; ++r) s += part[r][t];
    dbias[col] += s;
  }
}

}  // namespace

void linear_forward(Blas& blas, void* out, DType out_type, const bf16* x, const bf16* w, const bf16* bias, int64_t N,
                    int64_t I, int64_t O, cudaStream_t stream) {
  blas.matmul_nt(out, out_type, x, w, N, O, I, 0.f, stream, bias);
}

void linear_backward(Blas& blas, bf16* dx, float* dw, float* dbias, const bf16* dout, const bf16* x, const bf16* w,
                     int64_t N, int64_t I, int64_t O, cudaStream_t stream) {
  if (dx) blas.matmul_nn(dx, DType::bf16, dout, w, N, I, O, 0.f, stream);  // dx[N,I] = dout[N,O] @ w[O,I]
  blas.matmul_tn(dw, DType::f32, dout, x, O, I, N, 1.f, stream);           // dw[O,I] += dout^T @ x
  if (dbias) bias_grad(dbias, dout, N, O, stream);
}

void bias_grad(float* dbias, const bf16* dout, int64_t N, int64_t O, cudaStream_t stream) {
  if (O <= 0) return;
  const auto blocks = static_cast<unsigned>(detail::ceil_div(O, 32));
  if (O % 2 == 0 && reinterpret_cast<uintptr_t>(dout) % 4 == 0)
    bias_grad_kernel<true><<<blocks, dim3(16, 64), 0, stream>>>(dbias, dout, N, O);
  else
    bias_grad_kernel<false><<<blocks, dim3(32, 32), 0, stream>>>(dbias, dout, N, O);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
