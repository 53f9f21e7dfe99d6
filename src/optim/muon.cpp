// See muon.h. No implicit FP contraction: every op below is rounded once, as
// written (the tests' reference computes the same formulas).
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "model/weight_map.h"
#include "optim/adamw.h"
#include "optim/adamw_math_simd.h"
#include "optim/muon_unit.h"
#include "state/host_state.h"

namespace rt {

namespace {
constexpr int64_t kGrain = 1 << 16;  // elements per thread-pool task of the elementwise loops
constexpr int kScratchSlots = 4;
uint64_t scratch_buffer_bytes(int64_t n) { return (static_cast<uint64_t>(n) * 4 + 63) / 64 * 64; }  // HostBuffer's

HostBuffer* thread_scratch() {
  thread_local HostBuffer buf[kScratchSlots];
  return buf;
}

}  // namespace

uint64_t muon_scratch_held() {
  uint64_t b = 0;
  for (int k = 0; k < kScratchSlots; ++k) b += thread_scratch()[k].n ? scratch_buffer_bytes(thread_scratch()[k].n) : 0;
  return b;
}

float* muon_scratch(int slot, int64_t n) {
  RT_CHECK(slot >= 0 && slot < kScratchSlots && n >= 0, "[muon] bad scratch request: slot ", slot, ", ", n, " floats");
  HostBuffer& b = thread_scratch()[slot];
  if (b.n < static_cast<size_t>(n)) {
    b = HostBuffer();  // the old one goes first: the peak is the new size
    b = HostBuffer(static_cast<size_t>(n), "the Muon update scratch (U, O, a decoded matrix or decoded moments)");
  }
  return b.p;
}

uint64_t muon_scratch_bytes(const ModelSpec& s, MasterStorage master, bool quantized, bool pipelined) {
  // per unit (HostState's: embed, layers, head), the longest m and v range of
  // the quantized update (optim/muon_unit.cpp): a matrix whole, other tensors in pieces
  const int64_t L = s.n_layers;
  std::vector<int64_t> rm(static_cast<size_t>(L + 2), 0), rv(rm.size(), 0);
  int64_t max_matrix = 0;
  for (const WeightEntry& e : weight_map(s)) {
    const size_t u = e.kind == WeightKind::embed ? 0
                     : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                                 : static_cast<size_t>(L + 1);
    if (muon_matrix(e)) max_matrix = std::max(max_matrix, e.numel());
    const int64_t r = muon_matrix(e) ? e.numel() : std::min(e.numel(), kMuonPiece);
    rm[u] = std::max(rm[u], r);
    if (!muon_matrix(e)) rv[u] = std::max(rv[u], r);
  }
  auto window = [](int64_t r) { return r ? (quant_blocks(r) + 1) * kQuantBlock : 0; };
  int64_t max_window = 0;
  for (size_t u = 0; u < rm.size(); ++u) max_window = std::max(max_window, window(rm[u]) + window(rv[u]));
  // the decoded matrix: none for an fp32 master, nor for a split one when pipelined (muon_apply_bf16_split)
  const bool decoded = master != MasterStorage::fp32 && !(pipelined && master == MasterStorage::split);
  return (pipelined ? 0 : 2) * scratch_buffer_bytes(max_matrix) +
         (decoded ? scratch_buffer_bytes(pipelined ? std::min(max_matrix, kMuonApplyChunk) : max_matrix) : 0) +
         (quantized ? scratch_buffer_bytes(max_window) : 0);
}

double muon_scale(int64_t rows, int64_t cols) {
  return 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
}

void newton_schulz5(float* x, int64_t r, int64_t c) {
  RT_CHECK(r >= 1 && r <= c, "[muon] newton_schulz5 needs 1 <= rows <= cols, got ", r, " x ", c);
  const float a = static_cast<float>(kMuonNsA), b = static_cast<float>(kMuonNsB), cc = static_cast<float>(kMuonNsC);
  std::vector<float> A(static_cast<size_t>(r * r)), AA(static_cast<size_t>(r * r)), BX(static_cast<size_t>(r * c));
  for (int s = 0; s < kMuonNsSteps; ++s) {
    cpu::matmul_nt(A.data(), x, x, r, r, c);                // A[r,r] = X X^T
    cpu::matmul_nn(AA.data(), A.data(), A.data(), r, r, r);  // AA[r,r] = A A
    for (int64_t i = 0; i < r * r; ++i) A[i] = b * A[i] + cc * AA[i];  // B
    cpu::matmul_nn(BX.data(), A.data(), x, r, c, r);  // BX[r,c] = B X
    parallel_for(r * c, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] = a * x[i] + BX[i];
    });
  }
}

void muon_orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) {
  RT_CHECK(rows >= 1 && cols >= 1, "[muon] empty matrix ", rows, " x ", cols);
  const int64_t n = rows * cols;
  const float d = static_cast<float>(std::sqrt(sum_squares(u, n)) + kMuonNormEps);
  if (rows <= cols) {
    parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) o[i] = u[i] / d;
    });
    return newton_schulz5(o, rows, cols);
  }
  std::vector<float> xt(static_cast<size_t>(n));  // [cols, rows]
  parallel_for(cols, 64, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t i = 0; i < rows; ++i) xt[static_cast<size_t>(j * rows + i)] = u[i * cols + j] / d;
  });
  newton_schulz5(xt.data(), cols, rows);
  parallel_for(rows, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t j = 0; j < cols; ++j) o[i * cols + j] = xt[static_cast<size_t>(j * rows + i)];
  });
}

namespace {
float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
}  // namespace

void muon_orthogonalize_bf16(const float* u, float* o, int64_t rows, int64_t cols) {
  RT_CHECK(rows >= 1 && cols >= 1, "[muon] empty matrix ", rows, " x ", cols);
  const int64_t n = rows * cols, r = std::min(rows, cols), c = std::max(rows, cols);
  const float d = static_cast<float>(std::sqrt(sum_squares(u, n)) + kMuonNormEps);
  std::vector<float> x(static_cast<size_t>(n));  // [r, c]: u / d, transposed when rows > cols
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      x[static_cast<size_t>(rows <= cols ? i * cols + j : j * rows + i)] = round_bf16(u[i * cols + j] / d);
  const float a = static_cast<float>(kMuonNsA), b = static_cast<float>(kMuonNsB), cc = static_cast<float>(kMuonNsC);
  std::vector<float> A(static_cast<size_t>(r * r)), AA(static_cast<size_t>(r * r)), BX(static_cast<size_t>(n));
  for (int s = 0; s < kMuonNsSteps; ++s) {
    cpu::matmul_nt(A.data(), x.data(), x.data(), r, r, c);  // A = X X^T
    for (float& v : A) v = round_bf16(v);
    cpu::matmul_nn(AA.data(), A.data(), A.data(), r, r, r);
    for (int64_t i = 0; i < r * r; ++i) A[i] = round_bf16(cc * AA[i] + b * A[i]);  // B
    cpu::matmul_nn(BX.data(), A.data(), x.data(), r, c, r);
    for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(BX[i] + a * x[i]);
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      o[i * cols + j] = x[static_cast<size_t>(rows <= cols ? i * cols + j : j * rows + i)];
}

float* Orthogonalizer::input(int, int64_t) { fail("[muon] internal: this orthogonaliser has no pipelined form"); }
void Orthogonalizer::submit(int, int64_t, int64_t) {
  fail("[muon] internal: this orthogonaliser has no pipelined form");
}
const uint16_t* Orthogonalizer::result(int) { fail("[muon] internal: this orthogonaliser has no pipelined form"); }

void muon_check_hyper(double mu, double lr, double wd) {
  RT_CHECK(mu >= 0 && mu < 1, "[muon] momentum ", mu, " must lie in [0, 1); fix --muon-momentum (or --beta1)");
  RT_CHECK(lr >= 0 && wd >= 0, "[muon] lr = ", lr, ", weight_decay = ", wd, " must be >= 0");
}

void muon_momentum(float* m, const float* g, float* u, int64_t n, double mu, bool nesterov, float grad_scale) {
  const float muf = static_cast<float>(mu);
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float gi = g[i] * grad_scale;
      m[i] = muf * m[i] + gi;
      u[i] = nesterov ? gi + muf * m[i] : m[i];
    }
  });
}

namespace {
// One element of p = p * (1 - lr*wd) - (lr * scale) * O: every apply path
// computes it here, so all give the same bits.
inline float muon_apply_one(float w, float o, bool decays, float decay, float step) {
  if (decays) w = w * decay;
  return w - step * o;
}
// p = p * (1 - lr*wd) - (lr * scale) * O; O[i] = load(i)
template <class Load>
void muon_apply_with(float* p, Load load, int64_t n, int64_t rows, int64_t cols, double lr, double wd,
                     uint16_t* bf16_out) {
  const float decay = wd != 0 ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  const float step = static_cast<float>(lr * muon_scale(rows, cols));
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float w = muon_apply_one(p[i], load(i), wd != 0, decay, step);
      p[i] = w;
      if (bf16_out) bf16_out[i] = f32_to_bf16(w);
    }
  });
}

// muon_apply_bf16_split's blocks, walked by split_master_walk: whole tie
// words by the path's word function, the partial words at a range's ends by
// the scalar element with atomic word access. The vector forms decode, apply
// and encode lane for lane as the scalar element does (adamw_math_simd.h's
// split lanes): a multiply then a subtract, each rounded once (FP contraction
// is off in this file).
struct MuonSplit {
  SplitMaster p;
  const uint16_t* o;
  float decay, step;
  bool decays;
};

inline bool muon_split_element(const MuonSplit& a, int64_t k, bool tie) {
  const float x = split_master_decode_one(a.p.shadow[k], a.p.rem[k], tie);
  const float w = muon_apply_one(x, bf16_to_f32(a.o[k]), a.decays, a.decay, a.step);
  bool t;
  a.p.shadow[k] = split_master_encode_one(w, a.p.rem + k, &t);
  return t;
}

// One whole tie word of a's span: the 64 elements from i, per SIMD path.
void muon_split_word_scalar(const MuonSplit& a, int64_t i, uint64_t* w) {
  const uint64_t in = *w;
  uint64_t out = 0;
  for (int j = 0; j < 64; ++j) out |= static_cast<uint64_t>(muon_split_element(a, i + j, ((in >> j) & 1u) != 0)) << j;
  *w = out;
}

__attribute__((target("avx2,fma"))) void muon_split_word_avx2(const MuonSplit& a, int64_t i, uint64_t* w) {
  const __m256 decay = _mm256_set1_ps(a.decay), step = _mm256_set1_ps(a.step);
  const uint64_t in = *w;
  uint64_t out = 0;
  for (int j = 0; j < 64; j += 8) {
    const int64_t q = i + j;
    __m256 x = split_decode_avx2(a.p.shadow + q, a.p.rem + q, static_cast<uint32_t>(in >> j));
    const __m256 o = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a.o + q))), 16));
    if (a.decays) x = _mm256_mul_ps(x, decay);
    const SplitLanes8 e = split_encode_avx2(_mm256_sub_ps(x, _mm256_mul_ps(step, o)));
    out |= static_cast<uint64_t>(e.tie) << j;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.p.shadow + q), e.shadow);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.p.rem + q), e.rem);
  }
  *w = out;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as in adamw.cpp
#pragma GCC diagnostic ignored "-Wuninitialized"        // the same bug, once inlined here
__attribute__((target("avx512f"))) void muon_split_word_avx512(const MuonSplit& a, int64_t i, uint64_t* w) {
  const __m512 decay = _mm512_set1_ps(a.decay), step = _mm512_set1_ps(a.step);
  const uint64_t in = *w;
  uint64_t out = 0;
  for (int j = 0; j < 64; j += 16) {
    const int64_t q = i + j;
    __m512 x = split_decode_avx512(a.p.shadow + q, a.p.rem + q, static_cast<__mmask16>(in >> j));
    const __m512 o = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.o + q))), 16));
    if (a.decays) x = _mm512_mul_ps(x, decay);
    const SplitLanes16 e = split_encode_avx512(_mm512_sub_ps(x, _mm512_mul_ps(step, o)));
    out |= static_cast<uint64_t>(e.tie) << j;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.p.shadow + q), e.shadow);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.p.rem + q), e.rem);
  }
  *w = out;
}
#pragma GCC diagnostic pop
}  // namespace

void muon_apply_bf16_split(const SplitMaster& p, const uint16_t* o, int64_t n, int64_t rows, int64_t cols, double lr,
                           double wd) {
  if (n <= 0) return;
  RT_CHECK(p.tie_first >= 0 && p.shadow && p.rem && p.tie && o, "[muon] bad split master span for n = ", n);
  const float decay = wd != 0 ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  const float step = static_cast<float>(lr * muon_scale(rows, cols));
  const SimdLevel level = simd_level_active();
  void (*word)(const MuonSplit&, int64_t, uint64_t*) = level == SimdLevel::avx512 ? muon_split_word_avx512
                                                       : level == SimdLevel::avx2 ? muon_split_word_avx2
                                                                                  : muon_split_word_scalar;
  split_master_parallel(p, n, [&](int64_t b, int64_t e) {
    const MuonSplit a{p.at(b), o + b, decay, step, wd != 0};
    split_master_walk(
        a.p, e - b, [&](int64_t i, uint64_t* w) { word(a, i, w); },
        [&](int64_t i0, int64_t i1, uint64_t* w) {
          split_master_partial(a.p, i0, i1, w, [&](int64_t k, bool t) { return muon_split_element(a, k, t); });
        });
  });
}

void muon_apply_bf16(float* p, const uint16_t* o, int64_t n, int64_t rows, int64_t cols, double lr, double wd,
                     uint16_t* bf16_out) {
  muon_apply_with(p, [o](int64_t i) { return bf16_to_f32(o[i]); }, n, rows, cols, lr, wd, bf16_out);
}

void muon_update_matrix(float* p, float* m, const float* g, int64_t rows, int64_t cols, double mu, bool nesterov,
                        double lr, double wd, float grad_scale, uint16_t* bf16_out, Orthogonalizer* orth) {
  muon_check_hyper(mu, lr, wd);
  const int64_t n = rows * cols;
  float* u = muon_scratch(0, n);
  float* o = muon_scratch(1, n);
  muon_momentum(m, g, u, n, mu, nesterov, grad_scale);
  if (orth)
    orth->orthogonalize(u, o, rows, cols);
  else
    muon_orthogonalize(u, o, rows, cols);
  muon_apply_with(p, [o](int64_t i) { return o[i]; }, n, rows, cols, lr, wd, bf16_out);
}

}  // namespace rt
