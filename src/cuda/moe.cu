// The mixture-of-experts MLP on the GPU (declared in cuda/ops.h; cpu/moe.h is
// the contract and the fp32 reference). Letters as there: N tokens, C hidden,
// E experts, K experts per token, F expert width; NK = N*K (token, slot) rows.
//
// Routing: one thread per token (softmax over E, then K arg-max passes, ties
// to the lower expert, exactly the CPU's rule on the GPU's fp32 probabilities).
// Permutation: a counting sort by expert, one block per expert scanning the
// NK slots in order with warp ballots, so each expert's rows are its tokens
// in increasing order (the CPU's gather order) and the result never depends
// on scheduling. In the grouped mode each expert's rows start at a multiple
// of kMoeChunk (the padded layout, cuda/moe_scratch.h); padding rows hold no
// slot (perm -1), are gathered as zeros and never reach an output.
// Un-permutation: one thread per output element sums its token's K rows in
// increasing expert index (the CPU's order), in fp32.
// Every reduction here has a fixed order; cuBLAS GEMMs are deterministic on
// one stream. No atomics.
// The expert GEMMs run grouped (one cublasGemmBatchedEx per kind of product
// over every expert's kMoeChunk-row chunks) or looped (one cublasGemmEx per
// expert): MoeBlas's mode, cuda/ops.h states the difference. The grouped
// mode's bf16 rows: o (forward), and the input gradient of the rows
// (backward): one row where gate and up are taken as one (the engine's
// layout: MoeBlas::merged_gate_up; d_g, d_u one [P, 2F] array), two rows
// summed in fp32 otherwise. The weight gradients (fp32, +=) are per expert in
// both modes, on MoeBlas's weight-gradient lanes: down's one cublasGemmEx,
// gate's and up's one [2F, C] GEMM (merged), one strided-batched call of two
// (MoeBlas::matmul_tn_pair) or two GEMMs. The backward recomputes g and u
// (a inside act_grad_kernel, which also gives the routing weight's gradient
// from the unweighted d_a product), not o.
// gpt-oss (MoeDims::topk_softmax, glu_limit; MoeBiasesT): the router's bias
// is added to the logits, which probs then keeps; the K selected logits'
// softmax weighs the experts; the expert biases are added to each expert's
// g, u (bf16) and o (fp32) rows, and their gradients are column sums of
// d_g, d_u, d_o over the expert's rows (cuda::bias_grad: deterministic).
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/moe_kernels.cuh"
#include "cuda/moe_routing_kernels.cuh"
#include "cuda/ops.h"

namespace rt::cuda {

namespace {

using detail::blocks_each;
using detail::blocks_for;

// The scratch of one call, carved in this order (256-byte aligned pieces).
struct MoeWork {
  int32_t *idx, *perm, *row_of;  // [NK] chosen experts, [P] slot of each permuted row (-1: padding), [NK] its inverse
  int32_t *offsets, *starts;     // [E+1] each: the counts' prefix, each expert's first padded row
  int32_t* ord_row;                        // [N, K] each token's rows in increasing expert index
  float* ord_w;                            // [N, K] their routing weights
  float *w, *dw;                           // [NK] routing weights and their gradients
  bf16 *xe, *g, *u, *a, *d_o, *d_a, *d_g, *d_u, *dl;  // [NK,C], [NK,F] x3, [NK,C], [NK,F] x3, [N,E]
  float *o, *dxr;                                     // [P,C] (the backward's dx per row), [N,C]
  void** ptrs;  // [kMoeGroupedCalls][3][2 chunks]: each batched GEMM's A, B and C pointers
  // rows above: NK (token slots) or P = moe_padded_rows (permuted rows)
};

size_t carve(const MoeDims& d, void* base, MoeWork* w) {
  size_t used = 0;
  auto take = [&](auto*& p, int64_t n) {
    using T = std::remove_reference_t<decltype(*p)>;
    p = base ? reinterpret_cast<T*>(static_cast<uint8_t*>(base) + used) : nullptr;
    used += (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
  };
  const int64_t NK = d.N * d.K, P = moe_padded_rows(NK, d.E);
  take(w->idx, NK);
  take(w->perm, P);
  take(w->row_of, NK);
  take(w->offsets, 2 * (d.E + 1));
  w->starts = w->offsets ? w->offsets + d.E + 1 : nullptr;
  take(w->ord_row, NK);
  take(w->ord_w, NK);
  take(w->w, NK);
  take(w->dw, NK);
  take(w->xe, P * d.C);
  take(w->g, P * d.F);
  take(w->u, P * d.F);
  take(w->a, P * d.F);
  take(w->d_o, P * d.C);
  take(w->d_a, P * d.F);
  take(w->d_g, P * d.F);
  take(w->d_u, P * d.F);
  take(w->dl, d.N * d.E);
  take(w->o, P * d.C);
  take(w->dxr, d.N * d.C);
  take(w->ptrs, kMoeGroupedCalls * 6 * moe_max_chunks(NK, d.E));
  return used;
}

void check_dims(const MoeDims& d) {
  RT_CHECK(d.N > 0 && d.C > 0 && d.E > 0 && d.F > 0 && d.K >= 1 && d.K <= d.E && d.K <= kMaxK,
           "[cuda moe] bad shape: N ", d.N, ", C ", d.C, ", E ", d.E, ", K ", d.K, ", F ", d.F,
           " (need 1 <= K <= E and K <= ", kMaxK, ")");
  RT_CHECK(d.C % 8 == 0, "[cuda moe] hidden size C = ", d.C, " must be a multiple of 8");
  RT_CHECK(d.E <= kMaxTopkE, "[cuda moe] ", d.E, " experts: the routing kernels hold at most ", kMaxTopkE);
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

template <class T>
void add_expert_bias(T* rows, const bf16* const* bias, const MoeWork& w, int64_t P, int64_t E, int64_t cols,
                     cudaStream_t stream) {
  add_expert_bias_kernel<T>
      <<<blocks_for(P * cols, 256), 256, 0, stream>>>(rows, expert_ptrs(bias, E), w.perm, w.idx, P, cols);
  CUDA_CHECK_LAUNCH();
}

// The routing of every slot (idx, w) from the probabilities, and the
// permutation by expert, each expert's rows starting at a multiple of chunk
// (kMoeChunk for the grouped mode, 1: no padding; offsets and starts [E+1]
// on the device; perm -1 on every padding row).
void route_on_device(const MoeDims& d, const MoeWork& w, const float* probs, int64_t chunk, cudaStream_t stream) {
  const int64_t NK = d.N * d.K;
  topk_kernel<<<blocks_each(d.N, 8), 256, 0, stream>>>(w.idx, w.w, probs, d.N, d.E, static_cast<int>(d.K), d.norm_topk,
                                                       d.topk_softmax);
  CUDA_CHECK_LAUNCH();
  count_kernel<<<static_cast<unsigned>(d.E), 1024, 0, stream>>>(w.offsets, w.idx, NK);
  CUDA_CHECK_LAUNCH();
  scan_kernel<<<1, 1, 0, stream>>>(w.offsets, w.starts, d.E, static_cast<int>(chunk));
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemsetAsync(w.perm, 0xFF, static_cast<size_t>(moe_padded_rows(NK, d.E)) * sizeof(int32_t), stream));
  permute_kernel<<<static_cast<unsigned>(d.E), 1024, 0, stream>>>(w.perm, w.row_of, w.idx, w.starts, NK);
  CUDA_CHECK_LAUNCH();
}

// A call's pinned host staging (MoeBlas::host_staging): the offsets and
// starts [2][E+1], and the same memory's device address.
struct Staging {
  int32_t* offsets;
  int32_t* offsets_dev;
};
Staging staging(MoeBlas& blas, const MoeDims& d) {
  auto* h = static_cast<int32_t*>(blas.host_staging(static_cast<size_t>(2 * (d.E + 1)) * sizeof(int32_t)));
  return Staging{h, static_cast<int32_t*>(blas.host_staging_on_device())};
}

// As route_on_device, then the offsets and starts written to the staging by
// a kernel (publish_kernel) and the event after it: queued, not waited for
// (HostLayout); then each
// token's rows in expert order (the combines' summation order).
void route(MoeBlas& blas, const MoeDims& d, const MoeWork& w, const Staging& st, const float* probs,
           cudaStream_t stream) {
  route_on_device(d, w, probs, blas.grouped_for(d.N, d.K, d.E, d.C, d.F) ? kMoeChunk : 1, stream);
  publish_kernel<<<1, 256, 0, stream>>>(st.offsets_dev, w.offsets, 2 * (d.E + 1));
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaEventRecord(blas.counts_event(), stream));
  order_by_expert_kernel<<<blocks_each(d.N, 128), 128, 0, stream>>>(w.ord_row, w.ord_w, w.row_of, w.idx, w.w, d.N,
                                                                    static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
}

// Where each expert's rows are: start[e] its first permuted row (a multiple
// of kMoeChunk in the grouped mode), rows(e) how many; start[E] the permuted
// rows in use.
struct Layout {
  std::vector<int32_t> off, start;  // [E+1] each
  int64_t rows(int64_t e) const { return off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)]; }
  int64_t first(int64_t e) const { return start[static_cast<size_t>(e)]; }
  int64_t used() const { return start.back(); }
};
// The layout on the host, waited for on first use: the looped mode needs it
// for every GEMM's shape, the grouped mode only for the weight gradients
// (and where cuBLAS refuses a batched call), by when the GPU has the call's
// other products queued. route queued the copy and its event.
class HostLayout {
 public:
  HostLayout(MoeBlas& blas, const Staging& st, int64_t E) : blas_(blas), st_(st), E_(E) {}
  const Layout& get() {
    if (!have_) {
      CUDA_CHECK(cudaEventSynchronize(blas_.counts_event()));
      L_ = Layout{std::vector<int32_t>(st_.offsets, st_.offsets + E_ + 1),
                  std::vector<int32_t>(st_.offsets + E_ + 1, st_.offsets + 2 * (E_ + 1))};
      have_ = true;
    }
    return L_;
  }

 private:
  MoeBlas& blas_;
  Staging st_;
  int64_t E_;
  Layout L_;
  bool have_ = false;
};

// One kind of expert product over every expert with rows, row-major as
// MoeBlas's: out[R_e, Nout] (bf16, =) = a[R_e, K] b_e^T (nt: b_e [Nout, K]) or
// a b_e (nn: b_e [K, Nout]), a and out the expert's permuted rows.
struct ExpertProduct {
  const bf16* const* b;  // E weight pointers
  const bf16* a;         // [P, K]
  bf16* out;             // [P, Nout]
};

// call() on h; where it says NOT_SUPPORTED (the handle's math mode?), once
// more in the default math mode, the handle's mode restored. *retried: whether
// the second try ran. Returns the last status.
template <class Call>
cublasStatus_t call_default_math_on_refusal(cublasHandle_t h, const Call& call, bool* retried) {
  cublasStatus_t status = call();
  *retried = status == CUBLAS_STATUS_NOT_SUPPORTED;
  if (!*retried) return status;
  cublasMath_t mode{};
  CUBLAS_CHECK(cublasGetMathMode(h, &mode));
  CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  status = call();
  CUBLAS_CHECK(cublasSetMathMode(h, mode));
  return status;
}

// The batched GEMM's pointer arrays, on the device from the padded starts:
// problem c * np + i is chunk c (rows [c T, c T + T) of a and out, T =
// kMoeChunk) times b_i of the expert e whose padded rows hold it
// (starts[e] <= c T < starts[e + 1]); a chunk at or past starts[E] (no
// expert's: the call runs every chunk that could exist) takes expert E - 1's
// weights, and its rows, beyond the rows in use, are read and written but
// never read back. A: ptrs[p], B: ptrs[cap + p], C: ptrs[2 cap + p].
struct ChunkOperands {
  ExpertPtrs b[2];
  const bf16* a[2];
  bf16* out[2];
};
__global__ void chunk_ptrs_kernel(void** ptrs, int64_t cap, ChunkOperands ops, int np, const int32_t* starts, int64_t E,
                                  int64_t chunks, int64_t K, int64_t Nout) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const int64_t r0 = c * kMoeChunk;
  int64_t lo = 0, hi = E - 1;  // the last e with starts[e] <= r0 (starts is non-decreasing, starts[0] = 0)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= r0)
      lo = mid;
    else
      hi = mid - 1;
  }
  for (int i = 0; i < np; ++i) {
    const int64_t p = c * np + i;
    ptrs[p] = const_cast<void*>(ops.b[i].p[lo]);
    ptrs[cap + p] = const_cast<bf16*>(ops.a[i] + r0 * K);
    ptrs[2 * cap + p] = ops.out[i] + r0 * Nout;
  }
}

// Every expert's products ps (1 or 2, the same shape) in one
// cublasGemmBatchedEx over all moe_max_chunks kMoeChunk-row chunks of the
// padded rows (chunk_ptrs_kernel: no host layout, no wait). slot: this call's
// index < kMoeGroupedCalls (its pointer arrays). Returns false, and runs
// nothing, where cuBLAS refuses the call: the caller loops instead.
bool grouped_products(MoeBlas& blas, bool nt, const MoeDims& d, int64_t Nout, int64_t K, const ExpertProduct* ps,
                      int np, const MoeWork& w, int slot, cudaStream_t stream) {
  RT_CHECK(slot >= 0 && slot < kMoeGroupedCalls && np >= 1 && np <= 2, "[cuda moe] internal: batched GEMM slot ", slot,
           " with ", np, " products");
  const int64_t chunks = moe_max_chunks(d.N * d.K, d.E), cap = 2 * chunks, P = chunks * np;
  void** dev = w.ptrs + slot * 3 * cap;
  ChunkOperands ops{};
  for (int i = 0; i < np; ++i) ops.b[i] = expert_ptrs(ps[i].b, d.E), ops.a[i] = ps[i].a, ops.out[i] = ps[i].out;
  chunk_ptrs_kernel<<<blocks_each(chunks, 128), 128, 0, stream>>>(dev, cap, ops, np, w.starts, d.E, chunks, K, Nout);
  CUDA_CHECK_LAUNCH();
  // column-major, as gemm(): out^T [Nout, T] = op(b) a^T, m = Nout, n = T, k = K
  const float one = 1.f, zero = 0.f;
  cublasHandle_t h = blas.handle();
  CUBLAS_CHECK(cublasSetStream(h, stream));
  auto call = [&] {
    return cublasGemmBatchedEx(
        h, nt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(Nout), static_cast<int>(kMoeChunk),
        static_cast<int>(K), &one, const_cast<const void* const*>(dev), CUDA_R_16BF, static_cast<int>(nt ? K : Nout),
        const_cast<const void* const*>(dev + cap), CUDA_R_16BF, static_cast<int>(K), &zero, dev + 2 * cap, CUDA_R_16BF,
        static_cast<int>(Nout), static_cast<int>(P), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  bool retried = false;
  const cublasStatus_t status = call_default_math_on_refusal(h, call, &retried);
  if (retried) {
    static bool said = false;
    if (!said)
      std::fprintf(stderr, "[cuda moe] cublasGemmBatchedEx %s\n",
                   status == CUBLAS_STATUS_SUCCESS
                       ? "runs only without CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION here: batched without it"
                       : "is not supported here: the expert GEMMs loop");
    said = true;
  }
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;  // the loop (the pointer kernel's output is unused)
  CUBLAS_CHECK(status);
  blas.count_grouped_call();
  return true;
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

// Every expert's g, u, a (bf16) and o on its gathered rows xe. The grouped
// mode runs over all moe_padded_rows rows (padding and the unused tail
// included: no host layout); the looped mode waits for the layout (hl) and
// runs each expert's rows. o is bf16 (in w.o's memory) when *o_bf16 comes
// back true (the grouped down product), fp32 otherwise; o_bf16 null: g and u
// only (the backward, whose act_grad_kernel recomputes a from them).
void experts_forward(MoeBlas& blas, const MoeDims& d, const MoeWork& w, HostLayout& hl, const bf16* x,
                     const bf16* const* gate, const bf16* const* up, const bf16* const* down, cudaStream_t stream,
                     const MoeBiasesT<bf16>& b, bool* o_bf16) {
  const int64_t NK = d.N * d.K, C = d.C, F = d.F, P = moe_padded_rows(NK, d.E);
  gather_kernel<<<blocks_for(P * C / 8, 256), 256, 0, stream>>>(w.xe, x, w.perm, P, C, static_cast<int>(d.K));
  CUDA_CHECK_LAUNCH();
  const bool grouped = blas.grouped_for(d.N, d.K, d.E, d.C, d.F);
  const ExpertProduct gate_up[2] = {{gate, w.xe, w.g}, {up, w.xe, w.u}};
  const bool gu_grouped = grouped && grouped_products(blas, true, d, F, C, gate_up, 2, w, 0, stream);
  if (!gu_grouped) {
    const Layout& L = hl.get();
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t r0 = L.first(e), R = L.rows(e);
      if (R == 0) continue;
      blas.matmul_nt(w.g + r0 * F, DType::bf16, w.xe + r0 * C, gate[e], R, F, C, 0.f, stream);
      blas.matmul_nt(w.u + r0 * F, DType::bf16, w.xe + r0 * C, up[e], R, F, C, 0.f, stream);
    }
  }
  // the rows the products wrote: all (grouped) or those in use (looped)
  const int64_t rows = gu_grouped ? P : hl.get().used();
  if (b.gate) add_expert_bias(w.g, b.gate, w, rows, d.E, F, stream);
  if (b.up) add_expert_bias(w.u, b.up, w, rows, d.E, F, stream);
  if (!o_bf16) return;
  // padding rows' g, u are products of zero rows (finite), the tail's of
  // whatever it held: no one reads their a
  if (d.glu_limit > 0.f)
    swiglu_clamped_forward(w.a, w.g, w.u, rows * F, d.glu_limit, d.glu_alpha, stream);
  else
    swiglu_forward(w.a, w.g, w.u, rows * F, stream);
  bf16* o16 = reinterpret_cast<bf16*>(w.o);
  const ExpertProduct down_p[1] = {{down, w.a, o16}};
  *o_bf16 = grouped && grouped_products(blas, true, d, C, F, down_p, 1, w, 1, stream);
  if (*o_bf16) {
    if (b.down) add_expert_bias(o16, b.down, w, P, d.E, C, stream);
    return;
  }
  const Layout& L = hl.get();
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = L.first(e), R = L.rows(e);
    if (R > 0) blas.matmul_nt(w.o + r0 * C, DType::f32, w.a + r0 * F, down[e], R, C, F, 0.f, stream);
  }
  if (b.down) add_expert_bias(w.o, b.down, w, L.used(), d.E, C, stream);
}

}  // namespace

void moe_forward(MoeBlas& blas, bf16* out, float* probs, const bf16* x, const bf16* router, const bf16* const* gate,
                 const bf16* const* up, const bf16* const* down, const MoeDims& d, int64_t* tokens_per_expert,
                 double* prob_sum, Scratch scratch, cudaStream_t stream, const MoeBiasesT<bf16>& b) {
  check_dims(d);
  const MoeWork w = bind(d, scratch);
  detail::check_aligned(x, "moe x");
  if (out) detail::check_aligned(out, "moe out");
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
    route_on_device(d, w, probs, 1, stream);
    add_counts(tokens_per_expert, w.offsets, d.E, stream);
    return;
  }
  const Staging st = staging(blas, d);
  route(blas, d, w, st, probs, stream);
  if (tokens_per_expert) add_counts(tokens_per_expert, w.offsets, d.E, stream);
  HostLayout hl(blas, st, d.E);
  bool o_bf16 = false;
  experts_forward(blas, d, w, hl, x, gate, up, down, stream, b, &o_bf16);
  const int K = static_cast<int>(d.K);
  const unsigned blocks = blocks_for(d.N * d.C / 8, 256);
  if (o_bf16)
    combine_out_kernel<<<blocks, 256, 0, stream>>>(out, Bf16Rows{reinterpret_cast<const bf16*>(w.o), d.C}, w.ord_row,
                                                   w.ord_w, d.N, d.C, K);
  else
    combine_out_kernel<<<blocks, 256, 0, stream>>>(out, F32Rows{w.o, d.C}, w.ord_row, w.ord_w, d.N, d.C, K);
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
  detail::check_aligned(dx, "moe dx");
  const int64_t NK = d.N * d.K, C = d.C, F = d.F, P = moe_padded_rows(NK, d.E);
  const int K = static_cast<int>(d.K);
  const Staging st = staging(blas, d);
  route(blas, d, w, st, probs, stream);  // recomputed from the forward's probabilities
  HostLayout hl(blas, st, d.E);
  experts_forward(blas, d, w, hl, x, gate, up, down, stream, b, nullptr);  // g, u (a: act_grad_kernel)
  const bool grouped = blas.grouped_for(d.N, d.K, d.E, d.C, d.F);
  // Gate and up as one: where each expert's up weights and gradient follow
  // its gate's (the engine's layout: HF names in natural order) and neither
  // has a bias, d_g and d_u are one [P, 2F] array (row r: d_g then d_u), so
  // the input gradient is one product of width 2F per expert (fp32 sums,
  // one bf16 row) and gate's and up's weight gradients one [2F, C] GEMM.
  const bool merged = blas.merged_gate_up(gate, up, dgate, dup, d.E, F * C) && !gb.gate && !gb.up;
  RT_CHECK(!merged || w.d_u == w.d_g + P * F, "[cuda moe] internal: d_g and d_u are not one array");
  const int64_t ldg = merged ? 2 * F : F;  // d_g's and d_u's row stride
  bf16* const d_u = merged ? w.d_g + F : w.d_u;
  // out[n] += w o: dy = dout[n] per row over every padded row (padding:
  // zeros). The down weight gradient is dy^T (w a) (dy in d_o's memory), or,
  // where the down bias's gradient needs d_o = w dout[n], d_o^T a (dy in o's
  // memory, spent after the d_a product).
  const bool weighted = !gb.down;
  bf16* dy = weighted ? w.d_o : reinterpret_cast<bf16*>(w.o);
  (weighted ? scatter_dout_kernel<false> : scatter_dout_kernel<true>)<<<blocks_for(P * C / 8, 256), 256, 0, stream>>>(
      dy, weighted ? nullptr : w.d_o, dout, w.w, w.perm, P, C, K);
  CUDA_CHECK_LAUNCH();
  // ga = dy Wd (w.d_a holds it), unweighted; then dw, and d_g, d_u from d_a = w ga
  const ExpertProduct down_p[1] = {{down, dy, w.d_a}};
  if (!(grouped && grouped_products(blas, false, d, F, C, down_p, 1, w, 2, stream))) {
    const Layout& L = hl.get();
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t r0 = L.first(e), R = L.rows(e);
      if (R > 0) blas.matmul_nn(w.d_a + r0 * F, DType::bf16, dy + r0 * C, down[e], R, F, C, 0.f, stream);
    }
  }
  {  // every padded row: a padding row (perm -1) gets d_g = d_u = 0, a = 0 and no dw
    const bool vec = F % 8 == 0, clamped = d.glu_limit > 0.f;
    using Kernel = void (*)(float*, bf16*, bf16*, int64_t, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                            const int32_t*, int64_t, int64_t, float, float);
    static constexpr Kernel kernels[2][2][2] = {
        {{act_grad_kernel<false, false, false>, act_grad_kernel<false, false, true>},
         {act_grad_kernel<false, true, false>, act_grad_kernel<false, true, true>}},
        {{act_grad_kernel<true, false, false>, act_grad_kernel<true, false, true>},
         {act_grad_kernel<true, true, false>, act_grad_kernel<true, true, true>}}};
    kernels[vec][clamped][weighted]<<<blocks_each(P, 8), 256, 0, stream>>>(w.dw, w.d_g, d_u, ldg, w.a, w.d_a, w.g, w.u,
                                                                           w.w, w.perm, P, F, d.glu_limit, d.glu_alpha);
    CUDA_CHECK_LAUNCH();
  }
  if (b.down) {  // dw += <dout[n], bd>
    bias_dot_kernel<<<blocks_each(P, 8), 256, 0, stream>>>(w.dw, dout, expert_ptrs(b.down, d.E), w.perm, w.idx, P, C,
                                                           K);
    CUDA_CHECK_LAUNCH();
  }
  // d_o (or dy), a, d_g, d_u and xe are ready: the weight-gradient lanes may
  // start here (their GEMMs are queued below, after the wait for the
  // layout); the rest of this call writes none of them
  blas.lanes_fork(stream);
  // the input gradients dxe = d_g Wg + d_u Wu: fp32 (looped), one bf16 row
  // (grouped, merged) or two, of gate and of up (grouped), in o's memory
  float* dxe = w.o;
  bf16* dxg = reinterpret_cast<bf16*>(w.o);
  bf16* dxu = dxg + P * C;
  // merged: one product of width 2F (d_gu [P, 2F] times [Wg; Wu] [2F, C],
  // gate[e] heading both); apart: two of width F
  const int np = merged ? 1 : 2;
  const int64_t Kw = merged ? 2 * F : F;
  const ExpertProduct dx_p[2] = {{gate, w.d_g, dxg}, {up, w.d_u, dxu}};
  const bool dx_grouped = grouped && grouped_products(blas, false, d, C, Kw, dx_p, np, w, 3, stream);
  if (!dx_grouped) {
    const Layout& L = hl.get();
    for (int64_t e = 0; e < d.E; ++e) {
      const int64_t r0 = L.first(e), R = L.rows(e);
      if (R == 0) continue;
      for (int i = 0; i < np; ++i)
        blas.matmul_nn(dxe + r0 * C, DType::f32, dx_p[i].a + r0 * Kw, dx_p[i].b[e], R, C, Kw, i == 0 ? 0.f : 1.f,
                       stream);
    }
  }
  if (merged) blas.count_merged_call();
  // routing weights -> probabilities -> logits -> x and the router
  router_grad_kernel<<<blocks_each(d.N, 8), 256, 0, stream>>>(w.dl, probs, w.idx, w.w, w.dw, dprob, d.N, d.E, K,
                                                              d.norm_topk, d.topk_softmax);
  CUDA_CHECK_LAUNCH();
  if (gb.router) bias_grad(gb.router, w.dl, d.N, d.E, stream);                // the router bias: dl summed over tokens
  blas.matmul_nn(w.dxr, DType::f32, w.dl, router, d.N, C, d.E, 0.f, stream);  // dxr [N,C] = dl [N,E] Wr [E,C]
  blas.matmul_tn(drouter, DType::f32, w.dl, x, d.E, C, d.N, 1.f, stream);     // dWr [E,C] += dl^T x
  const unsigned blocks = blocks_for(d.N * C / 8, 256);
  if (dx_grouped && merged)
    combine_dx_kernel<<<blocks, 256, 0, stream>>>(dx, Bf16Rows{dxg, C}, w.dxr, w.ord_row, d.N, C, K);
  else if (dx_grouped)
    combine_dx_kernel<<<blocks, 256, 0, stream>>>(dx, Bf16PairRows{dxg, dxu, C}, w.dxr, w.ord_row, d.N, C, K);
  else
    combine_dx_kernel<<<blocks, 256, 0, stream>>>(dx, F32Rows{dxe, C}, w.dxr, w.ord_row, d.N, C, K);
  CUDA_CHECK_LAUNCH();
  // The weight gradients, which need each expert's row count: the call's one
  // wait for the layout (the grouped mode's first), with the products above
  // queued on the GPU. On the lanes when there are some (MoeBlas), the
  // call's stream otherwise; expert e on lane e % lanes.
  const Layout& L = hl.get();
  const int lanes = blas.wgrad_lanes();
  auto lane_of = [&](int64_t e) { return lanes == 0 ? -1 : static_cast<int>(e % lanes); };  // -1: the call's stream
  auto weight_grad = [&](int64_t e, float* dw, const bf16* rows_a, const bf16* rows_b, int64_t M, int64_t Nn,
                         int64_t R) {
    if (lane_of(e) < 0)
      blas.matmul_tn(dw, DType::f32, rows_a, rows_b, M, Nn, R, 1.f, stream);
    else
      blas.lane_matmul_tn(lane_of(e), dw, DType::f32, rows_a, rows_b, M, Nn, R, 1.f);
  };
  auto wgrad_stream = [&](int64_t e) { return lane_of(e) < 0 ? stream : blas.lane_stream(lane_of(e)); };
  for (int64_t e = 0; e < d.E; ++e) {
    const int64_t r0 = L.first(e), R = L.rows(e);
    if (R == 0) continue;
    weight_grad(e, ddown[e], w.d_o + r0 * C, w.a + r0 * F, C, F, R);  // dWd += dy^T (w a), or d_o^T a
    if (merged) {                                                     // [dWg; dWu] [2F, C] += d_gu^T xe
      weight_grad(e, dgate[e], w.d_g + r0 * 2 * F, w.xe + r0 * C, 2 * F, C, R);
    } else if (!blas.matmul_tn_pair(lane_of(e), dgate[e], dup[e], w.d_g + r0 * F, w.d_u + r0 * F, w.xe + r0 * C, F, C,
                                    R, 1.f, stream)) {  // dWg += d_g^T xe and dWu += d_u^T xe: one launch if it can
      weight_grad(e, dgate[e], w.d_g + r0 * F, w.xe + r0 * C, F, C, R);
      weight_grad(e, dup[e], w.d_u + r0 * F, w.xe + r0 * C, F, C, R);
    }
    if (gb.down) bias_grad(gb.down[e], w.d_o + r0 * C, R, C, wgrad_stream(e));
    if (gb.gate) bias_grad(gb.gate[e], w.d_g + r0 * F, R, F, wgrad_stream(e));
    if (gb.up) bias_grad(gb.up[e], w.d_u + r0 * F, R, F, wgrad_stream(e));
  }
  blas.lanes_join(stream);  // the weight gradients are done before anything after this call
}

}  // namespace rt::cuda
