// The AVX2+FMA and AVX-512F forms of the AdamW element maths
// (optim/adamw_math.h's adamw_math, lane for lane) and of f32_to_bf16,
// shared by the fp32 and split kernels (optim/adamw.cpp) and the fused
// quantized blocks (optim/adamw_lean.cpp), so they cannot drift apart. Include
// it only after turning implicit FP contraction off (adamw_math.h's rule) and
// call it only where the CPU has the instructions.
#pragma once
#include <immintrin.h>

#include "optim/adamw_math.h"

namespace rt {

struct AdamWVec256 {
  __m256 grad_scale, decay, coeff, beta2, omb2, bc2s, eps, nss;
  bool lerp_small;
};

__attribute__((target("avx2,fma"), always_inline)) inline AdamWVec256 adamw_vec256(const AdamWConsts& c) {
  return {_mm256_set1_ps(c.grad_scale), _mm256_set1_ps(c.decay),           _mm256_set1_ps(c.lerp_coeff),
          _mm256_set1_ps(c.beta2),      _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.bc2_sqrt),
          _mm256_set1_ps(c.eps),        _mm256_set1_ps(c.neg_step_size),   c.lerp_small};
}

__attribute__((target("avx2,fma"), always_inline)) inline __m256 adamw_math_avx2(__m256 p, __m256& m, __m256& v,
                                                                                 __m256 g, const AdamWVec256& k) {
  __m256 gs = _mm256_mul_ps(g, k.grad_scale);
  __m256 pp = _mm256_mul_ps(p, k.decay);
  __m256 mm = m;
  __m256 d = _mm256_sub_ps(gs, mm);
  mm = _mm256_fmadd_ps(k.coeff, d, k.lerp_small ? mm : gs);
  __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(k.omb2, gs), gs, _mm256_mul_ps(v, k.beta2));
  __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), k.bc2s), k.eps);
  m = mm;
  v = vv;
  return _mm256_add_ps(pp, _mm256_div_ps(_mm256_mul_ps(k.nss, mm), denom));
}

// f32_to_bf16 of 8 lanes, the bf16 in the low half of each 32-bit lane.
__attribute__((target("avx2"), always_inline)) inline __m256i bf16_round_avx2(__m256 x) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf_bits = _mm256_set1_epi32(0x7f800000);
  const __m256i one = _mm256_set1_epi32(1), round_bias = _mm256_set1_epi32(0x7fff);
  const __m256i quiet = _mm256_set1_epi32(0x40);
  __m256i u = _mm256_castps_si256(x);
  __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf_bits);
  __m256i bias = _mm256_add_epi32(round_bias, _mm256_and_si256(hi, one));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  return _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), is_nan);
}

// GCC 12 warns falsely inside AVX-512 intrinsics (_mm512_undefined_*, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct AdamWVec512 {
  __m512 grad_scale, decay, coeff, beta2, omb2, bc2s, eps, nss;
  bool lerp_small;
};

__attribute__((target("avx512f"), always_inline)) inline AdamWVec512 adamw_vec512(const AdamWConsts& c) {
  return {_mm512_set1_ps(c.grad_scale), _mm512_set1_ps(c.decay),           _mm512_set1_ps(c.lerp_coeff),
          _mm512_set1_ps(c.beta2),      _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.bc2_sqrt),
          _mm512_set1_ps(c.eps),        _mm512_set1_ps(c.neg_step_size),   c.lerp_small};
}

__attribute__((target("avx512f"), always_inline)) inline __m512 adamw_math_avx512(__m512 p, __m512& m, __m512& v,
                                                                                  __m512 g, const AdamWVec512& k) {
  __m512 gs = _mm512_mul_ps(g, k.grad_scale);
  __m512 pp = _mm512_mul_ps(p, k.decay);
  __m512 mm = m;
  __m512 d = _mm512_sub_ps(gs, mm);
  mm = _mm512_fmadd_ps(k.coeff, d, k.lerp_small ? mm : gs);
  __m512 vv = _mm512_fmadd_ps(_mm512_mul_ps(k.omb2, gs), gs, _mm512_mul_ps(v, k.beta2));
  __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), k.bc2s), k.eps);
  m = mm;
  v = vv;
  return _mm512_add_ps(pp, _mm512_div_ps(_mm512_mul_ps(k.nss, mm), denom));
}

__attribute__((target("avx512f"), always_inline)) inline __m512i bf16_round_avx512(__m512 x) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf_bits = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1), round_bias = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  __m512i u = _mm512_castps_si512(x);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf_bits);
  __m512i bias = _mm512_add_epi32(round_bias, _mm512_and_si512(hi, one));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  return _mm512_mask_blend_epi32(is_nan, r, _mm512_or_si512(hi, quiet));
}

#pragma GCC diagnostic pop

// The low 16 bits of 8 lanes (each <= 0xffff), packed into 128 bits.
__attribute__((target("avx2,fma"), always_inline)) inline __m128i pack16_avx2(__m256i r) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));  // no saturation
}

// Split masters (state/split_master.h), a vector of lanes at a time, lane for
// lane split_master_decode_one / split_master_encode_one: the AdamW split
// kernels (optim/adamw.cpp) and Muon's (optim/muon.cpp) share them.
// Decode: 8 elements from their shadow and rem halves and their 8 tie bits
// (bit j: element j).
__attribute__((target("avx2,fma"), always_inline)) inline __m256 split_decode_avx2(const uint16_t* shadow,
                                                                                   const uint16_t* rem, uint32_t tie8) {
  const __m256i low15 = _mm256_set1_epi32(0x7fff), bf16_inf = _mm256_set1_epi32(0x7f80);
  const __m256i one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  // hi = s - (tie ? (s is NaN ? 0x40 : 1) : 0)
  const __m256i tb = _mm256_set1_epi32(static_cast<int>(tie8 & 0xffu));
  const __m256i tie = _mm256_cmpeq_epi32(_mm256_and_si256(tb, lane_bit), lane_bit);
  const __m256i s = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(shadow)));
  const __m256i r = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rem)));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(s, low15), bf16_inf);
  const __m256i down = _mm256_and_si256(_mm256_blendv_epi8(one, quiet, nan), tie);
  const __m256i hi = _mm256_sub_epi32(s, down);
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(hi, 16), r));
}
// Encode 8 values: shadow = f32_to_bf16(x), rem = the low halves, tie bit j =
// shadow j != the upper half of x j.
struct SplitLanes8 {
  __m128i shadow, rem;
  uint32_t tie;
};
__attribute__((target("avx2,fma"), always_inline)) inline SplitLanes8 split_encode_avx2(__m256 x) {
  const __m256i sr = bf16_round_avx2(x);
  const __m256i u = _mm256_castps_si256(x);
  const int same = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(sr, _mm256_srli_epi32(u, 16))));
  return {pack16_avx2(sr), pack16_avx2(_mm256_and_si256(u, _mm256_set1_epi32(0xffff))),
          static_cast<uint32_t>(~same & 0xff)};
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
// The same, 16 elements (tie bit j: element j).
__attribute__((target("avx512f"), always_inline)) inline __m512 split_decode_avx512(const uint16_t* shadow,
                                                                                    const uint16_t* rem,
                                                                                    __mmask16 tie) {
  const __m512i low15 = _mm512_set1_epi32(0x7fff), bf16_inf = _mm512_set1_epi32(0x7f80);
  const __m512i one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  const __m512i s = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(shadow)));
  const __m512i r = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rem)));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(s, low15), bf16_inf);
  const __m512i hi = _mm512_mask_sub_epi32(s, tie, s, _mm512_mask_blend_epi32(nan, one, quiet));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(hi, 16), r));
}
struct SplitLanes16 {
  __m256i shadow, rem;
  __mmask16 tie;
};
__attribute__((target("avx512f"), always_inline)) inline SplitLanes16 split_encode_avx512(__m512 x) {
  const __m512i sr = bf16_round_avx512(x);
  const __m512i u = _mm512_castps_si512(x);
  return {_mm512_cvtepi32_epi16(sr), _mm512_cvtepi32_epi16(u),  // truncating: the low halves
          _mm512_cmpneq_epi32_mask(sr, _mm512_srli_epi32(u, 16))};
}
#pragma GCC diagnostic pop

}  // namespace rt
