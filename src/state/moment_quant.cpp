// No implicit FP contraction: the scalar and AVX2 paths must round alike (the
// pragma comes before any include).
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "state/moment_quant.h"
#include "state/moment_quant_simd.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace rt {

namespace {

float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }
inline float clamp01(float x) { return x > 0 ? (x < 1 ? x : 1.0f) : 0.0f; }  // NaN -> 0

}  // namespace

namespace {

// Minifloat codes: the index from y's bits (see the header). draw: the 32-bit
// hash of stochastic rounding (its top `shift` bits are added; its top 24 bits
// are u of the bottom step of a code with 0).
inline int mf_nearest(const QuantCode& c, float x) {
  x = clamp01(x);
  const int32_t b = static_cast<int32_t>(f32_bits(x));
  const int32_t j = std::max(((b + (1 << (c.shift - 1))) >> c.shift) - c.base, 0);
  if (!c.has_zero) return j;
  return b >= (c.base << c.shift) - (1 << 23) ? j + 1 : 0;  // y >= smallest level / 2
}
inline int mf_stochastic(const QuantCode& c, float x, uint32_t draw) {
  x = clamp01(x);
  const int32_t b = static_cast<int32_t>(f32_bits(x));
  const int32_t j = std::max(((b + static_cast<int32_t>(draw >> (32 - c.shift))) >> c.shift) - c.base, 0);
  if (!c.has_zero) return j;
  if (b >= c.base << c.shift) return j + 1;
  const float u = static_cast<float>(draw >> 8) * 0x1.0p-24f;
  return u * c.level[1] < x ? 1 : 0;  // up to the smallest level with probability y / level
}
inline uint32_t draw_of(float u) { return static_cast<uint32_t>(u * 0x1.0p24f) << 8; }

inline int index_nearest(const QuantCode& c, float x) {
  if (c.shift) return mf_nearest(c, x);
  x = clamp01(x);
  const uint32_t b = f32_bits(x);
  const int32_t e = c.nearest_key[b >> 16];
  return (e >> 17) + (static_cast<int32_t>(b & 0xffff) >= (e & 0x1ffff));  // + (x > the next mid)
}

inline int index_stochastic(const QuantCode& c, float x, float u) {
  if (c.shift) return mf_stochastic(c, x, draw_of(u));
  x = clamp01(x);
  const uint32_t b = f32_bits(x);
  const int32_t e = c.floor_key[b >> 16];
  const int f = (e >> 17) + (static_cast<int32_t>(b & 0xffff) >= (e & 0x1ffff)) - 1;  // count of levels <= x, - 1
  if (f < 0) return 0;  // below the smallest level of a no-zero code: up
  if (f >= c.n - 1) return c.n - 1;
  const float lo = c.level[f], hi = c.level[f + 1];
  return u * (hi - lo) < x - lo ? f + 1 : f;  // u < (x - lo) / (hi - lo) without the division
}

}  // namespace

int quant_index_nearest(const QuantCode& c, float x) { return index_nearest(c, x); }
int quant_index_stochastic(const QuantCode& c, float x, float u) { return index_stochastic(c, x, u); }

namespace {

inline const QuantCode& code_of(MomentStorage s, bool signed_code, bool muon) {
  return s == MomentStorage::q8 ? (signed_code ? quant_code_m8() : quant_code_v8())
                                : (signed_code ? (muon ? quant_code_m4n() : quant_code_m4()) : quant_code_v4());
}

// 0 scalar, 1 AVX2, 2 AVX-512F
int quant_simd_detected() {
  static const int v = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
  }();
  return v;
}
std::atomic<int>& quant_simd_slot() {
  static std::atomic<int> level{quant_simd_detected()};
  return level;
}

// Element i of a block: x -> code (sign included), as the AVX2 lanes below.
template <bool kStochastic, bool kQ8, bool kSigned>
inline int encode_one(const QuantCode& c, uint32_t key32, float x, int64_t i, float amax, float inv) {
  const float a = std::fabs(x);
  const float y = a == amax ? 1.0f : a * inv;
  int q;
  if (kStochastic) {  // quant_uniform's draw
    const uint32_t h = quant_mix32(key32 + static_cast<uint32_t>(i) * kQuantCounterStep);
    q = kQ8 ? mf_stochastic(c, y, h) : index_stochastic(c, y, static_cast<float>(h >> 8) * 0x1.0p-24f);
  } else if (kQ8) {
    q = mf_nearest(c, y);
  } else {
    q = index_nearest(c, y);
  }
  if (kSigned && std::signbit(x)) q |= 1 << (kQ8 ? 7 : 3);
  return q;
}

inline void store_code(bool q8, uint8_t* codes, int64_t j, int q) {
  if (q8) {
    codes[j] = static_cast<uint8_t>(q);
  } else {
    uint8_t& b = codes[j >> 1];
    b = (j & 1) ? static_cast<uint8_t>((b & 0x0f) | (q << 4)) : static_cast<uint8_t>((b & 0xf0) | q);
  }
}

// Elements [i0, k) of a block, scalar.
template <bool kStochastic, bool kQ8, bool kSigned>
void encode_scalar(const QuantCode& c, uint32_t key32, const float* x, int64_t i0, int64_t k, uint8_t* codes,
                   int64_t first, float amax) {
  const float inv = amax > 0 ? 1.0f / amax : 0.0f;
  for (int64_t i = i0; i < k; ++i)
    store_code(kQ8, codes, first + i, encode_one<kStochastic, kQ8, kSigned>(c, key32, x[i], i, amax, inv));
}

// level[idx] of a 4-bit code (8 or 16 levels in t[0], t[1]) by permutes.
template <int kLevels>
__attribute__((target("avx2"), always_inline)) inline __m256 level4_avx2(const __m256* t, __m256i idx) {
  const __m256 a = _mm256_permutevar8x32_ps(t[0], idx);
  if constexpr (kLevels == 8) return a;
  return _mm256_blendv_ps(a, _mm256_permutevar8x32_ps(t[1], idx), _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

// Elements [0, 8 * floor(k / 8)) of a block with AVX2; returns how many it did.
// 4-bit codes: first must be even (whole bytes).
template <bool kStochastic, bool kQ8, bool kSigned>
__attribute__((target("avx2"))) int64_t encode_avx2(const QuantCode& c, uint32_t key32, const float* x, int64_t k,
                                                    uint8_t* codes, int64_t first, float amax) {
  const __m256i step = quant_counter_step8();
  __m256i ctr = quant_counters8(key32);
  int64_t i = 0;
  if constexpr (kQ8) {  // minifloat codes: moment_quant_simd.h
    const Q8Encode256 e = q8_encode_consts256(c, amax);
    for (; i + 8 <= k; i += 8) {
      const __m256i h = kStochastic ? quant_mix32x8(ctr) : _mm256_setzero_si256();
      q8_store8(codes + first + i, q8_encode8<kStochastic, kSigned>(e, _mm256_loadu_ps(x + i), h));
      ctr = _mm256_add_epi32(ctr, step);
    }
    return i;
  } else {
    // 4-bit codes: no tables; the levels and mids are compared in registers (a
    // count of those below y is the index, as the table lookup gives) and the
    // levels are read back with permutes.
    const float inv = amax > 0 ? 1.0f / amax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv), vamax = _mm256_set1_ps(amax), one = _mm256_set1_ps(1.0f);
    const __m256 zero = _mm256_setzero_ps(), absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i nm1 = _mm256_set1_epi32(c.n - 1), nm2 = _mm256_set1_epi32(c.n - 2);
    const __m256i izero = _mm256_setzero_si256(), ione = _mm256_set1_epi32(1);
    constexpr int kLevels4 = kSigned ? 8 : 16;
    if (c.n != kLevels4) return 0;  // (the codes are fixed: never; the scalar path would take it)
    __m256 lev4[kLevels4], mid4[kLevels4], tab4[2];
    for (int j = 0; j < kLevels4; ++j) {
      lev4[j] = _mm256_set1_ps(c.level[j]);
      mid4[j] = _mm256_set1_ps(c.mid[j]);
    }
    tab4[0] = _mm256_loadu_ps(c.level);
    tab4[1] = _mm256_loadu_ps(c.level + 8);
    for (; i + 8 <= k; i += 8) {
      const __m256 xv = _mm256_loadu_ps(x + i);
      const __m256 a = _mm256_and_ps(xv, absmask);
      __m256 y = _mm256_blendv_ps(_mm256_mul_ps(a, vinv), one, _mm256_cmp_ps(a, vamax, _CMP_EQ_OQ));
      y = _mm256_min_ps(_mm256_max_ps(y, zero), one);  // clamp01: max(y, 0) is y > 0 ? y : 0 (NaN -> 0)
      __m256i q;
      if (kStochastic) {
        const __m256i h = quant_mix32x8(ctr);
        const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(0x1.0p-24f));
        __m256i f = _mm256_set1_epi32(-1);  // count of levels <= y, - 1
        for (int j = 0; j < kLevels4; ++j)
          f = _mm256_sub_epi32(f, _mm256_castps_si256(_mm256_cmp_ps(lev4[j], y, _CMP_LE_OQ)));
        const __m256i fc = _mm256_max_epi32(_mm256_min_epi32(f, nm2), izero);
        const __m256 lo = level4_avx2<kLevels4>(tab4, fc);
        const __m256 hi = level4_avx2<kLevels4>(tab4, _mm256_add_epi32(fc, ione));
        const __m256 up = _mm256_cmp_ps(_mm256_mul_ps(u, _mm256_sub_ps(hi, lo)), _mm256_sub_ps(y, lo), _CMP_LT_OQ);
        q = _mm256_sub_epi32(fc, _mm256_castps_si256(up));
        q = _mm256_andnot_si256(_mm256_cmpgt_epi32(izero, f), q);  // below the smallest level: 0
        q = _mm256_blendv_epi8(q, nm1, _mm256_cmpgt_epi32(f, nm2));
        ctr = _mm256_add_epi32(ctr, step);
      } else {
        q = izero;  // count of mids < y
        for (int j = 0; j + 1 < kLevels4; ++j)
          q = _mm256_sub_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(y, mid4[j], _CMP_GT_OQ)));
      }
      if (kSigned) q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(xv), 31), 3));
      // each 64-bit lane: low dword q[2j], high q[2j + 1] -> low dword q[2j] | q[2j + 1] << 4
      const __m256i pairs = _mm256_or_si256(q, _mm256_srli_epi64(q, 28));
      const __m128i lows =
          _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(pairs, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)));
      const __m128i w = _mm_packus_epi32(lows, lows);
      const int32_t bytes = _mm_cvtsi128_si32(_mm_packus_epi16(w, w));
      std::memcpy(codes + ((first + i) >> 1), &bytes, 4);
    }
  }
  return i;
}

// GCC 12 warns falsely inside AVX-512 intrinsics (_mm512_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The AVX-512F forms of the AVX2 loops above: 16 lanes, the same ops per lane,
// through the lane codecs of state/moment_quant_simd.h.
#define RT_AVX512 __attribute__((target("avx512f")))

template <bool kStochastic, bool kQ8, bool kSigned>
RT_AVX512 int64_t encode_avx512(const QuantCode& c, uint32_t key32, const float* x, int64_t k, uint8_t* codes,
                                int64_t first, float amax) {
  const __m512i step = quant_counter_step16();
  __m512i ctr = quant_counters16(key32);
  int64_t i = 0;
  if constexpr (!kQ8) {
    if (c.n != (kSigned ? 8 : 16)) return 0;  // (the codes are fixed: never; the scalar path would take it)
  }
  const auto e = quant_encode_consts512<kQ8>(c, amax);  // moment_quant_simd.h
  for (; i + 16 <= k; i += 16) {
    const __m512i h = kStochastic ? quant_mix32x16(ctr) : _mm512_setzero_si512();
    quant_store16<kQ8>(codes, first + i, quant_encode16<kQ8, kStochastic, kSigned>(e, _mm512_loadu_ps(x + i), h));
    ctr = _mm512_add_epi32(ctr, step);
  }
  return i;
}

RT_AVX512 int64_t absmax_avx512(const float* x, int64_t k, float* amax, bool* finite) {
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 acc = _mm512_setzero_ps();
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), absmask));
    acc = _mm512_max_ps(a, acc);  // a > acc ? a : acc
    bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc);
  float m = 0;
  for (float l : lanes) m = l > m ? l : m;
  *amax = m;
  *finite = bad == 0;
  return i;
}

template <bool kQ8, bool kSigned>
RT_AVX512 int64_t decode_loop_avx512(const QuantCode& c, const uint8_t* codes, int64_t first, float scale, int64_t k,
                                     float* x) {
  const QDecode512 d = quant_decode_consts512(c, scale);
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) _mm512_storeu_ps(x + i, quant_decode16<kQ8, kSigned>(d, codes, first + i));
  return i;
}

RT_AVX512 int64_t decode_avx512(bool q8, bool signed_code, const QuantCode& c, const uint8_t* codes, int64_t first,
                                float scale, int64_t k, float* x) {
  if (q8)
    return signed_code ? decode_loop_avx512<true, true>(c, codes, first, scale, k, x)
                       : decode_loop_avx512<true, false>(c, codes, first, scale, k, x);
  return signed_code ? decode_loop_avx512<false, true>(c, codes, first, scale, k, x)
                     : decode_loop_avx512<false, false>(c, codes, first, scale, k, x);
}
#undef RT_AVX512
#pragma GCC diagnostic pop

template <bool kStochastic, bool kQ8, bool kSigned>
void encode_loop(const QuantCode& c, uint32_t key32, const float* x, int64_t k, uint8_t* codes, int64_t first,
                 float amax, int simd) {
  int64_t i = 0;
  if (simd == 2 && (kQ8 || (first & 1) == 0))
    i = encode_avx512<kStochastic, kQ8, kSigned>(c, key32, x, k, codes, first, amax);
  else if (simd == 1 && (kQ8 || (first & 1) == 0))
    i = encode_avx2<kStochastic, kQ8, kSigned>(c, key32, x, k, codes, first, amax);
  encode_scalar<kStochastic, kQ8, kSigned>(c, key32, x, i, k, codes, first, amax);
}

// max |x| (NaN ignored, as a > amax ? a : amax from 0) and whether all are finite.
__attribute__((target("avx2"))) int64_t absmax_avx2(const float* x, int64_t k, float* amax, bool* finite) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 acc = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
    acc = _mm256_max_ps(a, acc);  // a > acc ? a : acc
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float m = 0;
  for (float l : lanes) m = l > m ? l : m;
  *amax = m;
  *finite = _mm256_movemask_ps(bad) == 0;
  return i;
}

__attribute__((target("avx2"))) int64_t decode_avx2(bool q8, bool signed_code, const QuantCode& c, const uint8_t* codes,
                                                    int64_t first, float scale, int64_t k, float* x) {
  int64_t i = 0;
  if (q8) {  // minifloat codes: moment_quant_simd.h
    const Q8Decode256 d = q8_decode_consts256(c, scale);
    for (; i + 8 <= k; i += 8)
      _mm256_storeu_ps(x + i, signed_code ? q8_decode8<true>(d, codes, first + i) : q8_decode8<false>(d, codes, first + i));
    return i;
  }
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256i mask = _mm256_set1_epi32(signed_code ? 0x7 : 0xf), sbit = _mm256_set1_epi32(0x8);
  const __m256i nib_shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), nib = _mm256_set1_epi32(0xf);
  const __m256 tab4[2] = {_mm256_loadu_ps(c.level), _mm256_loadu_ps(c.level + 8)};
  for (; i + 8 <= k; i += 8) {
    int32_t w;
    std::memcpy(&w, codes + ((first + i) >> 1), 4);
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), nib_shift), nib);
    const __m256i idx = _mm256_and_si256(q, mask);
    const __m256 lv = signed_code ? level4_avx2<8>(tab4, idx) : level4_avx2<16>(tab4, idx);
    __m256 y = _mm256_mul_ps(lv, vs);
    if (signed_code) y = _mm256_xor_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(q, sbit), 28)));
    _mm256_storeu_ps(x + i, y);
  }
  return i;
}

}  // namespace

bool quant_simd_active() { return quant_simd_slot().load(std::memory_order_relaxed) > 0; }
bool quant_avx512_active() { return quant_simd_slot().load(std::memory_order_relaxed) == 2; }
bool quant_set_simd(bool on, bool avx512) {
  quant_simd_slot().store(on ? std::min(quant_simd_detected(), avx512 ? 2 : 1) : 0, std::memory_order_relaxed);
  return quant_simd_active();
}

void quant_block_encode(MomentStorage s, bool signed_code, QuantRounding r, uint64_t key, const float* x, int64_t k,
                        uint8_t* codes, int64_t first, float* scale, bool muon) {
  const int simd = quant_simd_slot().load(std::memory_order_relaxed);
  float amax = 0;
  bool finite = true;
  int64_t i = simd == 2 ? absmax_avx512(x, k, &amax, &finite) : simd == 1 ? absmax_avx2(x, k, &amax, &finite) : 0;
  for (; i < k; ++i) {
    const float a = std::fabs(x[i]);
    finite &= std::isfinite(a);
    amax = a > amax ? a : amax;
  }
  quant_block_encode_absmax(s, signed_code, r, key, x, k, codes, first, scale, amax, finite, muon);
}

void quant_block_encode_absmax(MomentStorage s, bool signed_code, QuantRounding r, uint64_t key, const float* x,
                               int64_t k, uint8_t* codes, int64_t first, float* scale, float amax, bool finite,
                               bool muon) {
  const QuantCode& c = code_of(s, signed_code, muon);
  const int simd = quant_simd_slot().load(std::memory_order_relaxed);
  *scale = finite ? amax : NAN;
  const bool sr = r == QuantRounding::stochastic, q8 = s == MomentStorage::q8;
  using Loop = void (*)(const QuantCode&, uint32_t, const float*, int64_t, uint8_t*, int64_t, float, int);
  static constexpr Loop loops[8] = {encode_loop<false, false, false>, encode_loop<false, false, true>,
                                    encode_loop<false, true, false>,  encode_loop<false, true, true>,
                                    encode_loop<true, false, false>,  encode_loop<true, false, true>,
                                    encode_loop<true, true, false>,   encode_loop<true, true, true>};
  loops[(sr ? 4 : 0) + (q8 ? 2 : 0) + (signed_code ? 1 : 0)](c, quant_key32(key), x, k, codes, first, amax, simd);
}

void quant_block_decode(MomentStorage s, bool signed_code, const uint8_t* codes, int64_t first, float scale, int64_t k,
                        float* x, bool muon) {
  const QuantCode& c = code_of(s, signed_code, muon);
  const bool q8 = s == MomentStorage::q8;
  int64_t i = 0;
  const int simd = quant_simd_slot().load(std::memory_order_relaxed);
  if (simd == 2 && (q8 || (first & 1) == 0))
    i = decode_avx512(q8, signed_code, c, codes, first, scale, k, x);
  else if (simd == 1 && (q8 || (first & 1) == 0))
    i = decode_avx2(q8, signed_code, c, codes, first, scale, k, x);
  if (q8) {  // minifloat: the level from its bits
    const int32_t off = c.base - (signed_code ? 1 : 0);
    for (; i < k; ++i) {
      const int q = codes[first + i], idx = q & (signed_code ? 0x7f : 0xff);
      const float lv = signed_code && idx == 0 ? 0.0f : bits_to_f32(static_cast<uint32_t>(idx + off) << c.shift);
      const float y = lv * scale;
      x[i] = signed_code && (q & 0x80) ? -y : y;
    }
    return;
  }
  for (; i < k; ++i) {
    const int b = codes[(first + i) >> 1];
    const int q = ((first + i) & 1) ? b >> 4 : b & 0x0f;
    const float y = c.level[q & (signed_code ? 0x7 : 0xf)] * scale;
    x[i] = signed_code && (q & 0x8) ? -y : y;
  }
}

void quant_decode(MomentStorage s, bool signed_code, const uint8_t* codes, const float* scales, int64_t n, float* x,
                  bool muon) {
  parallel_for(quant_blocks(n), 64, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t first = blk * kQuantBlock, k = std::min(kQuantBlock, n - first);
      quant_block_decode(s, signed_code, codes, first, scales[blk], k, x + first, muon);
    }
  });
}

}  // namespace rt
