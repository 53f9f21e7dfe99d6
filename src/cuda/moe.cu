// The mixture-of-experts MLP on the GPU (declared in cuda/ops.h; cpu/moe.h is
// the contract and the fp32 reference). Letters as there: N tokens, C hidden,
// E experts, K experts per token, F expert width; NK = N*K (token, slot) rows.
//
// Routing: one thread per token (softmax over E, then K arg-max passes, ties
// to the lower expert, exactly the CPU's rule on the GPU's fp32 probabilities).
// Permutation: a counting sort by expert, one block per expert scanning the
// NK slots in order with warp ballots, so each expert's rows are its tokens
// in increasing order (the CPU's gather order) and the result never depends
// on scheduling. Un-permutation: one thread per output element sums its
// token's K rows in increasing expert index (the CPU's order), in fp32.
// Every reduction here has a fixed order; cuBLAS GEMMs are deterministic on
// one stream. No atomics.
// gpt-oss (MoeDims::topk_softmax, glu_limit; MoeBiasesT): the router's bias
// is added to the logits, which probs then keeps; the K selected logits'
// softmax weighs the experts; the expert biases are added to each expert's
// g, u (bf16) and o (fp32) rows, and their gradients are column sums of
// d_g, d_u, d_o over the expert's rows (one thread per column, rows in order).
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {

// ---------------------------------------------------------------- MoeBlas

MoeBlas::MoeBlas() {
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  // split-K partial sums in fp32, never in the bf16 output type
  const cublasStatus_t st = cublasSetMathMode(
      h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  if (st != CUBLAS_STATUS_SUCCESS) cublasDestroy(h);  // the destructor does not run for a throwing constructor
  CUBLAS_CHECK(st);
  h_ = h;
}

MoeBlas::~MoeBlas() {
  if (h_) cublasDestroy(h_);
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

namespace {

constexpr int kMaxK = 32;  // experts per token the routing kernels hold in registers

// The scratch of one call, carved in this order (256-byte aligned pieces).
struct MoeWork {
  int32_t *idx, *perm, *row_of, *offsets;  // [NK] chosen experts, [NK] slot of each permuted row, its inverse, [E+1]
  float *w, *dw;                           // [NK] routing weights and their gradients
  bf16 *xe, *g, *u, *a, *d_o, *d_a, *d_g, *d_u, *dl;  // [NK,C], [NK,F] x3, [NK,C], [NK,F] x3, [N,E]
  float *o, *dxr;                                    // [NK,C] (the backward's dx per row), [N,C]
};

size_t carve(const MoeDims& d, void* base, MoeWork* w) {
  size_t used = 0;
  auto take = [&](auto*& p, int64_t n) {
    using T = std::remove_reference_t<decltype(*p)>;
    p = base ? reinterpret_cast<T*>(static_cast<uint8_t*>(base) + used) : nullptr;
    used += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
  };
  const int64_t NK = d.N * d.K;
  take(w->idx, NK);
  take(w->perm, NK);
  take(w->row_of, NK);
  take(w->offsets, d.E + 1);
  take(w->w, NK);
  take(w->dw, NK);
  take(w->xe, NK * d.C);
  take(w->g, NK * d.F);
  take(w->u, NK * d.F);
  take(w->a, NK * d.F);
  take(w->d_o, NK * d.C);
  take(w->d_a, NK * d.F);
  take(w->d_g, NK * d.F);
  take(w->d_u, NK * d.F);
  take(w->dl, d.N * d.E);
  take(w->o, NK * d.C);
  take(w->dxr, d.N * d.C);
  return used;
}

void check_dims(const MoeDims& d) {
  RT_CHECK(d.N > 0 && d.C > 0 && d.E > 0 && d.F > 0 && d.K >= 1 && d.K <= d.E && d.K <= kMaxK,
           "[cuda moe] bad shape: N ", d.N, ", C ", d.C, ", E ", d.E, ", K ", d.K, ", F ", d.F,
           " (need 1 <= K <= E and K <= ", kMaxK, ")");
  RT_CHECK(d.C % 8 == 0, "[cuda moe] hidden size C = ", d.C, " must be a multiple of 8");
  RT_CHECK(d.N * d.K <= INT_MAX, "[cuda moe] N*K = ", d.N * d.K, " rows is more than the int32 indices hold");
}

MoeWork bind(const MoeDims& d, Scratch s) {
  MoeWork w{};
  const size_t need = carve(d, s.ptr, &w);
  RT_CHECK(need == moe_scratch_bytes(d), "[cuda moe] internal: the scratch layout (", need,
           " bytes) and moe_scratch_bytes (", moe_scratch_bytes(d), ") disagree");
  RT_CHECK(s.ptr && s.bytes >= need, "[cuda moe] the scratch holds ", s.bytes, " bytes; the MoE ops need ", need,
           " (moe_scratch_bytes)");
  return w;
}

// Blocks of a grid-stride loop over n items.
unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>(detail::ceil_div(n, threads), 65536));
}
// Blocks of a kernel with one item per thread (or warp): every item gets one.
unsigned blocks_each(int64_t n, int per_block) { return static_cast<unsigned>(detail::ceil_div(n, per_block)); }

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
// moe_topk; topk_softmax (gpt-oss): p holds logits and w is the softmax of the K selected.
__global__ void topk_kernel(int32_t* idx, float* w, const float* p, int64_t N, int64_t E, int K, bool norm_topk,
                            bool topk_softmax) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* r = p + n * E;
  int sel[kMaxK];
  float wt[kMaxK];
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || sel[i] == e;
      if (!taken && (best < 0 || r[e] > r[best])) best = e;
    }
    sel[j] = best;
    wt[j] = r[best];
  }
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

// offsets[0..E]: exclusive prefix of the counts (E is small: one thread).
__global__ void scan_kernel(int32_t* offsets, int64_t E) {
  offsets[0] = 0;
  for (int64_t e = 1; e <= E; ++e) offsets[e] += offsets[e - 1];
}

// perm[offsets[e] + k] = the k-th slot (in increasing slot order) routed to e;
// row_of is its inverse. One block per expert; blockDim a multiple of 32.
__global__ void permute_kernel(int32_t* perm, int32_t* row_of, const int32_t* idx, const int32_t* offsets,
                               int64_t NK) {
  __shared__ int warp_total[32];
  const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  int base = offsets[e];
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

// xe[r, :] = x[perm[r] / K, :], 8 bf16 per step.
__global__ void gather_kernel(bf16* xe, const bf16* x, const int32_t* perm, int64_t NK, int64_t C, int K) {
  const int64_t C8 = C / 8, total = NK * C8;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = v / C8, c8 = v % C8, n = perm[r] / K;
    reinterpret_cast<detail::bf16x8*>(xe + r * C)[c8] = reinterpret_cast<const detail::bf16x8*>(x + n * C)[c8];
  }
}

// The slot of row n's j-th smallest expert index (the CPU's summation order).
__device__ __forceinline__ int nth_by_expert(const int32_t* idx_row, int K, int prev_expert) {
  int best = -1;
  for (int j = 0; j < K; ++j)
    if (idx_row[j] > prev_expert && (best < 0 || idx_row[j] < idx_row[best])) best = j;
  return best;
}

// sum over token n's experts in increasing index (the CPU's order) of
// w[slot] * rows[row, c] (w null: of rows[row, c]), in fp32.
__device__ __forceinline__ float sum_by_expert(const float* rows, const float* w, const int32_t* row_of,
                                               const int32_t* idx, int64_t n, int64_t c, int64_t C, int K) {
  const int32_t* ir = idx + n * K;
  float acc = 0.f;
  int prev = -1;
  for (int t = 0; t < K; ++t) {
    const int j = nth_by_expert(ir, K, prev);
    prev = ir[j];
    const float v = rows[static_cast<int64_t>(row_of[n * K + j]) * C + c];
    acc = w ? fmaf(v, w[n * K + j], acc) : acc + v;  // fmaf: what `acc += v * w` contracted to
  }
  return acc;
}

// out[n, c] = bf16(sum over n's experts in increasing index of w * o[row, c]).
__global__ void combine_out_kernel(bf16* out, const float* o, const int32_t* row_of, const int32_t* idx,
                                   const float* w, int64_t N, int64_t C, int K) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(sum_by_expert(o, w, row_of, idx, i / C, i % C, C, K));
}

// Per permuted row r (slot s = perm[r], token n = s / K), one warp:
// dw[s] = <dout[n], o[r]> (fp32), d_o[r] = bf16(w[s] dout[n]).
__global__ void weight_grad_kernel(float* dw, bf16* d_o, const bf16* dout, const float* o, const float* w,
                                   const int32_t* perm, int64_t NK, int64_t C, int K) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= NK) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int32_t s = perm[r];
  const int64_t n = s / K;
  const float wt = w[s];
  float dot = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float dy = __bfloat162float(dout[n * C + c]);
    dot += dy * o[r * C + c];
    d_o[r * C + c] = __float2bfloat16(dy * wt);
  }
  dot = detail::warp_sum(dot);
  if (lane == 0) dw[s] = dot;
}

// dl[n, :] (bf16) = d loss / d router logits of row n, through the top-k
// weights (norm_topk: w_j = p_j / S) and the softmax; dprob [E] or null.
// topk_softmax (gpt-oss): w = softmax(l_S), dl_S_j = w_j (dw_j - sum_i w_i dw_i), 0 elsewhere.
__global__ void router_grad_kernel(bf16* dl, const float* p, const int32_t* idx, const float* w, const float* dw,
                                   const float* dprob, int64_t N, int64_t E, int K, bool norm_topk, bool topk_softmax) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  if (topk_softmax) {
    float wdw = 0.f;
    for (int j = 0; j < K; ++j) wdw += w[n * K + j] * dw[n * K + j];
    for (int64_t e = 0; e < E; ++e) dl[n * E + e] = __float2bfloat16(0.f);
    for (int j = 0; j < K; ++j) dl[n * E + idx[n * K + j]] = __float2bfloat16(w[n * K + j] * (dw[n * K + j] - wdw));
    return;
  }
  const float* pr = p + n * E;
  int sel[kMaxK];
  float extra[kMaxK];
  float S = 0.f, wdw = 0.f;
  for (int j = 0; j < K; ++j) {
    sel[j] = idx[n * K + j];
    S += pr[sel[j]];
    wdw += dw[n * K + j] * w[n * K + j];
  }
  for (int j = 0; j < K; ++j) extra[j] = norm_topk ? (dw[n * K + j] - wdw) / S : dw[n * K + j];
  auto dp_of = [&](int e) {
    float v = dprob ? dprob[e] : 0.f;
    for (int j = 0; j < K; ++j)
      if (sel[j] == e) v += extra[j];
    return v;
  };
  float pdp = 0.f;
  for (int e = 0; e < E; ++e) pdp += pr[e] * dp_of(e);
  for (int e = 0; e < E; ++e) dl[n * E + e] = __float2bfloat16(pr[e] * (dp_of(e) - pdp));
}

// dx[n, c] = bf16(sum over n's experts in increasing index of dxe[row, c], + dxr[n, c]).
__global__ void combine_dx_kernel(bf16* dx, const float* dxe, const float* dxr, const int32_t* row_of,
                                  const int32_t* idx, int64_t N, int64_t C, int K) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = __float2bfloat16(sum_by_expert(dxe, nullptr, row_of, idx, i / C, i % C, C, K) + dxr[i]);
}

__global__ void shared_gate_forward_kernel(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = 1.f / (1.f + expf(-z[i / C]));
    y[i] = __float2bfloat16(__bfloat162float(y[i]) + s * __bfloat162float(o[i]));
  }
}

// One warp per row.
__global__ void shared_gate_backward_kernel(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z,
                                            int64_t N, int64_t C) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int lane = threadIdx.x & 31;
  const float s = 1.f / (1.f + expf(-z[n]));
  float dot = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float g = __bfloat162float(dy[n * C + c]);
    dot += g * __bfloat162float(o[n * C + c]);
    d_o[n * C + c] = __float2bfloat16(s * g);
  }
  dot = detail::warp_sum(dot);
  if (lane == 0) dz[n] = __float2bfloat16(s * (1.f - s) * dot);
}

__device__ __forceinline__ float as_f32(float v) { return v; }
__device__ __forceinline__ float as_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = __float2bfloat16(v); }

// rows [R, cols] += bias [cols] (bf16 rows: rounded once; fp32 rows).
template <class T>
__global__ void add_bias_kernel(T* rows, const bf16* bias, int64_t R, int64_t cols) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < R * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store(rows + i, as_f32(rows[i]) + __bfloat162float(bias[i % cols]));
}
template <class T>
void add_bias(T* rows, const bf16* bias, int64_t R, int64_t cols, cudaStream_t stream) {
  add_bias_kernel<T><<<blocks_for(R * cols, 256), 256, 0, stream>>>(rows, bias, R, cols);
  CUDA_CHECK_LAUNCH();
}
// db [cols] += sum over the R rows of d (bf16), one thread per column, rows in order.
__global__ void col_sum_kernel(float* db, const bf16* d, int64_t R, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.f;
  for (int64_t r = 0; r < R; ++r) acc += __bfloat162float(d[r * cols + c]);
  db[c] += acc;
}
void col_sum(float* db, const bf16* d, int64_t R, int64_t cols, cudaStream_t stream) {
  col_sum_kernel<<<blocks_each(cols, 256), 256, 0, stream>>>(db, d, R, cols);
  CUDA_CHECK_LAUNCH();
}

// The routing of every slot (idx, w) from the probabilities, and the
// permutation by expert (offsets [E+1] on the device).
void route_on_device(const MoeDims& d, const MoeWork& w, const float* probs, cudaStream_t stream) {
  const int64_t NK = d.N * d.K;
  topk_kernel<<<blocks_each(d.N, 128), 128, 0, stream>>>(w.idx, w.w, probs, d.N, d.E, static_cast<int>(d.K),
                                                         d.norm_topk, d.topk_softmax);
  CUDA_CHECK_LAUNCH();
  count_kernel<<<static_cast<unsigned>(d.E), 1024, 0, stream>>>(w.offsets, w.idx, NK);
  CUDA_CHECK_LAUNCH();
  scan_kernel<<<1, 1, 0, stream>>>(w.offsets, d.E);
  CUDA_CHECK_LAUNCH();
  permute_kernel<<<static_cast<unsigned>(d.E), 1024, 0, stream>>>(w.perm, w.row_of, w.idx, w.offsets, NK);
  CUDA_CHECK_LAUNCH();
}

// As route_on_device, and the offsets [E+1] on the host (waits).
std::vector<int32_t> route(const MoeDims& d, const MoeWork& w, const float* probs, cudaStream_t stream) {
  route_on_device(d, w, probs, stream);
  std::vector<int32_t> off(static_cast<size_t>(d.E + 1));
  CUDA_CHECK(cudaMemcpyAsync(off.data(), w.offsets, off.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return off;
}

// tokens[e] += offsets[e + 1] - offsets[e] (device arrays).
__global__ void add_counts_kernel(int64_t* tokens, const int32_t* offsets, int64_t E) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < E) tokens[e] += offsets[e + 1] - offsets[e];
}
void add_counts(int64_t* tokens, const int32_t* offsets, int64_t E, cudaStream_t stream) {
  add_counts_kernel<<<blocks_each(E, 256), 256, 0, stream>>>(tokens, offsets, E);
  CUDA_CHECK_LAUNCH();
}

// MoeAux::finish (model/moe_aux.h) on one thread: the same fp64 operations in
// the same order, each rounded on its own (the _rn intrinsics: no FMA
// contraction, as the host's portable build has none); dprob [E] (=),
// step_tokens [L, E] (+=) and *step_aux (+= aux * aux_scale).
__global__ void moe_aux_finish_kernel(float* dprob, int64_t* step_tokens, double* step_aux, const int64_t* tokens,
                                      const double* prob_sum, int64_t L, int64_t E, int64_t N, double weight,
                                      double aux_scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const double R = __dmul_rn(static_cast<double>(L), static_cast<double>(N));
  const double RR = __dmul_rn(R, R), wE = __dmul_rn(weight, static_cast<double>(E));
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    double T = 0, P = 0;
    for (int64_t l = 0; l < L; ++l) {
      T = __dadd_rn(T, static_cast<double>(tokens[l * E + e]));
      P = __dadd_rn(P, prob_sum[l * E + e]);
    }
    aux = __dadd_rn(aux, __dmul_rn(__ddiv_rn(T, R), __ddiv_rn(P, R)));
    dprob[e] = __double2float_rn(__ddiv_rn(__dmul_rn(wE, T), RR));
  }
  aux = __dmul_rn(aux, static_cast<double>(E));
  if (step_aux) *step_aux = __dadd_rn(*step_aux, __dmul_rn(aux, aux_scale));
  if (step_tokens)
    for (int64_t i = 0; i < L * E; ++i) step_tokens[i] += tokens[i];
}

// Every expert's g, u, a (bf16) and o (fp32) on its gathered rows xe.
void experts_forward(MoeBlas& blas, const MoeDims& d, const MoeWork& w, const std::vector<int32_t>& off, const bf16* x,
                     const bf16* const* gate, const bf16* const* up, const bf16* const* down, cudaStream_t stream,
                     const MoeBiasesT<bf16>& b) {
  const int64_t NK = d.N * d.K, C = d.C, F = d.F;
  gather_kernel<<<blocks_for(NK * C / 8, 256), 256, 0, stream>>>(w.xe, x, w.perm, NK, C, static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = off[e], R = off[e + 1] - off[e];
    if (R == 0) continue;
    blas.matmul_nt(w.g + r0 * F, DType::bf16, w.xe + r0 * C, gate[e], R, F, C, 0.f, stream);
    blas.matmul_nt(w.u + r0 * F, DType::bf16, w.xe + r0 * C, up[e], R, F, C, 0.f, stream);
    if (b.gate) add_bias(w.g + r0 * F, b.gate[e], R, F, stream);
    if (b.up) add_bias(w.u + r0 * F, b.up[e], R, F, stream);
  }
  if (d.glu_limit > 0.f)
    swiglu_clamped_forward(w.a, w.g, w.u, NK * F, d.glu_limit, d.glu_alpha, stream);
  else
    swiglu_forward(w.a, w.g, w.u, NK * F, stream);
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = off[e], R = off[e + 1] - off[e];
    if (R == 0) continue;
    blas.matmul_nt(w.o + r0 * C, DType::f32, w.a + r0 * F, down[e], R, C, F, 0.f, stream);
    if (b.down) add_bias(w.o + r0 * C, b.down[e], R, C, stream);
  }
}

}  // namespace

void moe_forward(MoeBlas& blas, bf16* out, float* probs, const bf16* x, const bf16* router, const bf16* const* gate,
                 const bf16* const* up, const bf16* const* down, const MoeDims& d, int64_t* tokens_per_expert,
                 double* prob_sum, Scratch scratch, cudaStream_t stream, const MoeBiasesT<bf16>& b) {
  check_dims(d);
  const MoeWork w = bind(d, scratch);
  detail::check_aligned(x, "moe x");
  blas.matmul_nt(probs, DType::f32, x, router, d.N, d.E, d.C, 0.f, stream);  // logits [N, E]
  if (b.router) add_bias(probs, b.router, d.N, d.E, stream);
  if (!d.topk_softmax) {  // gpt-oss keeps the logits
    softmax_rows_kernel<<<blocks_each(d.N, 128), 128, 0, stream>>>(probs, d.N, d.E);
    CUDA_CHECK_LAUNCH();
  }
  if (prob_sum) {  // on the device: read back with the step's other metrics (cuda/ops.h)
    prob_sum_kernel<<<static_cast<unsigned>(d.E), 256, 0, stream>>>(prob_sum, probs, d.N, d.E, d.topk_softmax);
    CUDA_CHECK_LAUNCH();
  }
  if (!out && !tokens_per_expert) return;
  if (!out) {  // the routing's counts only: no host copy
    route_on_device(d, w, probs, stream);
    add_counts(tokens_per_expert, w.offsets, d.E, stream);
    return;
  }
  const std::vector<int32_t> off = route(d, w, probs, stream);
  if (tokens_per_expert) add_counts(tokens_per_expert, w.offsets, d.E, stream);
  experts_forward(blas, d, w, off, x, gate, up, down, stream, b);
  combine_out_kernel<<<blocks_for(d.N * d.C, 256), 256, 0, stream>>>(out, w.o, w.row_of, w.idx, w.w, d.N, d.C,
                                                                     static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
}

void moe_backward(MoeBlas& blas, bf16* dx, float* drouter, float* const* dgate, float* const* dup, float* const* ddown,
                  const bf16* dout, const bf16* x, const float* probs, const bf16* router, const bf16* const* gate,
                  const bf16* const* up, const bf16* const* down, const MoeDims& d, const float* dprob, Scratch scratch,
                  cudaStream_t stream, const MoeBiasesT<bf16>& b, const MoeBiasGrads& gb) {
  check_dims(d);
  RT_CHECK(!(dprob && d.topk_softmax),
           "[cuda moe] the load-balancing loss is not supported with top-k softmax routing");
  const MoeWork w = bind(d, scratch);
  detail::check_aligned(x, "moe x");
  const int64_t NK = d.N * d.K, C = d.C, F = d.F;
  const std::vector<int32_t> off = route(d, w, probs, stream);  // recomputed from the forward's probabilities
  experts_forward(blas, d, w, off, x, gate, up, down, stream, b);
  // out[n] += w o: dw = <dout[n], o>, d_o = w dout[n]
  weight_grad_kernel<<<blocks_each(NK, 8), 256, 0, stream>>>(w.dw, w.d_o, dout, w.o, w.w, w.perm, NK, C,
                                                            static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
  for (int64_t e = 0; e < d.E; ++e) {  // down: d_a = d_o Wd, dWd += d_o^T a
    const int64_t r0 = off[e], R = off[e + 1] - off[e];
    if (R == 0) continue;
    blas.matmul_nn(w.d_a + r0 * F, DType::bf16, w.d_o + r0 * C, down[e], R, F, C, 0.f, stream);
    blas.matmul_tn(ddown[e], DType::f32, w.d_o + r0 * C, w.a + r0 * F, C, F, R, 1.f, stream);
    if (gb.down) col_sum(gb.down[e], w.d_o + r0 * C, R, C, stream);
  }
  if (d.glu_limit > 0.f)
    swiglu_clamped_backward(w.d_g, w.d_u, w.d_a, w.g, w.u, NK * F, d.glu_limit, d.glu_alpha, stream);
  else
    swiglu_backward(w.d_g, w.d_u, w.d_a, w.g, w.u, NK * F, stream);
  float* dxe = w.o;  // o is spent (read by weight_grad_kernel): each row's dx, fp32
  for (int64_t e = 0; e < d.E; ++e) {  // gate/up: dxe = d_g Wg + d_u Wu, dWg += d_g^T xe, dWu += d_u^T xe
    const int64_t r0 = off[e], R = off[e + 1] - off[e];
    if (R == 0) continue;
    blas.matmul_nn(dxe + r0 * C, DType::f32, w.d_g + r0 * F, gate[e], R, C, F, 0.f, stream);
    blas.matmul_nn(dxe + r0 * C, DType::f32, w.d_u + r0 * F, up[e], R, C, F, 1.f, stream);
    blas.matmul_tn(dgate[e], DType::f32, w.d_g + r0 * F, w.xe + r0 * C, F, C, R, 1.f, stream);
    blas.matmul_tn(dup[e], DType::f32, w.d_u + r0 * F, w.xe + r0 * C, F, C, R, 1.f, stream);
    if (gb.gate) col_sum(gb.gate[e], w.d_g + r0 * F, R, F, stream);
    if (gb.up) col_sum(gb.up[e], w.d_u + r0 * F, R, F, stream);
  }
  // routing weights -> probabilities -> logits -> x and the router
  router_grad_kernel<<<blocks_each(d.N, 128), 128, 0, stream>>>(w.dl, probs, w.idx, w.w, w.dw,
                                                                dprob, d.N, d.E,
                                                                static_cast<int>(d.K), d.norm_topk, d.topk_softmax);
  CUDA_CHECK_LAUNCH();
  if (gb.router) col_sum(gb.router, w.dl, d.N, d.E, stream);                   // the router bias: dl summed over tokens
  blas.matmul_nn(w.dxr, DType::f32, w.dl, router, d.N, C, d.E, 0.f, stream);   // dxr [N,C] = dl [N,E] Wr [E,C]
  blas.matmul_tn(drouter, DType::f32, w.dl, x, d.E, C, d.N, 1.f, stream);      // dWr [E,C] += dl^T x
  combine_dx_kernel<<<blocks_for(d.N * C, 256), 256, 0, stream>>>(dx, dxe, w.dxr, w.row_of, w.idx, d.N, C,
                                                                  static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
}

void moe_aux_finish(float* dprob, int64_t* step_tokens, double* step_aux, const int64_t* tokens,
                    const double* prob_sum, int64_t L, int64_t E, int64_t N, double weight, float aux_scale,
                    cudaStream_t stream) {
  RT_CHECK(L > 0 && E > 0 && N > 0, "[cuda moe] moe_aux_finish: bad shape L ", L, ", E ", E, ", N ", N);
  moe_aux_finish_kernel<<<1, 1, 0, stream>>>(dprob, step_tokens, step_aux, tokens, prob_sum, L, E, N, weight,
                                             static_cast<double>(aux_scale));
  CUDA_CHECK_LAUNCH();
}

void moe_shared_gate_forward(bf16* y, const bf16* o, const float* z, int64_t N, int64_t C, cudaStream_t stream) {
  if (N * C == 0) return;
  shared_gate_forward_kernel<<<blocks_for(N * C, 256), 256, 0, stream>>>(y, o, z, N, C);
  CUDA_CHECK_LAUNCH();
}

void moe_shared_gate_backward(bf16* d_o, bf16* dz, const bf16* dy, const bf16* o, const float* z, int64_t N, int64_t C,
                              cudaStream_t stream) {
  if (N == 0) return;
  shared_gate_backward_kernel<<<blocks_each(N, 8), 256, 0, stream>>>(d_o, dz, dy, o, z, N, C);
  CUDA_CHECK_LAUNCH();
}

}  // namespace rt::cuda
