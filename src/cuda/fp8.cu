// The cuBLASLt FP8 GEMM (block-scaled or with scalar scales) and the FP8
// linear layer (declared in cuda/fp8.h; cpu/fp8.h is the specification they
// match bit for bit up to the GEMM's fp32 summation order); the quantizers
// are fp8_quantize.cu's.
#include <cublasLt.h>

#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/fp8.h"
#include "cuda/check.h"
#include "cuda/fp8.h"
#include "cuda/kernel_util.cuh"
#include "cuda/lt_plan.h"
#include "cuda/ops.h"

namespace rt::cuda {

bool fp8_supported(int device, MatmulMode mode, std::string* why) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  const bool fp8_cores = p.major > 8 || (p.major == 8 && p.minor >= 9);
  if (mode == MatmulMode::fp8_tensor) {
    // per-tensor scaled FP8 in cuBLASLt: every card with FP8 tensor cores
    // (compute capability 8.9+: Ada, Hopper, Blackwell; tested on Hopper)
    if (fp8_cores) return true;
    if (why)
      *why = cat("GPU ", device, " (", p.name, ") is sm_", p.major, p.minor, ": --matmul fp8 --fp8-scaling tensor ",
                 "runs cuBLASLt's per-tensor scaled FP8 GEMM, which needs FP8 tensor cores (sm_89 and newer: RTX "
                 "4090, H100, ...); this card has none; use --matmul bf16 (the default)");
    return false;
  }
  if (p.major == 9) return true;
  if (why) {
    *why = cat("GPU ", device, " (", p.name, ") is sm_", p.major, p.minor, ": --matmul fp8 runs cuBLASLt's FP8 GEMM ",
               "with 1x128/128x128 block scales (--fp8-scaling block, the default), which cuBLASLt implements on "
               "Hopper (sm_90: H100, H200) only; ",
               !fp8_cores ? "this card has no FP8 tensor cores; use --matmul bf16 (the default)"
               : p.major == 8
                   ? "on Ada (sm_89) cuBLASLt's FP8 takes per-tensor scales: use --fp8-scaling tensor, or --matmul bf16"
                   : "Blackwell's block-scaled FP8 is MXFP8 (32-element e8m0 scales), not wired here; use --matmul "
                     "bf16 (the default)");
  }
  return false;
}

namespace {

// out[n, o] += bias[o] in fp32, rounded to bf16 once more.
__global__ void add_bias_kernel(bf16* out, const bf16* bias, int64_t N, int64_t O) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * O) return;
  out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % O]));
}

}  // namespace

// ---- the GEMM ----

namespace {

using Fp8PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool, int, int>;

int32_t scale_mode(Fp8Scaling s) {
  return s == Fp8Scaling::vec128       ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
         : s == Fp8Scaling::blk128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                       : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}
const char* scale_name(Fp8Scaling s) {
  return s == Fp8Scaling::vec128 ? "1x128" : s == Fp8Scaling::blk128x128 ? "128x128" : "tensor";
}

}  // namespace

struct Fp8Gemm::Impl {
  explicit Impl(size_t workspace_bytes) : lt(workspace_bytes) {}
  LtContext lt;  // first: the plans go before the handle
  std::map<Fp8PlanKey, std::unique_ptr<LtPlan>> plans;

  // Row-major out[M,N] = a[M,K] b[N,K]^T is column-major out^T[N,M] =
  // op(A) B with cuBLAS A := b (stored K x N, TRANSA = T) and B := a (stored
  // K x M, TRANSB = N): the "TN" layout FP8 needs.
  // The scale pointers are set before the heuristic is asked (the order
  // NVIDIA's block-scaled samples use) and again before every call.
  LtPlan& plan_get(int64_t M, int64_t N, int64_t K, DType out_type, bool accumulate, Fp8Scaling a_mode,
                   Fp8Scaling b_mode, const float* a_scale, const float* b_scale) {
    Fp8PlanKey key{M, N, K, static_cast<int>(out_type), accumulate, static_cast<int>(a_mode), static_cast<int>(b_mode)};
    auto it = plans.find(key);
    if (it != plans.end()) return *it->second;
    auto p = std::make_unique<LtPlan>();
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    const int32_t mode_a = scale_mode(b_mode), mode_b = scale_mode(a_mode);  // cuBLAS A is our b
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)));
    // FAST_ACCUM stays at its default (off): the periodic promotion to fp32
    // that DeepSeek-V3 relies on; block-scaled modes take no other setting,
    // and per-tensor scaling keeps it off too (the same accumulation bound).
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, K, N, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, K, M, K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, out_type == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &lt.workspace_bytes, sizeof(lt.workspace_bytes));
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(lt.handle, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    RT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "[cuda fp8 gemm] cuBLASLt has no FP8 algorithm for M=", M,
             " N=", N, " K=", K, " out=", out_type == DType::bf16 ? "bf16" : "fp32", " beta=", accumulate ? 1 : 0,
             " scales a=", scale_name(a_mode), " b=", scale_name(b_mode), " (status ", cublasLtGetStatusString(st),
             "); FP8 needs dimensions that are multiples of 16, block scales sm_90 and per-tensor scales sm_89 or "
             "sm_90; use --matmul bf16");
    p->algo = result.algo;
    auto& ref = *p;
    plans.emplace(key, std::move(p));
    return ref;
  }
};

Fp8Gemm::Fp8Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>(workspace_bytes)) {}
Fp8Gemm::~Fp8Gemm() = default;
size_t Fp8Gemm::plans_cached() const { return impl_->plans.size(); }

void Fp8Gemm::matmul(void* out, DType out_type, const uint8_t* a, const float* a_scale, Fp8Scaling a_mode,
                     const uint8_t* b, const float* b_scale, Fp8Scaling b_mode, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream) {
  RT_CHECK(beta == 0.f || beta == 1.f, "[cuda fp8 gemm] beta must be 0 or 1, got ", beta);
  RT_CHECK(beta == 0.f || out_type == DType::f32, "[cuda fp8 gemm] accumulation (beta=1) needs an fp32 output");
  RT_CHECK(!(a_mode == Fp8Scaling::blk128x128 && b_mode == Fp8Scaling::blk128x128),
           "[cuda fp8 gemm] cuBLASLt takes 128x128 block scales on one operand at most");
  RT_CHECK((a_mode == Fp8Scaling::tensor) == (b_mode == Fp8Scaling::tensor),
           "[cuda fp8 gemm] per-tensor scales on one operand and block scales on the other: not supported");
  RT_CHECK(M > 0 && N > 0 && K > 0 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0, "[cuda fp8 gemm] bad shape M=", M,
           " N=", N, " K=", K, " (all > 0 and multiples of 16)");
  detail::check_aligned(out, "fp8 gemm out");
  detail::check_aligned(a, "fp8 gemm a");
  detail::check_aligned(b, "fp8 gemm b");
  detail::check_aligned(a_scale, "fp8 gemm a scales");
  detail::check_aligned(b_scale, "fp8 gemm b scales");
  LtPlan& p = impl_->plan_get(M, N, K, out_type, beta != 0.f, a_mode, b_mode, a_scale, b_scale);
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  const float alpha = 1.f;
  CUBLAS_CHECK(cublasLtMatmul(impl_->lt.handle, p.desc, &alpha, b, p.la, a, p.lb, &beta, out, p.lc, out, p.lc, &p.algo,
                              impl_->lt.workspace, impl_->lt.workspace_bytes, stream));
}

// ---- the linear layer ----

namespace {

// Grows buf to at least need bytes. Work queued on `stream` (the whole
// device when null) may still read the old buffer: synchronised first.
void grow_device_buffer(void*& buf, size_t& bytes, size_t need, cudaStream_t stream) {
  if (need <= bytes) return;
  CUDA_CHECK(stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize());
  if (buf) CUDA_CHECK(cudaFree(buf));
  buf = nullptr;
  CUDA_CHECK(cudaMalloc(&buf, need));
  bytes = need;
}

// Regions of the given byte sizes, each 256-byte aligned (fp8_region), in a row.
template <size_t Nr>
size_t regions_bytes(const size_t (&sizes)[Nr]) {
  size_t total = 0;
  for (size_t b : sizes) total += fp8_region(b);
  return total;
}
template <size_t Nr>
void split_regions(void* base, const size_t (&sizes)[Nr], void* (&out)[Nr]) {
  size_t off = 0;
  for (size_t i = 0; i < Nr; ++i) {
    out[i] = static_cast<char*>(base) + off;
    off += fp8_region(sizes[i]);
  }
}

}  // namespace

struct Fp8Linear::Impl {
  explicit Impl(MatmulMode m) : mode(m) {}
  const MatmulMode mode;
  bool tensor() const { return mode == MatmulMode::fp8_tensor; }
  Fp8Gemm gemm;
  void* buf = nullptr;
  size_t bytes = 0;
  // share_input's state: the input, its codes along I (rows) and along N
  // (cols) once made, in a buffer of their own
  const bf16* shared_x = nullptr;
  int64_t shared_N = 0, shared_I = 0;
  bool have_rows = false, have_cols = false;
  void* shared_buf = nullptr;
  size_t shared_bytes = 0;
  uint8_t *sq = nullptr, *sqt = nullptr;
  float *ss = nullptr, *sst = nullptr;  // per-tensor scaling: ss is the slot, sst unused
  bool have_amax = false;               // per-tensor scaling: the slot's amax is made
  // share_weights' state: one entry per distinct weight seen in the scope,
  // reused in order by the next scope (a dense model's layers have the same
  // shapes, so buffers grow on the first layer only)
  struct WeightCodes {
    const bf16* w = nullptr;
    int64_t O = 0, I = 0;
    void* buf = nullptr;
    size_t bytes = 0;
    uint8_t *q = nullptr, *qt = nullptr;
    float *s = nullptr, *st = nullptr;  // per-tensor scaling: s is the slot (q and qt share it), st unused
  };
  bool weights_shared = false;
  std::vector<WeightCodes> wcodes;
  size_t wnext = 0;
  // the taps (tap_begin): kFp8Taps slots of kFp8TensorSlot bytes in one buffer
  struct Tap {
    const bf16* x = nullptr;
    int64_t n = 0;
    bool open = false, filled = false;
  };
  Tap taps[kFp8Taps];
  float* tap_slots = nullptr;
  float* tap_slot(int i) const { return tap_slots + i * (kFp8TensorSlot / sizeof(float)); }
  // x[n]'s slot when a tap on it holds its producer's amax, else null
  float* tapped(const bf16* x, int64_t n) const {
    for (int i = 0; i < kFp8Taps; ++i)
      if (taps[i].open && taps[i].filled && taps[i].x == x && taps[i].n == n) return tap_slot(i);
    return nullptr;
  }
  // x[R, C]'s per-tensor codes and/or transposed codes (fp8_quantize_tensor):
  // with the tap's amax when x is tapped (its slot then holds the scale),
  // else an amax pass into `slot`. Returns the slot the scale is in.
  const float* tensor_codes(uint8_t* q, uint8_t* qt, float* slot, const bf16* x, int64_t R, int64_t C,
                            cudaStream_t stream) const {
    if (float* t = tapped(x, R * C)) {
      fp8_tensor_codes(q, qt, t, x, R, C, stream);
      return t;
    }
    fp8_quantize_tensor(q, qt, slot, x, R, C, stream);
    return slot;
  }
  ~Impl() {
    if (tap_slots) cudaFree(tap_slots);
    if (buf) cudaFree(buf);
    if (shared_buf) cudaFree(shared_buf);
    for (auto& c : wcodes)
      if (c.buf) cudaFree(c.buf);
  }
  // w's codes (and transposed codes) while weights are shared, else null
  const WeightCodes* weight_codes(const bf16* w, int64_t O, int64_t I, cudaStream_t stream) {
    if (!weights_shared) return nullptr;
    for (size_t j = 0; j < wnext; ++j)
      if (wcodes[j].w == w && wcodes[j].O == O && wcodes[j].I == I) return &wcodes[j];
    if (wnext == wcodes.size()) wcodes.emplace_back();
    WeightCodes& c = wcodes[wnext++];
    if (tensor()) {
      const size_t sizes[3] = {static_cast<size_t>(O * I), static_cast<size_t>(O * I),
                               kFp8TensorSlot};  // = fp8_shared_weight_bytes(O, I, fp8_tensor)
      grow_device_buffer(c.buf, c.bytes, regions_bytes(sizes), stream);
      void* r[3];
      split_regions(c.buf, sizes, r);
      c.q = static_cast<uint8_t*>(r[0]), c.qt = static_cast<uint8_t*>(r[1]);
      c.s = static_cast<float*>(r[2]), c.st = nullptr;
      c.w = w, c.O = O, c.I = I;
      fp8_quantize_tensor(c.q, c.qt, c.s, w, O, I, stream);
      return &c;
    }
    const size_t sizes[4] = {static_cast<size_t>(O * I), static_cast<size_t>(O * I),
                             static_cast<size_t>(fp8_scales_128x128(O, I)) * 4,
                             static_cast<size_t>(fp8_scales_128x128(I, O)) * 4};  // = fp8_shared_weight_bytes
    grow_device_buffer(c.buf, c.bytes, regions_bytes(sizes), stream);
    void* r[4];
    split_regions(c.buf, sizes, r);
    c.q = static_cast<uint8_t*>(r[0]), c.qt = static_cast<uint8_t*>(r[1]);
    c.s = static_cast<float*>(r[2]), c.st = static_cast<float*>(r[3]);
    c.w = w, c.O = O, c.I = I;
    fp8_quantize_128x128(c.q, c.s, c.qt, c.st, w, O, I, stream);
    return &c;
  }
  bool shares(const bf16* x, int64_t N, int64_t I) const {
    return shared_x && x == shared_x && N == shared_N && I == shared_I;
  }
  // x's codes along I: made on first use while shared (per-tensor scaling:
  // the amax once, then the codes or the transposed codes from it)
  void shared_amax(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (have_amax) return;
    if (float* t = tapped(x, N * I))
      ss = t;  // the producer's amax; the codes write the scale there
    else
      fp8_tensor_amax(ss, x, N * I, stream);
    have_amax = true;
  }
  void rows(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (have_rows) return;
    if (tensor()) {
      shared_amax(x, N, I, stream);
      fp8_tensor_codes(sq, nullptr, ss, x, N, I, stream);
    } else {
      fp8_quantize_1x128(sq, ss, x, N, I, false, stream);
    }
    have_rows = true;
  }
  void cols(const bf16* x, int64_t N, int64_t I, cudaStream_t stream) {
    if (have_cols) return;
    if (tensor()) {
      shared_amax(x, N, I, stream);
      fp8_tensor_codes(nullptr, sqt, ss, x, N, I, stream);
    } else {
      fp8_quantize_1x128(sqt, sst, x, I, N, true, stream);
    }
    have_cols = true;
  }
  // Carves regions of the given byte sizes (each 256-byte aligned) out of
  // one buffer that grows to the largest request (synchronising the stream
  // first: the old buffer may still be read by queued work).
  template <size_t Nr>
  void carve(const size_t (&sizes)[Nr], void* (&out)[Nr], cudaStream_t stream) {
    grow_device_buffer(buf, bytes, regions_bytes(sizes), stream);
    split_regions(buf, sizes, out);
  }
};

Fp8Linear::Fp8Linear(MatmulMode mode) : impl_(std::make_unique<Impl>(mode)) {
  RT_CHECK(matmul_is_fp8(mode), "[cuda fp8 linear] internal: made for --matmul bf16");
}
Fp8Linear::~Fp8Linear() = default;
Fp8Gemm& Fp8Linear::gemm() { return impl_->gemm; }

void Fp8Linear::share_input(const bf16* x, int64_t N, int64_t I) {
  Impl& m = *impl_;
  RT_CHECK(!m.shared_x, "[cuda fp8 linear] share_input while another input is shared");
  RT_CHECK(x && N > 0 && I > 0, "[cuda fp8 linear] share_input: bad input ", N, " x ", I);
  m.shared_x = x, m.shared_N = N, m.shared_I = I;
  m.have_rows = m.have_cols = m.have_amax = false;
  if (m.tensor()) {
    const size_t sizes[3] = {static_cast<size_t>(N * I), static_cast<size_t>(N * I),
                             kFp8TensorSlot};  // = fp8_shared_input_bytes(N, I, fp8_tensor)
    grow_device_buffer(m.shared_buf, m.shared_bytes, regions_bytes(sizes), nullptr);
    void* r[3];
    split_regions(m.shared_buf, sizes, r);
    m.sq = static_cast<uint8_t*>(r[0]), m.sqt = static_cast<uint8_t*>(r[1]);
    m.ss = static_cast<float*>(r[2]), m.sst = nullptr;
    return;
  }
  const size_t sizes[4] = {static_cast<size_t>(N * I), static_cast<size_t>(N * I),
                           static_cast<size_t>(fp8_scales_1x128(N, I)) * 4,
                           static_cast<size_t>(fp8_scales_1x128(I, N)) * 4};  // = fp8_shared_input_bytes
  grow_device_buffer(m.shared_buf, m.shared_bytes, regions_bytes(sizes), nullptr);
  void* r[4];
  split_regions(m.shared_buf, sizes, r);
  m.sq = static_cast<uint8_t*>(r[0]), m.sqt = static_cast<uint8_t*>(r[1]);
  m.ss = static_cast<float*>(r[2]), m.sst = static_cast<float*>(r[3]);
}

void Fp8Linear::share_weights() {
  RT_CHECK(!impl_->weights_shared, "[cuda fp8 linear] share_weights while weights are shared");
  impl_->weights_shared = true;
  impl_->wnext = 0;
}

void Fp8Linear::end_share_weights() {
  impl_->weights_shared = false;
  for (auto& c : impl_->wcodes) c.w = nullptr;
  impl_->wnext = 0;
}

bool fp8_fused_amax_default() {
  static const bool on = [] {
    const char* v = std::getenv("RAMTRAIN_FP8_FUSED_AMAX");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

int Fp8Linear::tap_begin(const bf16* x, int64_t n, cudaStream_t stream) {
  Impl& m = *impl_;
  if (!m.tensor() || !x || n <= 0) return -1;
  for (int i = 0; i < kFp8Taps; ++i) {
    if (m.taps[i].open) continue;
    if (!m.tap_slots) CUDA_CHECK(cudaMalloc(&m.tap_slots, kFp8Taps * kFp8TensorSlot));
    CUDA_CHECK(cudaMemsetAsync(m.tap_slot(i), 0, kFp8TensorSlot, stream));
    m.taps[i] = {x, n, true, false};
    return i;
  }
  return -1;
}

uint32_t* Fp8Linear::tap_key(const bf16* x, int64_t n) {
  Impl& m = *impl_;
  for (int i = 0; i < kFp8Taps; ++i) {
    Impl::Tap& t = m.taps[i];
    if (!t.open || t.x != x || t.n != n) continue;
    if (t.filled) {  // a second write: the key would hold the max of both
      t.open = false;
      return nullptr;
    }
    t.filled = true;
    return reinterpret_cast<uint32_t*>(m.tap_slot(i)) + 1;
  }
  return nullptr;
}

void Fp8Linear::tap_end(int i) {
  if (i >= 0 && i < kFp8Taps) impl_->taps[i] = {};
}

void Fp8Linear::end_share() {
  impl_->shared_x = nullptr;
  impl_->have_rows = impl_->have_cols = impl_->have_amax = false;
}

namespace {
size_t f32_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
size_t u8_bytes(int64_t n) { return static_cast<size_t>(n); }
void check_linear_shape(const char* what, int64_t N, int64_t I, int64_t O) {
  RT_CHECK(fp8_linear_eligible(N, I, O), "[cuda ", what, "] FP8 linear needs N, I, O multiples of 16, got N=", N,
           " I=", I, " O=", O);
}
}  // namespace

void Fp8Linear::forward(bf16* out, const bf16* x, const bf16* w, const bf16* bias, int64_t N, int64_t I, int64_t O,
                        cudaStream_t stream) {
  check_linear_shape("fp8 linear_forward", N, I, O);
  Impl& m = *impl_;
  if (m.tensor()) {
    tensor_forward(out, x, w, N, I, O, stream);
    add_bias(out, bias, N, O, stream);
    return;
  }
  const bool shared = m.shares(x, N, I);
  const Impl::WeightCodes* wc = m.weight_codes(w, O, I, stream);
  void* r[4];
  m.carve({u8_bytes(shared ? 0 : N * I), f32_bytes(shared ? 0 : fp8_scales_1x128(N, I)), u8_bytes(wc ? 0 : O * I),
           f32_bytes(wc ? 0 : fp8_scales_128x128(O, I))},
          r, stream);
  auto* qx = static_cast<uint8_t*>(r[0]);
  auto* sx = static_cast<float*>(r[1]);
  auto* qw = static_cast<uint8_t*>(r[2]);
  auto* sw = static_cast<float*>(r[3]);
  if (shared) {
    m.rows(x, N, I, stream);
    qx = m.sq, sx = m.ss;
  } else {
    fp8_quantize_1x128(qx, sx, x, N, I, false, stream);
  }
  if (wc)
    qw = wc->q, sw = wc->s;
  else
    fp8_quantize_128x128(qw, sw, nullptr, nullptr, w, O, I, stream);
  impl_->gemm.matmul(out, DType::bf16, qx, sx, Fp8Scaling::vec128, qw, sw, Fp8Scaling::blk128x128, N, O, I, 0.f,
                     stream);
  add_bias(out, bias, N, O, stream);
}

void Fp8Linear::backward(bf16* dx, float* dw, float* dbias, const bf16* dout, const bf16* x, const bf16* w, int64_t N,
                         int64_t I, int64_t O, cudaStream_t stream) {
  check_linear_shape("fp8 linear_backward", N, I, O);
  if (impl_->tensor()) {
    tensor_backward(dx, dw, dout, x, w, N, I, O, stream);
  } else if (dx) {  // dx[N, I] = dq(dout)[N, O] @ dq(w^T)[I, O]^T
    const Impl::WeightCodes* wc = impl_->weight_codes(w, O, I, stream);
    const int64_t wn = wc ? 0 : O * I;
    void* r[6];
    impl_->carve(
        {u8_bytes(N * O), f32_bytes(fp8_scales_1x128(N, O)), u8_bytes(wn), f32_bytes(wc ? 0 : fp8_scales_128x128(O, I)),
         u8_bytes(wn), f32_bytes(wc ? 0 : fp8_scales_128x128(I, O))},
        r, stream);
    auto* qdy = static_cast<uint8_t*>(r[0]);
    auto* sdy = static_cast<float*>(r[1]);
    auto* qwt = static_cast<uint8_t*>(r[4]);
    auto* swt = static_cast<float*>(r[5]);
    fp8_quantize_1x128(qdy, sdy, dout, N, O, false, stream);
    if (wc)
      qwt = wc->qt, swt = wc->st;
    else
      fp8_quantize_128x128(static_cast<uint8_t*>(r[2]), static_cast<float*>(r[3]), qwt, swt, w, O, I, stream);
    impl_->gemm.matmul(dx, DType::bf16, qdy, sdy, Fp8Scaling::vec128, qwt, swt, Fp8Scaling::blk128x128, N, I, O, 0.f,
                       stream);
  }
  if (dw && !impl_->tensor()) {  // dw[O, I] += dq(dout^T)[O, N] @ dq(x^T)[I, N]^T, both along tokens
    Impl& m = *impl_;
    const bool shared = m.shares(x, N, I);
    void* r[4];
    m.carve({u8_bytes(O * N), f32_bytes(fp8_scales_1x128(O, N)), u8_bytes(shared ? 0 : I * N),
             f32_bytes(shared ? 0 : fp8_scales_1x128(I, N))},
            r, stream);
    auto* qdyt = static_cast<uint8_t*>(r[0]);
    auto* sdyt = static_cast<float*>(r[1]);
    auto* qxt = static_cast<uint8_t*>(r[2]);
    auto* sxt = static_cast<float*>(r[3]);
    fp8_quantize_1x128(qdyt, sdyt, dout, O, N, true, stream);
    if (shared) {
      m.cols(x, N, I, stream);
      qxt = m.sqt, sxt = m.sst;
    } else {
      fp8_quantize_1x128(qxt, sxt, x, I, N, true, stream);
    }
    impl_->gemm.matmul(dw, DType::f32, qdyt, sdyt, Fp8Scaling::vec128, qxt, sxt, Fp8Scaling::vec128, O, I, N, 1.f,
                       stream);
  }
  if (dbias) bias_grad(dbias, dout, N, O, stream);
}

void Fp8Linear::add_bias(bf16* out, const bf16* bias, int64_t N, int64_t O, cudaStream_t stream) {
  if (!bias) return;
  add_bias_kernel<<<static_cast<unsigned>(detail::ceil_div(N * O, 256)), 256, 0, stream>>>(out, bias, N, O);
  CUDA_CHECK_LAUNCH();
}

// Per-tensor scaling (cpu::fp8_tensor_linear_forward): y = Qt(x) Qt(w)^T.
void Fp8Linear::tensor_forward(bf16* out, const bf16* x, const bf16* w, int64_t N, int64_t I, int64_t O,
                               cudaStream_t stream) {
  Impl& m = *impl_;
  const bool shared = m.shares(x, N, I);
  const Impl::WeightCodes* wc = m.weight_codes(w, O, I, stream);
  void* r[4];
  m.carve(
      {u8_bytes(shared ? 0 : N * I), shared ? 0 : kFp8TensorSlot, u8_bytes(wc ? 0 : O * I), wc ? 0 : kFp8TensorSlot}, r,
      stream);
  auto* qx = static_cast<uint8_t*>(r[0]);
  const float* sx = nullptr;
  auto* qw = static_cast<uint8_t*>(r[2]);
  auto* sw = static_cast<float*>(r[3]);
  if (shared) {
    m.rows(x, N, I, stream);
    qx = m.sq, sx = m.ss;
  } else {
    sx = m.tensor_codes(qx, nullptr, static_cast<float*>(r[1]), x, N, I, stream);
  }
  if (wc)
    qw = wc->q, sw = wc->s;
  else
    fp8_quantize_tensor(qw, nullptr, sw, w, O, I, stream);
  m.gemm.matmul(out, DType::bf16, qx, sx, Fp8Scaling::tensor, qw, sw, Fp8Scaling::tensor, N, O, I, 0.f, stream);
}

// Per-tensor scaling (cpu::fp8_tensor_linear_backward): dy is quantized once,
// into its codes (dgrad, along O) and transposed codes (wgrad, along N);
// dx = Qt(dy) Qt(w) with w's transposed codes, dw += Qt(dy)^T Qt(x) with x's.
void Fp8Linear::tensor_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int64_t N,
                                int64_t I, int64_t O, cudaStream_t stream) {
  if (!dx && !dw) return;
  Impl& m = *impl_;
  const Impl::WeightCodes* wc = dx ? m.weight_codes(w, O, I, stream) : nullptr;
  const bool shared = dw && m.shares(x, N, I);
  const bool own_w = dx && !wc, own_x = dw && !shared;
  void* r[7];
  m.carve({u8_bytes(dx ? N * O : 0), u8_bytes(dw ? N * O : 0), kFp8TensorSlot, u8_bytes(own_w ? O * I : 0),
           own_w ? kFp8TensorSlot : 0, u8_bytes(own_x ? N * I : 0), own_x ? kFp8TensorSlot : 0},
          r, stream);
  auto* qdy = static_cast<uint8_t*>(r[0]);
  auto* qdyt = static_cast<uint8_t*>(r[1]);
  const float* sdy =
      m.tensor_codes(dx ? qdy : nullptr, dw ? qdyt : nullptr, static_cast<float*>(r[2]), dout, N, O, stream);
  if (dx) {  // dx[N, I] = Qt(dy)[N, O] @ Qt(w^T)[I, O]^T
    const uint8_t* qwt = wc ? wc->qt : static_cast<uint8_t*>(r[3]);
    const float* sw = wc ? wc->s : static_cast<float*>(r[4]);
    if (!wc) fp8_quantize_tensor(nullptr, static_cast<uint8_t*>(r[3]), static_cast<float*>(r[4]), w, O, I, stream);
    m.gemm.matmul(dx, DType::bf16, qdy, sdy, Fp8Scaling::tensor, qwt, sw, Fp8Scaling::tensor, N, I, O, 0.f, stream);
  }
  if (dw) {  // dw[O, I] += Qt(dy^T)[O, N] @ Qt(x^T)[I, N]^T
    const uint8_t* qxt = static_cast<uint8_t*>(r[5]);
    const float* sx = static_cast<float*>(r[6]);
    if (shared) {
      m.cols(x, N, I, stream);
      qxt = m.sqt, sx = m.ss;
    } else {
      sx = m.tensor_codes(nullptr, static_cast<uint8_t*>(r[5]), static_cast<float*>(r[6]), x, N, I, stream);
    }
    m.gemm.matmul(dw, DType::f32, qdyt, sdy, Fp8Scaling::tensor, qxt, sx, Fp8Scaling::tensor, O, I, N, 1.f, stream);
  }
}

}  // namespace rt::cuda
