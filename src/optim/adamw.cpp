// AdamW kernels: scalar, AVX2+FMA and AVX-512F, chosen at run time (the project
// builds without -march=native, so the SIMD paths are target attributes here).
// Rules that keep the three paths bit-identical:
//  - no implicit FP contraction anywhere in this file (the pragma below, placed
//    before any include so the intrinsics' inline bodies get it too); the only
//    FMAs are the explicit ones (std::fma, _mm256_fmadd_ps, _mm512_fmadd_ps),
//    which round once like every other op;
//  - the same ops in the same order on every path; sqrt and division are
//    correctly rounded in scalar and SIMD alike; no FTZ/DAZ is set here;
//  - tails are handled by the scalar element function.
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "optim/adamw.h"
#include "optim/adamw_math.h"
#include "optim/adamw_math_simd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "state/moment_quant.h"
#include "state/split_master.h"

namespace rt {
namespace {

inline void adamw_element(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t i,
                          const AdamWConsts& c) {
  float mm = m[i], vv = v[i];
  const float pp = adamw_math(p[i], mm, vv, g[i], c);
  p[i] = pp;
  m[i] = mm;
  v[i] = vv;
  if (out) out[i] = f32_to_bf16(pp);
}

void adamw_block_scalar(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n, const AdamWConsts& c) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p, m, v, g, out, i, c);
}

// Stores. The bf16 shadow is only written: a non-temporal store saves the
// read-for-ownership a normal store makes (2 bytes per parameter on the memory
// bus). p, m and v are written over lines just read, and which store is faster
// there depends on the CPU (same values either way), measured with
// ramtrain_optim_bench at 16 and 2 threads:
//   Intel Xeon (the lent H200 host): streaming 4.79-5.08 Gparam/s, plain 4.26;
//   AMD EPYC Zen 3 (the CI machines): streaming 0.44-0.57, plain 1.01.
// So p, m, v stream on Intel CPUs and take plain stores elsewhere
// (adamw_streams_moments). Streaming needs 64-byte (p, m, v) and 32-byte
// (shadow) alignment, which the host arenas and pinned shadows give every
// tensor; unaligned buffers take plain stores.
inline bool aligned(const void* q, uintptr_t k) { return (reinterpret_cast<uintptr_t>(q) & (k - 1)) == 0; }
inline bool stream_shadow_ok(const uint16_t* out, int64_t n) { return n >= 4096 && out && aligned(out, 32); }
inline bool stream_moments_ok(const float* p, const float* m, const float* v, int64_t n) {
  return n >= 4096 && adamw_streams_moments() && aligned(p, 64) && aligned(m, 64) && aligned(v, 64);
}

// The vector forms of adamw_math (same ops, same order) and of f32_to_bf16
// (round to nearest even, NaN -> (u >> 16) | 0x40), shared by the fp32 and the
// split-master kernels: optim/adamw_math_simd.h.
__attribute__((target("avx2,fma"))) void adamw_block_avx2(float* p, float* m, float* v, const float* g, uint16_t* out,
                                                          int64_t n, const AdamWConsts& c) {
  const AdamWVec256 k = adamw_vec256(c);
  const bool nt = stream_shadow_ok(out, n), ntm = stream_moments_ok(p, m, v, n);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mm = _mm256_loadu_ps(m + i), vv = _mm256_loadu_ps(v + i);
    const __m256 pp = adamw_math_avx2(_mm256_loadu_ps(p + i), mm, vv, _mm256_loadu_ps(g + i), k);
    if (ntm) {
      _mm256_stream_ps(p + i, pp);
      _mm256_stream_ps(m + i, mm);
      _mm256_stream_ps(v + i, vv);
    } else {
      _mm256_storeu_ps(p + i, pp);
      _mm256_storeu_ps(m + i, mm);
      _mm256_storeu_ps(v + i, vv);
    }
    if (out) {
      const __m128i packed = pack16_avx2(bf16_round_avx2(pp));
      if (nt)
        _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), packed);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
    }
  }
  if (nt || ntm) _mm_sfence();
  for (; i < n; ++i) adamw_element(p, m, v, g, out, i, c);
}

// GCC 12 warns falsely inside AVX-512 intrinsics (_mm512_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void adamw_block_avx512(float* p, float* m, float* v, const float* g, uint16_t* out,
                                                           int64_t n, const AdamWConsts& c) {
  const AdamWVec512 k = adamw_vec512(c);
  const bool nt = stream_shadow_ok(out, n), ntm = stream_moments_ok(p, m, v, n);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 mm = _mm512_loadu_ps(m + i), vv = _mm512_loadu_ps(v + i);
    const __m512 pp = adamw_math_avx512(_mm512_loadu_ps(p + i), mm, vv, _mm512_loadu_ps(g + i), k);
    if (ntm) {
      _mm512_stream_ps(p + i, pp);
      _mm512_stream_ps(m + i, mm);
      _mm512_stream_ps(v + i, vv);
    } else {
      _mm512_storeu_ps(p + i, pp);
      _mm512_storeu_ps(m + i, mm);
      _mm512_storeu_ps(v + i, vv);
    }
    if (out) {
      const __m512i r = bf16_round_avx512(pp);
      if (nt)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
    }
  }
  if (nt || ntm) _mm_sfence();
  for (; i < n; ++i) adamw_element(p, m, v, g, out, i, c);
}
#pragma GCC diagnostic pop

// ---- split master (split_master.h): the same element maths, with the master
// read from (shadow_in, rem, tie bit) and written back as (shadow, rem, tie bit).
// shadow_in is the shadow holding the master's upper half (p.shadow itself, or the
// other shadow in delayed-update mode). Blocks walk the span word by word: whole
// tie words take the vector loop, the partial words at a range's ends the scalar
// element with atomic word access (split_master_partial).
struct SplitArgs {
  SplitMaster p;
  const uint16_t* shadow_in;
  float* m;
  float* v;
  const float* g;
};

inline bool split_element(const SplitArgs& a, int64_t k, bool tie, const AdamWConsts& c) {
  float mm = a.m[k], vv = a.v[k];
  const float pp = adamw_math(split_master_decode_one(a.shadow_in[k], a.p.rem[k], tie), mm, vv, a.g[k], c);
  a.m[k] = mm;
  a.v[k] = vv;
  bool t;
  a.p.shadow[k] = split_master_encode_one(pp, a.p.rem + k, &t);
  return t;
}

void split_partial(const SplitArgs& a, int64_t i0, int64_t i1, uint64_t* w, const AdamWConsts& c) {
  split_master_partial(a.p, i0, i1, w, [&](int64_t k, bool t) { return split_element(a, k, t, c); });
}

void adamw_split_block_scalar(const SplitArgs& a, int64_t n, const AdamWConsts& c) {
  split_master_walk(
      a.p, n,
      [&](int64_t i, uint64_t* w) {
        const uint64_t in = *w;
        uint64_t out = 0;
        for (int j = 0; j < 64; ++j)
          out |= static_cast<uint64_t>(split_element(a, i + j, ((in >> j) & 1u) != 0, c)) << j;
        *w = out;
      },
      [&](int64_t i0, int64_t i1, uint64_t* w) { split_partial(a, i0, i1, w, c); });
}

// Stores, by adamw_update's rule: a buffer only written (the shadow in delayed
// mode) always streams; buffers written over lines just read (rem, m, v, and the
// shadow when updated in place) stream where adamw_streams_moments() says. Whole
// words start at element `head`; from there every vector store is aligned if the
// address at head is.
struct SplitStores {
  bool shadow, rem, moments;
};
inline SplitStores split_stores(const SplitArgs& a, int64_t head, int64_t n) {
  const bool big = n - head >= 4096, moments = adamw_streams_moments();
  const bool in_place = a.shadow_in == a.p.shadow;
  return {big && (moments || !in_place) && aligned(a.p.shadow + head, 32),
          big && moments && aligned(a.p.rem + head, 32),
          big && moments && aligned(a.m + head, 64) && aligned(a.v + head, 64)};
}
inline int64_t split_head(const SplitArgs& a, int64_t n) {
  const int64_t off = a.p.tie_first & 63;
  return off == 0 ? 0 : std::min<int64_t>(n, 64 - off);
}

__attribute__((target("avx2,fma"))) void adamw_split_block_avx2(const SplitArgs& a, int64_t n, const AdamWConsts& c) {
  const AdamWVec256 k = adamw_vec256(c);
  const int64_t head = split_head(a, n);
  const SplitStores st = split_stores(a, head, n);
  if (head > 0) split_partial(a, 0, head, a.p.tie + a.p.tie_first / 64, c);
  int64_t i = head;
  for (; i + 64 <= n; i += 64) {
    uint64_t* w = a.p.tie + (a.p.tie_first + i) / 64;
    const uint64_t in = *w;
    uint64_t out = 0;
    for (int j = 0; j < 64; j += 8) {
      const int64_t q = i + j;
      const __m256 x = split_decode_avx2(a.shadow_in + q, a.p.rem + q, static_cast<uint32_t>(in >> j));
      __m256 mm = _mm256_loadu_ps(a.m + q), vv = _mm256_loadu_ps(a.v + q);
      const __m256 pp = adamw_math_avx2(x, mm, vv, _mm256_loadu_ps(a.g + q), k);
      if (st.moments) {
        _mm256_stream_ps(a.m + q, mm);
        _mm256_stream_ps(a.v + q, vv);
      } else {
        _mm256_storeu_ps(a.m + q, mm);
        _mm256_storeu_ps(a.v + q, vv);
      }
      const SplitLanes8 e = split_encode_avx2(pp);
      out |= static_cast<uint64_t>(e.tie) << j;
      if (st.shadow)
        _mm_stream_si128(reinterpret_cast<__m128i*>(a.p.shadow + q), e.shadow);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.p.shadow + q), e.shadow);
      if (st.rem)
        _mm_stream_si128(reinterpret_cast<__m128i*>(a.p.rem + q), e.rem);
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.p.rem + q), e.rem);
    }
    *w = out;
  }
  if (st.shadow || st.rem || st.moments) _mm_sfence();
  if (i < n) split_partial(a, i, n, a.p.tie + (a.p.tie_first + i) / 64, c);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
__attribute__((target("avx512f"))) void adamw_split_block_avx512(const SplitArgs& a, int64_t n, const AdamWConsts& c) {
  const AdamWVec512 k = adamw_vec512(c);
  const int64_t head = split_head(a, n);
  const SplitStores st = split_stores(a, head, n);
  if (head > 0) split_partial(a, 0, head, a.p.tie + a.p.tie_first / 64, c);
  int64_t i = head;
  for (; i + 64 <= n; i += 64) {
    uint64_t* w = a.p.tie + (a.p.tie_first + i) / 64;
    const uint64_t in = *w;
    uint64_t out = 0;
    for (int j = 0; j < 64; j += 16) {
      const int64_t q = i + j;
      const __m512 x = split_decode_avx512(a.shadow_in + q, a.p.rem + q, static_cast<__mmask16>(in >> j));
      __m512 mm = _mm512_loadu_ps(a.m + q), vv = _mm512_loadu_ps(a.v + q);
      const __m512 pp = adamw_math_avx512(x, mm, vv, _mm512_loadu_ps(a.g + q), k);
      if (st.moments) {
        _mm512_stream_ps(a.m + q, mm);
        _mm512_stream_ps(a.v + q, vv);
      } else {
        _mm512_storeu_ps(a.m + q, mm);
        _mm512_storeu_ps(a.v + q, vv);
      }
      const SplitLanes16 e = split_encode_avx512(pp);
      out |= static_cast<uint64_t>(e.tie) << j;
      if (st.shadow)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(a.p.shadow + q), e.shadow);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.p.shadow + q), e.shadow);
      if (st.rem)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(a.p.rem + q), e.rem);
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.p.rem + q), e.rem);
    }
    *w = out;
  }
  if (st.shadow || st.rem || st.moments) _mm_sfence();
  if (i < n) split_partial(a, i, n, a.p.tie + (a.p.tie_first + i) / 64, c);
}
#pragma GCC diagnostic pop

// sum_squares within one block: 16 lanes, lane = i mod 16 (blocks start at
// multiples of 16), combined in lane order. x*x is exact in double, so an FMA
// would not change anything either.
constexpr int kLanes = 16;

double lanes_combine(const double* acc) {
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

double sum_squares_block_scalar(const float* g, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double x = g[i + j];
      acc[j] += x * x;
    }
  }
  for (; i < n; ++i) {
    double x = g[i];
    acc[i % kLanes] += x * x;
  }
  return lanes_combine(acc);
}

__attribute__((target("avx2"))) double sum_squares_block_avx2(const float* g, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(g + i));
    __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 4));
    __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 8));
    __m256d x3 = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 12));
    a0 = _mm256_add_pd(a0, _mm256_mul_pd(x0, x0));
    a1 = _mm256_add_pd(a1, _mm256_mul_pd(x1, x1));
    a2 = _mm256_add_pd(a2, _mm256_mul_pd(x2, x2));
    a3 = _mm256_add_pd(a3, _mm256_mul_pd(x3, x3));
  }
  alignas(32) double acc[kLanes];
  _mm256_store_pd(acc, a0);
  _mm256_store_pd(acc + 4, a1);
  _mm256_store_pd(acc + 8, a2);
  _mm256_store_pd(acc + 12, a3);
  for (; i < n; ++i) {
    double x = g[i];
    acc[i % kLanes] += x * x;
  }
  return lanes_combine(acc);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
__attribute__((target("avx512f"))) double sum_squares_block_avx512(const float* g, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
    __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(g + i + 8));
    a0 = _mm512_add_pd(a0, _mm512_mul_pd(x0, x0));
    a1 = _mm512_add_pd(a1, _mm512_mul_pd(x1, x1));
  }
  alignas(64) double acc[kLanes];
  _mm512_store_pd(acc, a0);
  _mm512_store_pd(acc + 8, a1);
  for (; i < n; ++i) {
    double x = g[i];
    acc[i % kLanes] += x * x;
  }
  return lanes_combine(acc);
}
#pragma GCC diagnostic pop

static_assert(kOptimBlock % kLanes == 0, "blocks must start on a lane boundary");

SimdLevel simd_level_probe() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SimdLevel::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::avx2;
  return SimdLevel::scalar;
}

std::atomic<int>& simd_level_slot() {
  static std::atomic<int> level{static_cast<int>(simd_level_detected())};
  return level;
}

}  // namespace

bool adamw_streams_moments() {
  static const bool v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return v;
}

SimdLevel simd_level_detected() {
  static const SimdLevel level = simd_level_probe();
  return level;
}

SimdLevel simd_level_active() { return static_cast<SimdLevel>(simd_level_slot().load(std::memory_order_relaxed)); }

void set_simd_level(SimdLevel level) {
  int want = static_cast<int>(level), have = static_cast<int>(simd_level_detected());
  simd_level_slot().store(want < have ? want : have, std::memory_order_relaxed);
  quant_set_simd(level != SimdLevel::scalar, level == SimdLevel::avx512);  // the quantized moments' codec follows
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::scalar:
      return "scalar";
    case SimdLevel::avx2:
      return "avx2";
    case SimdLevel::avx512:
      return "avx512";
  }
  return "unknown";
}

void adamw_update_split(const SplitMaster& p, float* m, float* v, const float* g, int64_t n, const AdamWHyper& h,
                        int64_t t, double lr, double wd, float grad_scale, const uint16_t* shadow_in) {
  RT_CHECK(n >= 0, "[adamw_update_split] n = ", n, " is negative");
  if (n == 0) return;
  RT_CHECK(p.shadow && p.rem && p.tie && m && v && g,
           "[adamw_update_split] null shadow, remainder, tie, moment or gradient buffer for n = ", n);
  RT_CHECK(p.tie_first >= 0, "[adamw_update_split] tie_first = ", p.tie_first, " is negative");
  RT_CHECK(t >= 1, "[adamw_update_split] step t = ", t, ": steps are 1-based (t = 1 on the first update)");
  RT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1, "[adamw_update_split] betas (", h.beta1, ", ",
           h.beta2, ") must lie in [0, 1); fix the optimizer config");
  RT_CHECK(h.eps >= 0 && lr >= 0 && wd >= 0, "[adamw_update_split] eps = ", h.eps, ", lr = ", lr,
           ", weight_decay = ", wd, " must be >= 0; fix the optimizer config");
  const AdamWConsts c = adamw_consts(h, t, lr, wd, grad_scale);
  auto* block = adamw_split_block_scalar;
  switch (simd_level_active()) {
    case SimdLevel::avx512:
      block = adamw_split_block_avx512;
      break;
    case SimdLevel::avx2:
      block = adamw_split_block_avx2;
      break;
    case SimdLevel::scalar:
      break;
  }
  const uint16_t* in = shadow_in ? shadow_in : p.shadow;
  split_master_parallel(p, n, [&](int64_t b, int64_t e) {
    block(SplitArgs{p.at(b), in + b, m + b, v + b, g + b}, e - b, c);
  });
}

void adamw_span(float* p, float* m, float* v, const float* g, int64_t n, const AdamWConsts& c, uint16_t* bf16_out) {
  switch (simd_level_active()) {
    case SimdLevel::avx512:
      return adamw_block_avx512(p, m, v, g, bf16_out, n, c);
    case SimdLevel::avx2:
      return adamw_block_avx2(p, m, v, g, bf16_out, n, c);
    case SimdLevel::scalar:
      return adamw_block_scalar(p, m, v, g, bf16_out, n, c);
  }
}

void adamw_update(float* p, float* m, float* v, const float* g, int64_t n, const AdamWHyper& h, int64_t t, double lr,
                  double wd, float grad_scale, uint16_t* bf16_out) {
  RT_CHECK(n >= 0, "[adamw_update] n = ", n, " is negative");
  if (n == 0) return;
  RT_CHECK(p && m && v && g, "[adamw_update] null parameter, moment or gradient buffer for n = ", n);
  RT_CHECK(t >= 1, "[adamw_update] step t = ", t, ": steps are 1-based (t = 1 on the first update)");
  RT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1, "[adamw_update] betas (", h.beta1, ", ", h.beta2,
           ") must lie in [0, 1); fix the optimizer config");
  RT_CHECK(h.eps >= 0 && lr >= 0 && wd >= 0, "[adamw_update] eps = ", h.eps, ", lr = ", lr, ", weight_decay = ", wd,
           " must be >= 0; fix the optimizer config");
  const AdamWConsts c = adamw_consts(h, t, lr, wd, grad_scale);
  auto* block = adamw_block_scalar;
  switch (simd_level_active()) {
    case SimdLevel::avx512:
      block = adamw_block_avx512;
      break;
    case SimdLevel::avx2:
      block = adamw_block_avx2;
      break;
    case SimdLevel::scalar:
      break;
  }
  parallel_for(n, kOptimBlock, [&](int64_t b, int64_t e) {
    block(p + b, m + b, v + b, g + b, bf16_out ? bf16_out + b : nullptr, e - b, c);
  });
}

double sum_squares(const float* g, int64_t n) {
  RT_CHECK(n >= 0, "[sum_squares] n = ", n, " is negative");
  if (n == 0) return 0.0;
  RT_CHECK(g, "[sum_squares] null buffer for n = ", n);
  auto* block = sum_squares_block_scalar;
  switch (simd_level_active()) {
    case SimdLevel::avx512:
      block = sum_squares_block_avx512;
      break;
    case SimdLevel::avx2:
      block = sum_squares_block_avx2;
      break;
    case SimdLevel::scalar:
      break;
  }
  std::vector<double> partial(static_cast<size_t>((n + kOptimBlock - 1) / kOptimBlock));
  parallel_for(n, kOptimBlock, [&](int64_t b, int64_t e) { partial[b / kOptimBlock] = block(g + b, e - b); });
  double s = 0;
  for (double x : partial) s += x;
  return s;
}

float clip_coefficient(double total_norm, double max_norm) {
  if (!(max_norm > 0)) return 1.0f;
  double coef = max_norm / (total_norm + 1e-6);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);  // NaN stays NaN
}

}  // namespace rt
