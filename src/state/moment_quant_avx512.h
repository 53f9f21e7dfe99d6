// The 8-bit minifloat encode of 16 lanes with AVX-512F (state/moment_quant.h's
// codes m8, v8; the integer maths of mf_nearest and mf_stochastic lane by
// lane), shared by the block encoder (moment_quant.cpp) and the fused 8-bit
// AdamW block (optim/adamw_lean.cpp), which interleaves it with the next
// block's update. Include it only after turning implicit FP contraction off,
// and call it only where the CPU has AVX-512F.
#pragma once
#include <immintrin.h>

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

#undef RT_AVX512_INLINE
#pragma GCC diagnostic pop

}  // namespace rt
