// The moment codecs of state/moment_quant.h by SIMD lanes: with AVX-512F (16
// lanes) the 8-bit minifloat encode (the integer maths of mf_nearest and
// mf_stochastic lane by lane), the 4-bit encode, and the decode of both; with
// AVX2 (8 lanes) the 8-bit encode and decode. Shared by the block codec
// (moment_quant.cpp) and the fused AdamW blocks (optim/adamw_lean.cpp), so both
// give the same bits. Include it only after turning implicit FP contraction
// off, and call it only where the CPU has the instructions.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "state/moment_quant.h"

namespace rt {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 and AVX-512 intrinsics (GCC bug 105593)
#define RT_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

// One block's constants: its code and absmax (the largest |x| of the block, NaN ignored).
struct Q8Encode512 {
  __m512 vinv, vamax, lmin;
  __m512i base, half, win, halfmin;
  __m128i sh, draw_sh;
};

RT_AVX512_INLINE Q8Encode512 q8_encode_consts512(const QuantCode& c, float amax) {
  const float inv = amax > 0 ? 1.0f / amax : 0.0f;
  return {_mm512_set1_ps(inv),
          _mm512_set1_ps(amax),
          _mm512_set1_ps(c.level[1]),
          _mm512_set1_epi32(c.base),
          _mm512_set1_epi32(c.shift ? 1 << (c.shift - 1) : 0),
          _mm512_set1_epi32(c.base << c.shift),
          _mm512_set1_epi32((c.base << c.shift) - (1 << 23)),
          _mm_cvtsi32_si128(c.shift),
          _mm_cvtsi32_si128(32 - c.shift)};
}

// quant_mix32 of 16 lanes.
RT_AVX512_INLINE __m512i quant_mix32x16(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7feb352d));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// The counters of lanes 0..15 from element 0 of a block (key32 + i * step),
// and the step to the next 16.
RT_AVX512_INLINE __m512i quant_counters16(uint32_t key32) {
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(key32)),
                          _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(kQuantCounterStep))));
}
RT_AVX512_INLINE __m512i quant_counter_step16() { return _mm512_set1_epi32(static_cast<int>(16u * kQuantCounterStep)); }

// The codes (one per int32 lane, sign bit 7 for m) of x; h: the lanes' hash
// (quant_mix32 of their counters; unused with nearest rounding). kFinite: the
// caller knows every x is finite (then y >= 0 needs no clamp from below).
template <bool kStochastic, bool kSigned, bool kFinite = false>
RT_AVX512_INLINE __m512i q8_encode16(const Q8Encode512& e, __m512 xv, __m512i h) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  const __m512i izero = _mm512_setzero_si512(), ione = _mm512_set1_epi32(1);
  const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(xv), _mm512_set1_epi32(0x7fffffff)));
  __m512 y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, e.vamax, _CMP_EQ_OQ), _mm512_mul_ps(a, e.vinv), one);
  y = _mm512_min_ps(kFinite ? y : _mm512_max_ps(y, zero), one);  // clamp01 (NaN -> 0)
  const __m512i yb = _mm512_castps_si512(y);
  __m512i q;
  if constexpr (kStochastic) {
    const __m512i j = _mm512_max_epi32(
        _mm512_sub_epi32(_mm512_srl_epi32(_mm512_add_epi32(yb, _mm512_srl_epi32(h, e.draw_sh)), e.sh), e.base), izero);
    if constexpr (kSigned) {  // below the window: the smallest level with probability y / level
      const __mmask16 in_window = _mm512_cmpge_epi32_mask(yb, e.win);
      q = _mm512_add_epi32(j, ione);
      if (in_window != 0xffff) {  // rare: a lane below the window
        const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(0x1.0p-24f));
        const __mmask16 bottom = _mm512_cmp_ps_mask(_mm512_mul_ps(u, e.lmin), y, _CMP_LT_OQ);
        q = _mm512_mask_blend_epi32(in_window, _mm512_maskz_mov_epi32(bottom, ione), q);
      }
    } else {
      q = j;
    }
  } else {
    const __m512i j =
        _mm512_max_epi32(_mm512_sub_epi32(_mm512_srl_epi32(_mm512_add_epi32(yb, e.half), e.sh), e.base), izero);
    q = kSigned ? _mm512_maskz_add_epi32(_mm512_cmpge_epi32_mask(yb, e.halfmin), j, ione) : j;
  }
  if constexpr (kSigned) q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(xv), 31), 7));
  return q;
}

// Index of each lane's y in the sorted table t (<= 16 entries, padded with +inf):
// the count of entries e with cmp(e, y) (e < y, or e <= y), by binary search.
template <int kEntries, bool kLessEqual>
RT_AVX512_INLINE __m512i count_below_avx512(__m512 t, __m512 y) {
  __m512i idx = _mm512_setzero_si512();
  for (int step = kEntries / 2; step >= 1; step /= 2) {
    const __m512i probe = _mm512_add_epi32(idx, _mm512_set1_epi32(step - 1));
    const __m512 e = _mm512_permutexvar_ps(probe, t);
    const __mmask16 go = _mm512_cmp_ps_mask(e, y, kLessEqual ? _CMP_LE_OQ : _CMP_LT_OQ);
    idx = _mm512_mask_add_epi32(idx, go, idx, _mm512_set1_epi32(step));
  }
  return idx;
}

// The 4-bit codes (m4: 8 levels and a sign bit; v4: 16 powers of two): one
// block's constants, its levels and mids held in registers (padded with +inf).
struct Q4Encode512 {
  __m512 vinv, vamax, lev, mid;
  __m512i nm1, nm2;
};

RT_AVX512_INLINE Q4Encode512 q4_encode_consts512(const QuantCode& c, float amax) {
  const float inv = amax > 0 ? 1.0f / amax : 0.0f;
  alignas(64) float l[16], m[16];
  for (int j = 0; j < 16; ++j) {
    l[j] = j < c.n ? c.level[j] : INFINITY;
    m[j] = j + 1 < c.n ? c.mid[j] : INFINITY;
  }
  return {_mm512_set1_ps(inv),         _mm512_set1_ps(amax),         _mm512_load_ps(l), _mm512_load_ps(m),
          _mm512_set1_epi32(c.n - 1), _mm512_set1_epi32(c.n - 2)};
}

// The codes (one per int32 lane, sign bit 3 for m) of x: the index as the
// count of levels or mids below y, by register compares (m4) or from y's
// exponent (v4: levels 2^(k - 15), mids 1.5 x 2^(k - 15)).
template <bool kStochastic, bool kSigned>
RT_AVX512_INLINE __m512i q4_encode16(const Q4Encode512& e, __m512 xv, __m512i h) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  const __m512i izero = _mm512_setzero_si512(), ione = _mm512_set1_epi32(1);
  const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(xv), _mm512_set1_epi32(0x7fffffff)));
  __m512 y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, e.vamax, _CMP_EQ_OQ), _mm512_mul_ps(a, e.vinv), one);
  y = _mm512_min_ps(_mm512_max_ps(y, zero), one);  // clamp01 (NaN -> 0)
  const __m512i yb = _mm512_castps_si512(y);
  __m512i q;
  if constexpr (kStochastic) {
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), _mm512_set1_ps(0x1.0p-24f));
    __m512i f;                 // count of levels <= y, - 1
    if constexpr (!kSigned) {  // v4: levels 2^(k - 15), so f = exponent(y) + 15
      f = _mm512_max_epi32(_mm512_add_epi32(_mm512_srli_epi32(yb, 23), _mm512_set1_epi32(15 - 127)),
                           _mm512_set1_epi32(-1));
    } else {
      f = _mm512_sub_epi32(count_below_avx512<16, true>(e.lev, y), ione);
    }
    const __m512i fc = _mm512_max_epi32(_mm512_min_epi32(f, e.nm2), izero);
    __m512 lo, hi;
    if constexpr (!kSigned) {  // 2^(fc - 15), 2^(fc - 14) by their bits
      lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(fc, _mm512_set1_epi32(127 - 15)), 23));
      hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(fc, _mm512_set1_epi32(127 - 14)), 23));
    } else {
      lo = _mm512_permutexvar_ps(fc, e.lev);
      hi = _mm512_permutexvar_ps(_mm512_add_epi32(fc, ione), e.lev);
    }
    const __mmask16 up = _mm512_cmp_ps_mask(_mm512_mul_ps(u, _mm512_sub_ps(hi, lo)), _mm512_sub_ps(y, lo), _CMP_LT_OQ);
    q = _mm512_mask_add_epi32(fc, up, fc, ione);
    q = _mm512_mask_mov_epi32(q, _mm512_cmpgt_epi32_mask(izero, f), izero);  // below the smallest level: 0
    q = _mm512_mask_mov_epi32(q, _mm512_cmpgt_epi32_mask(f, e.nm2), e.nm1);
  } else if constexpr (!kSigned) {
    // v4: the count of mids < y is exponent(y) + 15, + 1 when y's mantissa is
    // above 1.5, clamped to [0, 15]
    const __m512i x = _mm512_add_epi32(_mm512_srli_epi32(yb, 23), _mm512_set1_epi32(15 - 127));
    const __mmask16 above =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(yb, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x400000));
    q = _mm512_max_epi32(_mm512_min_epi32(_mm512_mask_add_epi32(x, above, x, ione), e.nm1), izero);
  } else {
    q = count_below_avx512<16, false>(e.mid, y);  // count of mids < y
  }
  if constexpr (kSigned) q = _mm512_or_si512(q, _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(xv), 31), 3));
  return q;
}

// 16 4-bit codes (int32 lanes) into 8 bytes: element 2j in the low nibble of byte j.
RT_AVX512_INLINE void q4_store16(uint8_t* bytes, __m512i q) {
  // each 64-bit lane: low dword q[2j], high q[2j + 1] -> byte q[2j] | q[2j + 1] << 4
  const __m512i pairs = _mm512_or_si512(q, _mm512_srli_epi64(q, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi64_epi8(pairs));
}

// Width-generic forms for code templated on kQ8 (8-bit minifloat codes, else 4-bit).
template <bool kQ8>
RT_AVX512_INLINE auto quant_encode_consts512(const QuantCode& c, float amax) {
  if constexpr (kQ8)
    return q8_encode_consts512(c, amax);
  else
    return q4_encode_consts512(c, amax);
}
// kFinite: as q8_encode16's (the 4-bit encode clamps either way).
template <bool kQ8, bool kStochastic, bool kSigned, bool kFinite = false, class E>
RT_AVX512_INLINE __m512i quant_encode16(const E& e, __m512 xv, __m512i h) {
  if constexpr (kQ8)
    return q8_encode16<kStochastic, kSigned, kFinite>(e, xv, h);
  else
    return q4_encode16<kStochastic, kSigned>(e, xv, h);
}
// The codes q of elements [i, i + 16) of a moment (codes from element 0; 4-bit: i even).
template <bool kQ8>
RT_AVX512_INLINE void quant_store16(uint8_t* codes, int64_t i, __m512i q) {
  if constexpr (kQ8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(q));
  else
    q4_store16(codes + (i >> 1), q);
}

// Decode: one block's constants (its code and scale).
struct QDecode512 {
  __m512 scale, tab4;  // tab4: a 4-bit code's levels
  __m512i mf_off;      // 8-bit codes: level bits (index + base - has_zero) << shift
  __m128i mf_sh;
};

RT_AVX512_INLINE QDecode512 quant_decode_consts512(const QuantCode& c, float scale) {
  return {_mm512_set1_ps(scale), _mm512_loadu_ps(c.level), _mm512_set1_epi32(c.base - (c.has_zero ? 1 : 0)),
          _mm_cvtsi32_si128(c.shift)};
}

// Elements [e, e + 16) of a moment (codes from element 0; 4-bit: e even) as x = level * scale, signed for m.
template <bool kQ8, bool kSigned>
RT_AVX512_INLINE __m512 quant_decode16(const QDecode512& d, const uint8_t* codes, int64_t e) {
  __m512i q;
  if constexpr (kQ8) {
    q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + e)));
  } else {
    const __m512i b = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + (e >> 1))));
    q = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi64(0xf)), _mm512_slli_epi64(_mm512_srli_epi64(b, 4), 32));
  }
  const __m512i idx = _mm512_and_si512(q, _mm512_set1_epi32(kQ8 ? (kSigned ? 0x7f : 0xff) : (kSigned ? 0x7 : 0xf)));
  __m512 lv;
  if constexpr (!kQ8) {
    lv = _mm512_permutexvar_ps(idx, d.tab4);
  } else {  // 0 for index 0 of m
    const __m512i lb = _mm512_sll_epi32(_mm512_add_epi32(idx, d.mf_off), d.mf_sh);
    lv = _mm512_castsi512_ps(kSigned ? _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(idx, idx), lb) : lb);
  }
  __m512 y = _mm512_mul_ps(lv, d.scale);
  if constexpr (kSigned)
    y = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(y),
        _mm512_slli_epi32(_mm512_and_si512(q, _mm512_set1_epi32(kQ8 ? 0x80 : 0x8)), kQ8 ? 24 : 28)));
  return y;
}

#undef RT_AVX512_INLINE
#pragma GCC diagnostic pop

// ---- AVX2: the 8-bit codes, 8 lanes (the same integer maths per lane) ----
#define RT_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

struct Q8Encode256 {
  __m256 vinv, vamax, lmin;
  __m256i base, half, win_m1, halfmin_m1;  // win_m1, halfmin_m1: the thresholds - 1 (compared with >)
  __m128i sh, draw_sh;
};

RT_AVX2_INLINE Q8Encode256 q8_encode_consts256(const QuantCode& c, float amax) {
  const float inv = amax > 0 ? 1.0f / amax : 0.0f;
  return {_mm256_set1_ps(inv),
          _mm256_set1_ps(amax),
          _mm256_set1_ps(c.level[1]),
          _mm256_set1_epi32(c.base),
          _mm256_set1_epi32(c.shift ? 1 << (c.shift - 1) : 0),
          _mm256_set1_epi32((c.base << c.shift) - 1),
          _mm256_set1_epi32((c.base << c.shift) - (1 << 23) - 1),
          _mm_cvtsi32_si128(c.shift),
          _mm_cvtsi32_si128(32 - c.shift)};
}

// quant_mix32 of 8 lanes.
RT_AVX2_INLINE __m256i quant_mix32x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7feb352d));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}
RT_AVX2_INLINE __m256i quant_counters8(uint32_t key32) {
  return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(key32)),
                          _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_epi32(static_cast<int>(kQuantCounterStep))));
}
RT_AVX2_INLINE __m256i quant_counter_step8() { return _mm256_set1_epi32(static_cast<int>(8u * kQuantCounterStep)); }

// The codes (one per int32 lane, sign bit 7 for m) of x; h: the lanes' hash.
// kFinite: every x is finite (y >= 0 needs no clamp from below).
template <bool kStochastic, bool kSigned, bool kFinite = false>
RT_AVX2_INLINE __m256i q8_encode8(const Q8Encode256& e, __m256 xv, __m256i h) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  const __m256i izero = _mm256_setzero_si256(), ione = _mm256_set1_epi32(1);
  const __m256 a = _mm256_and_ps(xv, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  __m256 y = _mm256_blendv_ps(_mm256_mul_ps(a, e.vinv), one, _mm256_cmp_ps(a, e.vamax, _CMP_EQ_OQ));
  y = _mm256_min_ps(kFinite ? y : _mm256_max_ps(y, zero), one);  // clamp01: max(y, 0) is y > 0 ? y : 0 (NaN -> 0)
  const __m256i yb = _mm256_castps_si256(y);
  __m256i q;
  if constexpr (kStochastic) {
    const __m256i j = _mm256_max_epi32(
        _mm256_sub_epi32(_mm256_srl_epi32(_mm256_add_epi32(yb, _mm256_srl_epi32(h, e.draw_sh)), e.sh), e.base), izero);
    if constexpr (kSigned) {  // below the window: the smallest level with probability y / level
      const __m256i in_window = _mm256_cmpgt_epi32(yb, e.win_m1);
      q = _mm256_add_epi32(j, ione);
      if (_mm256_movemask_ps(_mm256_castsi256_ps(in_window)) != 0xff) {  // rare: a lane below the window
        const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(0x1.0p-24f));
        const __m256i bottom =
            _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(_mm256_mul_ps(u, e.lmin), y, _CMP_LT_OQ)), ione);
        q = _mm256_blendv_epi8(bottom, q, in_window);
      }
    } else {
      q = j;
    }
  } else {
    const __m256i j =
        _mm256_max_epi32(_mm256_sub_epi32(_mm256_srl_epi32(_mm256_add_epi32(yb, e.half), e.sh), e.base), izero);
    q = kSigned ? _mm256_and_si256(_mm256_add_epi32(j, ione), _mm256_cmpgt_epi32(yb, e.halfmin_m1)) : j;
  }
  if constexpr (kSigned) q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(xv), 31), 7));
  return q;
}

// 8 codes (int32 lanes < 256) into 8 bytes.
RT_AVX2_INLINE void q8_store8(uint8_t* codes, __m256i q) {
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(codes), _mm_packus_epi16(w, w));
}

struct Q8Decode256 {
  __m256 scale;
  __m256i mf_off;
  __m128i mf_sh;
};
RT_AVX2_INLINE Q8Decode256 q8_decode_consts256(const QuantCode& c, float scale) {
  return {_mm256_set1_ps(scale), _mm256_set1_epi32(c.base - (c.has_zero ? 1 : 0)), _mm_cvtsi32_si128(c.shift)};
}

// Elements [e, e + 8) of an 8-bit moment as level * scale, signed for m.
template <bool kSigned>
RT_AVX2_INLINE __m256 q8_decode8(const Q8Decode256& d, const uint8_t* codes, int64_t e) {
  const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + e)));
  const __m256i idx = _mm256_and_si256(q, _mm256_set1_epi32(kSigned ? 0x7f : 0xff));
  const __m256i lb = _mm256_sll_epi32(_mm256_add_epi32(idx, d.mf_off), d.mf_sh);
  const __m256 lv =
      _mm256_castsi256_ps(kSigned ? _mm256_andnot_si256(_mm256_cmpeq_epi32(idx, _mm256_setzero_si256()), lb) : lb);
  __m256 y = _mm256_mul_ps(lv, d.scale);
  if constexpr (kSigned)
    y = _mm256_xor_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(0x80)), 24)));
  return y;
}

#undef RT_AVX2_INLINE

}  // namespace rt
