// See adamw_lean.h. No implicit FP contraction (optim/adamw_math.h's rule):
// the pragma comes before any include.
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "optim/adamw_lean.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw_math.h"
#include "optim/adamw_math_simd.h"
#include "state/moment_quant_simd.h"

namespace rt {

uint16_t bf16_round_stochastic(float x, uint32_t r16) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return f32_to_bf16(x);  // inf, NaN: as round to nearest
  return static_cast<uint16_t>((u + (r16 & 0xffffu)) >> 16);
}

namespace {

struct Seg {
  int64_t lo, hi;  // unit elements of one tensor
  bool decays;
};

struct Lean {
  StateUnit* u;
  int64_t b;
  const float* g;  // element x at g[x - b]
  uint16_t* out;
  const uint16_t* in;
  AdamWConsts c_decay, c_plain;
  std::vector<Seg> segs;
  QuantRounding rounding;
  uint64_t key;  // per (seed, t, unit)
};

constexpr uint64_t kKeyMaster = 0x6d61737465720001ull, kKeyM = 0x6d6f6d656e740002ull, kKeyV = 0x6d6f6d656e740003ull;

inline bool tie_bit(const uint64_t* tie, int64_t i) { return ((tie[i >> 6] >> (i & 63)) & 1u) != 0; }
inline void tie_set(uint64_t* tie, int64_t i, bool t) {
  const uint64_t bit = uint64_t{1} << (i & 63);
  tie[i >> 6] = t ? (tie[i >> 6] | bit) : (tie[i >> 6] & ~bit);
}

// The master of a block in and out, vectorised: whole groups of 16 elements
// (16-aligned in unit coordinates, so a group's tie bits are one 16-bit quarter
// of a tie word) run with AVX-512F when optim's SIMD level is avx512, of 8 with
// AVX2 when it is avx2, the elements around them through the scalar functions
// below; all give the same bits. The stochastic rounding draw of element i:
// quant_mix32(key32 + i * kQuantCounterStep) >> 16 (its top 16 bits), a pure
// function of (key, i).
inline uint32_t master_draw(uint32_t key32, int64_t i) {
  return quant_mix32(key32 + static_cast<uint32_t>(i) * kQuantCounterStep) >> 16;
}
inline uint32_t master_key32(const Lean& a) { return quant_key32(quant_mix64(a.key ^ kKeyMaster)); }

// Scalar: unit element i's master as fp32.
inline float master_load_one(const Lean& a, int64_t i) {
  const StateUnit& u = *a.u;
  switch (u.master_kind) {
    case MasterStorage::fp32:
      return u.master()[i];
    case MasterStorage::split:
      return split_master_decode_one(a.in[i], u.rem()[i], tie_bit(u.tie(), i));
    case MasterStorage::bf16_sr:
    case MasterStorage::bf16_kahan:
      return bf16_to_f32(a.in[i]);
  }
  return 0;
}

// Scalar: stores the new fp32 value x of unit element i.
inline void master_store_one(const Lean& a, uint32_t key32, int64_t i, float x) {
  StateUnit& u = *a.u;
  switch (u.master_kind) {
    case MasterStorage::fp32:
      u.master()[i] = x;
      return;
    case MasterStorage::split: {  // whole tie words belong to this block (block-aligned ranges)
      bool t;
      a.out[i] = split_master_encode_one(x, u.rem() + i, &t);
      tie_set(u.tie(), i, t);
      return;
    }
    case MasterStorage::bf16_sr:
      a.out[i] = bf16_round_stochastic(x, master_draw(key32, i));
      return;
    case MasterStorage::bf16_kahan: {
      uint16_t* comp = u.comp();
      const float old = bf16_to_f32(a.in[i]);
      const float y = (x - old) - bf16_to_f32(comp[i]);
      const uint16_t t = f32_to_bf16(old + y);
      comp[i] = f32_to_bf16((bf16_to_f32(t) - old) - y);
      a.out[i] = t;
      return;
    }
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 and AVX-512 intrinsics (GCC bug 105593)
#define RT_AVX512 __attribute__((target("avx512f")))

RT_AVX512 inline __m512i widen16(const uint16_t* q) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
}
RT_AVX512 inline __m512 bf16x16_load(const uint16_t* q) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(widen16(q), 16));
}
RT_AVX512 inline void narrow16_store(uint16_t* q, __m512i r) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtepi32_epi16(r));
}
RT_AVX512 inline uint16_t tie16_load(const uint64_t* tie, int64_t i) {  // bits [i, i + 16), i % 16 == 0
  return static_cast<uint16_t>(tie[i >> 6] >> (i & 63));
}
RT_AVX512 inline void tie16_store(uint64_t* tie, int64_t i, uint16_t bits) {
  const int sh = static_cast<int>(i & 63);
  tie[i >> 6] = (tie[i >> 6] & ~(uint64_t{0xffff} << sh)) | (static_cast<uint64_t>(bits) << sh);
}

// Group [i, i + 16) of a split (kSplit) or bf16 master as fp32 (an fp32 master is used in place).
template <bool kSplit>
RT_AVX512 inline __m512 master_load16v(const Lean& a, int64_t i) {
  const StateUnit& u = *a.u;
  if constexpr (kSplit) {
    const __m512i sh = widen16(a.in + i), rem = widen16(u.rem() + i);
    const __mmask16 nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(sh, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7f80));
    const __m512i down = _mm512_maskz_mov_epi32(
        tie16_load(u.tie(), i), _mm512_mask_blend_epi32(nan, _mm512_set1_epi32(1), _mm512_set1_epi32(0x40)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_slli_epi32(_mm512_sub_epi32(sh, down), 16), rem));
  }
  return bf16x16_load(a.in + i);
}

// Stores the new values x of group [i, i + 16) of a master of kind kM (fp32: the master only).
template <MasterStorage kM>
RT_AVX512 inline void master_store16v(const Lean& a, uint32_t key32, int64_t i, __m512 x) {
  StateUnit& u = *a.u;
  const __m512i xb = _mm512_castps_si512(x);
  switch (kM) {
    case MasterStorage::fp32:
      _mm512_storeu_ps(u.master() + i, x);
      return;
    case MasterStorage::split: {
      const __m512i sh = bf16_round_avx512(x);
      narrow16_store(a.out + i, sh);
      narrow16_store(u.rem() + i, _mm512_and_si512(xb, _mm512_set1_epi32(0xffff)));
      tie16_store(u.tie(), i, _mm512_cmpneq_epi32_mask(sh, _mm512_srli_epi32(xb, 16)));
      return;
    }
    case MasterStorage::bf16_sr: {
      const __m512i step = _mm512_set1_epi32(static_cast<int>(kQuantCounterStep));
      __m512i h = _mm512_add_epi32(
          _mm512_set1_epi32(static_cast<int>(key32 + static_cast<uint32_t>(i) * kQuantCounterStep)),
          _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), step));
      h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));  // quant_mix32
      h = _mm512_mullo_epi32(h, _mm512_set1_epi32(0x7feb352d));
      h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
      h = _mm512_mullo_epi32(h, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
      h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
      const __mmask16 finite =
          _mm512_cmplt_epi32_mask(_mm512_and_si512(xb, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      const __m512i sr = _mm512_srli_epi32(_mm512_add_epi32(xb, _mm512_srli_epi32(h, 16)), 16);
      narrow16_store(a.out + i, finite == 0xffff ? sr : _mm512_mask_blend_epi32(finite, bf16_round_avx512(x), sr));
      return;
    }
    case MasterStorage::bf16_kahan: {
      uint16_t* comp = u.comp();
      const __m512 old = bf16x16_load(a.in + i);
      const __m512 y = _mm512_sub_ps(_mm512_sub_ps(x, old), bf16x16_load(comp + i));
      const __m512i t = bf16_round_avx512(_mm512_add_ps(old, y));
      const __m512 tf = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
      narrow16_store(comp + i, bf16_round_avx512(_mm512_sub_ps(_mm512_sub_ps(tf, old), y)));
      narrow16_store(a.out + i, t);
      return;
    }
  }
}

// Group [i, i + 16) -> p[0, 16), and back.
RT_AVX512 void master_load16(const Lean& a, int64_t i, float* p) {
  _mm512_storeu_ps(p, a.u->master_kind == MasterStorage::split ? master_load16v<true>(a, i)
                                                               : master_load16v<false>(a, i));
}
RT_AVX512 void master_store16(const Lean& a, uint32_t key32, int64_t i, const float* p) {
  const __m512 x = _mm512_loadu_ps(p);
  switch (a.u->master_kind) {
    case MasterStorage::fp32:
      return master_store16v<MasterStorage::fp32>(a, key32, i, x);
    case MasterStorage::split:
      return master_store16v<MasterStorage::split>(a, key32, i, x);
    case MasterStorage::bf16_sr:
      return master_store16v<MasterStorage::bf16_sr>(a, key32, i, x);
    case MasterStorage::bf16_kahan:
      return master_store16v<MasterStorage::bf16_kahan>(a, key32, i, x);
  }
}

#undef RT_AVX512
#pragma GCC diagnostic pop

// The AVX2 forms (8 lanes, a group's tie bits one byte of a tie word).
#define RT_AVX2 __attribute__((target("avx2")))

RT_AVX2 inline __m256i widen8(const uint16_t* q) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}
RT_AVX2 inline void narrow8_store(uint16_t* q, __m256i r) {  // r: 8 lanes < 2^16
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), w);
}
inline uint8_t tie8_load(const uint64_t* tie, int64_t i) { return static_cast<uint8_t>(tie[i >> 6] >> (i & 63)); }
inline void tie8_store(uint64_t* tie, int64_t i, uint8_t bits) {
  const int sh = static_cast<int>(i & 63);
  tie[i >> 6] = (tie[i >> 6] & ~(uint64_t{0xff} << sh)) | (static_cast<uint64_t>(bits) << sh);
}

// Group [i, i + 8) of a split (kSplit) or bf16 master as fp32.
template <bool kSplit>
RT_AVX2 inline __m256 master_load8v(const Lean& a, int64_t i) {
  const StateUnit& u = *a.u;
  if constexpr (kSplit) {
    const __m256i sh = widen8(a.in + i), rem = widen8(u.rem() + i);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(sh, _mm256_set1_epi32(0x7fff)), _mm256_set1_epi32(0x7f80));
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i tie = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(tie8_load(u.tie(), i)), bit), bit);
    const __m256i down = _mm256_and_si256(tie, _mm256_blendv_epi8(_mm256_set1_epi32(1), _mm256_set1_epi32(0x40), nan));
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32(_mm256_sub_epi32(sh, down), 16), rem));
  }
  return _mm256_castsi256_ps(_mm256_slli_epi32(widen8(a.in + i), 16));
}

// Stores the new values x of group [i, i + 8) of a master of kind kM (fp32: the master only).
template <MasterStorage kM>
RT_AVX2 inline void master_store8v(const Lean& a, uint32_t key32, int64_t i, __m256 x) {
  StateUnit& u = *a.u;
  const __m256i xb = _mm256_castps_si256(x);
  switch (kM) {
    case MasterStorage::fp32:
      _mm256_storeu_ps(u.master() + i, x);
      return;
    case MasterStorage::split: {
      const __m256i sh = bf16_round_avx2(x);
      narrow8_store(a.out + i, sh);
      narrow8_store(u.rem() + i, _mm256_and_si256(xb, _mm256_set1_epi32(0xffff)));
      const __m256i ne = _mm256_xor_si256(_mm256_cmpeq_epi32(sh, _mm256_srli_epi32(xb, 16)), _mm256_set1_epi32(-1));
      tie8_store(u.tie(), i, static_cast<uint8_t>(_mm256_movemask_ps(_mm256_castsi256_ps(ne))));
      return;
    }
    case MasterStorage::bf16_sr: {
      const __m256i h = quant_mix32x8(
          _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(key32 + static_cast<uint32_t>(i) * kQuantCounterStep)),
                           _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                              _mm256_set1_epi32(static_cast<int>(kQuantCounterStep)))));
      const __m256i nonfinite =
          _mm256_cmpgt_epi32(_mm256_and_si256(xb, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f7fffff));
      const __m256i sr = _mm256_srli_epi32(_mm256_add_epi32(xb, _mm256_srli_epi32(h, 16)), 16);
      narrow8_store(a.out + i, _mm256_testz_si256(nonfinite, nonfinite) ? sr
                                                                         : _mm256_blendv_epi8(sr, bf16_round_avx2(x), nonfinite));
      return;
    }
    case MasterStorage::bf16_kahan: {
      uint16_t* comp = u.comp();
      const __m256 old = _mm256_castsi256_ps(_mm256_slli_epi32(widen8(a.in + i), 16));
      const __m256 y =
          _mm256_sub_ps(_mm256_sub_ps(x, old), _mm256_castsi256_ps(_mm256_slli_epi32(widen8(comp + i), 16)));
      const __m256i t = bf16_round_avx2(_mm256_add_ps(old, y));
      const __m256 tf = _mm256_castsi256_ps(_mm256_slli_epi32(t, 16));
      narrow8_store(comp + i, bf16_round_avx2(_mm256_sub_ps(_mm256_sub_ps(tf, old), y)));
      narrow8_store(a.out + i, t);
      return;
    }
  }
}

RT_AVX2 void master_load8(const Lean& a, int64_t i, float* p) {
  _mm256_storeu_ps(p, a.u->master_kind == MasterStorage::split ? master_load8v<true>(a, i) : master_load8v<false>(a, i));
}
RT_AVX2 void master_store8(const Lean& a, uint32_t key32, int64_t i, const float* p) {
  const __m256 x = _mm256_loadu_ps(p);
  switch (a.u->master_kind) {
    case MasterStorage::fp32:
      return master_store8v<MasterStorage::fp32>(a, key32, i, x);
    case MasterStorage::split:
      return master_store8v<MasterStorage::split>(a, key32, i, x);
    case MasterStorage::bf16_sr:
      return master_store8v<MasterStorage::bf16_sr>(a, key32, i, x);
    case MasterStorage::bf16_kahan:
      return master_store8v<MasterStorage::bf16_kahan>(a, key32, i, x);
  }
}
#undef RT_AVX2

// Unit elements [lo, hi) of one block through fn(i) for its whole groups of
// `group` elements (16-aligned: AVX-512; 8: AVX2; 0: none) and fn1(i) for the rest.
template <class Fn, class Fn1>
inline void master_walk(int group, int64_t lo, int64_t hi, Fn&& fn, Fn1&& fn1) {
  int64_t i = lo;
  if (group > 0) {
    const int64_t g0 = std::min(hi, (lo + group - 1) & ~int64_t{group - 1});
    for (; i < g0; ++i) fn1(i);
    for (; i + group <= hi; i += group) fn(i);
  }
  for (; i < hi; ++i) fn1(i);
}

// Unit elements [s, s + k), inside one quantization block.
void lean_block(const Lean& a, int64_t s, int64_t k) {
  StateUnit& u = *a.u;
  alignas(64) float pb[kQuantBlock], m[kQuantBlock], v[kQuantBlock];
  const bool fp32 = u.master_kind == MasterStorage::fp32;
  const SimdLevel level = simd_level_active();
  const int group = level == SimdLevel::avx512 ? 16 : level == SimdLevel::avx2 ? 8 : 0;
  float* p = fp32 ? u.master() + s : pb;  // an fp32 master is updated in place
  if (!fp32)
    master_walk(
        group, s, s + k,
        [&](int64_t i) { group == 16 ? master_load16(a, i, pb + (i - s)) : master_load8(a, i, pb + (i - s)); },
        [&](int64_t i) { pb[i - s] = master_load_one(a, i); });
  const int64_t blk = s / kQuantBlock;
  if (u.quantized()) {
    quant_block_decode(u.moments, true, u.qm(), s, u.scale_m()[blk], k, m);
    quant_block_decode(u.moments, false, u.qv(), s, u.scale_v()[blk], k, v);
  } else {
    std::memcpy(m, u.m() + s, static_cast<size_t>(k) * 4);
    std::memcpy(v, u.v() + s, static_cast<size_t>(k) * 4);
  }
  const uint32_t key32 = master_key32(a);
  for (const Seg& sg : a.segs) {
    const int64_t lo = std::max(sg.lo, s), hi = std::min(sg.hi, s + k);
    if (lo >= hi) continue;
    adamw_span(p + (lo - s), m + (lo - s), v + (lo - s), a.g + (lo - a.b), hi - lo, sg.decays ? a.c_decay : a.c_plain,
               fp32 && a.out ? a.out + lo : nullptr);
    if (!fp32)
      master_walk(
          group, lo, hi,
          [&](int64_t i) {
            group == 16 ? master_store16(a, key32, i, pb + (i - s)) : master_store8(a, key32, i, pb + (i - s));
          },
          [&](int64_t i) { master_store_one(a, key32, i, pb[i - s]); });
    if (!u.quantized()) {
      std::memcpy(u.m() + lo, m + (lo - s), static_cast<size_t>(hi - lo) * 4);
      std::memcpy(u.v() + lo, v + (lo - s), static_cast<size_t>(hi - lo) * 4);
    }
  }
  if (u.quantized()) {
    const uint64_t kb = quant_mix64(a.key ^ quant_mix64(static_cast<uint64_t>(blk)));
    quant_block_encode(u.moments, true, a.rounding, kb ^ kKeyM, m, k, u.qm(), s, u.scale_m() + blk);
    quant_block_encode(u.moments, false, a.rounding, kb ^ kKeyV, v, k, u.qv(), s, u.scale_v() + blk);
  }
}

constexpr int64_t kLeanTask = 64 * kQuantBlock;  // elements per thread-pool task

// Whether the fused path serves u's whole blocks: quantized moments under a
// split or bf16-sr master, with AVX-512F (fused_block_avx512), or 8-bit ones
// with AVX2 (fused_block_avx2). (An fp32 master keeps lean_block's passes: fused
// it took 1.45 ns per element against 1.30 on a Zen 4 core with 8-bit moments,
// while split went 1.77 -> 1.19 and bf16-sr 1.71 -> 1.12 with AVX-512;
// bench/RESULTS.md "2026-12-04 (night)".)
bool fused_ok(const StateUnit& u) {
  if (!u.quantized() || (u.master_kind != MasterStorage::split && u.master_kind != MasterStorage::bf16_sr)) return false;
  if (simd_level_active() == SimdLevel::avx512)
    return quant_avx512_active() && quant_code_m4().n == 8 && quant_code_v4().n == 16;
  // AVX2 (with FMA: adamw_span's AVX2 path needs it too): 8-bit moments
  return simd_level_active() == SimdLevel::avx2 && quant_simd_active() && u.moments == MomentStorage::q8;
}

// The fused path (AVX-512F): a whole block [s, s + kQuantBlock) in two loops
// over its 16 groups, with no call between them. The first decodes m and v,
// loads the master and runs the element maths, keeping the new values and the
// absmax of m and v (a short body, so many groups' square roots and divisions
// are in flight at once); the second stores the master (split or bf16-sr) and
// encodes m and v. The same ops per lane as lean_block (quant_decode16,
// adamw_math_avx512, master_store16v, quant_encode16; the absmax as
// quant_block_encode's: over finite values the largest |x| is the largest as
// integer bits), so the same bits.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
#pragma GCC diagnostic ignored "-Wuninitialized"        // the same bug, through the lane codecs' inlining
#define RT_AVX512 __attribute__((target("avx512f")))

// group[j]: the constants of elements [s + 16j, s + 16j + 16), all of one
// tensor (tensors start 16-aligned), or nullptr for padding (m and v carried,
// the master untouched). A block holding a non-finite moment is encoded by
// quant_block_encode (its absmax ignores NaN). kQ8: 8-bit moments, else 4-bit.
template <bool kQ8, MasterStorage kM, bool kSR>
RT_AVX512 void fused_block_avx512(const Lean& a, int64_t s, const AdamWVec512* const* group, uint32_t key32) {
  StateUnit& u = *a.u;
  constexpr MomentStorage kMo = kQ8 ? MomentStorage::q8 : MomentStorage::q4;
  const QuantCode& cm = kQ8 ? quant_code_m8() : quant_code_m4();
  const QuantCode& cv = kQ8 ? quant_code_v8() : quant_code_v4();
  const int64_t blk = s / kQuantBlock;
  alignas(64) float pb[kQuantBlock], mb[kQuantBlock], vb[kQuantBlock];
  const QDecode512 dm = quant_decode_consts512(cm, u.scale_m()[blk]), dv = quant_decode_consts512(cv, u.scale_v()[blk]);
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  uint8_t *const qm = u.qm(), *const qv = u.qv();
  __m512i am = _mm512_setzero_si512(), av = _mm512_setzero_si512();
  for (int64_t j = 0; j < kQuantBlock; j += 16) {
    const int64_t i = s + j;
    __m512 m = quant_decode16<kQ8, true>(dm, qm, i), v = quant_decode16<kQ8, false>(dv, qv, i);
    if (const AdamWVec512* k = group[j / 16]) {
      const __m512 p = master_load16v<kM == MasterStorage::split>(a, i);
      _mm512_store_ps(pb + j, adamw_math_avx512(p, m, v, _mm512_loadu_ps(a.g + (i - a.b)), *k));
    }
    _mm512_store_ps(mb + j, m);
    _mm512_store_ps(vb + j, v);
    am = _mm512_max_epu32(am, _mm512_and_si512(_mm512_castps_si512(m), absmask));
    av = _mm512_max_epu32(av, _mm512_and_si512(_mm512_castps_si512(v), absmask));
  }
  const uint64_t kb = quant_mix64(a.key ^ quant_mix64(static_cast<uint64_t>(blk)));
  const uint32_t amax_m = _mm512_reduce_max_epu32(am), amax_v = _mm512_reduce_max_epu32(av);
  const bool finite = amax_m < 0x7f800000u && amax_v < 0x7f800000u;
  const float fm = std::bit_cast<float>(amax_m), fv = std::bit_cast<float>(amax_v);
  const __m512i step = quant_counter_step16();
  __m512i ctr_m = quant_counters16(quant_key32(kb ^ kKeyM)), ctr_v = quant_counters16(quant_key32(kb ^ kKeyV));
  const auto em = quant_encode_consts512<kQ8>(cm, fm), ev = quant_encode_consts512<kQ8>(cv, fv);
  for (int64_t j = 0; j < kQuantBlock; j += 16) {
    const int64_t i = s + j;
    if (group[j / 16]) master_store16v<kM>(a, key32, i, _mm512_load_ps(pb + j));
    if (!finite) continue;
    const __m512i hm = kSR ? quant_mix32x16(ctr_m) : _mm512_setzero_si512();
    const __m512i hv = kSR ? quant_mix32x16(ctr_v) : _mm512_setzero_si512();
    quant_store16<kQ8>(qm, i, quant_encode16<kQ8, kSR, true, true>(em, _mm512_load_ps(mb + j), hm));
    quant_store16<kQ8>(qv, i, quant_encode16<kQ8, kSR, false, true>(ev, _mm512_load_ps(vb + j), hv));
    ctr_m = _mm512_add_epi32(ctr_m, step);
    ctr_v = _mm512_add_epi32(ctr_v, step);
  }
  if (finite) {
    u.scale_m()[blk] = fm;
    u.scale_v()[blk] = fv;
  } else {
    quant_block_encode(kMo, true, a.rounding, kb ^ kKeyM, mb, kQuantBlock, qm, s, u.scale_m() + blk);
    quant_block_encode(kMo, false, a.rounding, kb ^ kKeyV, vb, kQuantBlock, qv, s, u.scale_v() + blk);
  }
}

// The constants of each group of kWidth elements of the whole block
// [s, s + kQuantBlock) into group[]: its tensor's (kd with weight decay, else
// kp), or nullptr for padding. False when a tensor ends inside a group (the
// block then takes lean_block). seg: the first segment that ends after the
// groups already seen; advanced.
template <int kWidth, class K>
bool block_groups(const Lean& a, size_t& seg, int64_t s, const K* kd, const K* kp, const K** group) {
  while (seg < a.segs.size() && a.segs[seg].hi <= s) ++seg;
  if (seg < a.segs.size() && a.segs[seg].lo <= s && s + kQuantBlock <= a.segs[seg].hi) {  // one tensor
    std::fill(group, group + kQuantBlock / kWidth, a.segs[seg].decays ? kd : kp);
    return true;
  }
  for (int j = 0; j < kQuantBlock / kWidth; ++j) {
    const int64_t g0 = s + int64_t{kWidth} * j;
    while (seg < a.segs.size() && a.segs[seg].hi <= g0) ++seg;
    const bool padding = seg == a.segs.size() || a.segs[seg].lo >= g0 + kWidth;
    if (!padding && (a.segs[seg].lo > g0 || g0 + kWidth > a.segs[seg].hi)) return false;
    group[j] = padding ? nullptr : a.segs[seg].decays ? kd : kp;
  }
  return true;
}

// Unit elements [s, e) (s a multiple of kQuantBlock) of a fused_ok unit:
// whole blocks whose 16-element groups each lie in one tensor or in padding
// through fused_block_avx512, the others (a tensor ending inside a group, the
// unit's last partial block) through lean_block.
template <bool kQ8, MasterStorage kM, bool kSR>
RT_AVX512 void fused_range_avx512(const Lean& a, int64_t s, int64_t e) {
  const AdamWVec512 kd = adamw_vec512(a.c_decay), kp = adamw_vec512(a.c_plain);
  const uint32_t key32 = master_key32(a);
  const AdamWVec512* group[kQuantBlock / 16];
  size_t seg = 0;
  for (; s < e; s += kQuantBlock) {
    if (s + kQuantBlock <= e && block_groups<16>(a, seg, s, &kd, &kp, group))
      fused_block_avx512<kQ8, kM, kSR>(a, s, group, key32);
    else
      lean_block(a, s, std::min(s + kQuantBlock, e) - s);
  }
}

// The AVX2 form (8-bit moments): the same two loops over 32 groups of 8.
#define RT_AVX2_FMA __attribute__((target("avx2,fma")))
template <MasterStorage kM, bool kSR>
RT_AVX2_FMA void fused_block_avx2(const Lean& a, int64_t s, const AdamWVec256* const* group, uint32_t key32) {
  StateUnit& u = *a.u;
  const int64_t blk = s / kQuantBlock;
  alignas(32) float pb[kQuantBlock], mb[kQuantBlock], vb[kQuantBlock];
  const Q8Decode256 dm = q8_decode_consts256(quant_code_m8(), u.scale_m()[blk]);
  const Q8Decode256 dv = q8_decode_consts256(quant_code_v8(), u.scale_v()[blk]);
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  uint8_t *const qm = u.qm(), *const qv = u.qv();
  __m256i am = _mm256_setzero_si256(), av = _mm256_setzero_si256();
  for (int64_t j = 0; j < kQuantBlock; j += 8) {
    const int64_t i = s + j;
    __m256 m = q8_decode8<true>(dm, qm, i), v = q8_decode8<false>(dv, qv, i);
    if (const AdamWVec256* k = group[j / 8]) {
      const __m256 p = master_load8v<kM == MasterStorage::split>(a, i);
      _mm256_store_ps(pb + j, adamw_math_avx2(p, m, v, _mm256_loadu_ps(a.g + (i - a.b)), *k));
    }
    _mm256_store_ps(mb + j, m);
    _mm256_store_ps(vb + j, v);
    am = _mm256_max_epu32(am, _mm256_and_si256(_mm256_castps_si256(m), absmask));
    av = _mm256_max_epu32(av, _mm256_and_si256(_mm256_castps_si256(v), absmask));
  }
  alignas(32) uint32_t lanes[2][8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[0]), am);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[1]), av);
  uint32_t amax_m = 0, amax_v = 0;
  for (int l = 0; l < 8; ++l) amax_m = std::max(amax_m, lanes[0][l]), amax_v = std::max(amax_v, lanes[1][l]);
  const uint64_t kb = quant_mix64(a.key ^ quant_mix64(static_cast<uint64_t>(blk)));
  const bool finite = amax_m < 0x7f800000u && amax_v < 0x7f800000u;
  const float fm = std::bit_cast<float>(amax_m), fv = std::bit_cast<float>(amax_v);
  const Q8Encode256 em = q8_encode_consts256(quant_code_m8(), fm), ev = q8_encode_consts256(quant_code_v8(), fv);
  const __m256i step = quant_counter_step8();
  __m256i ctr_m = quant_counters8(quant_key32(kb ^ kKeyM)), ctr_v = quant_counters8(quant_key32(kb ^ kKeyV));
  for (int64_t j = 0; j < kQuantBlock; j += 8) {
    const int64_t i = s + j;
    if (group[j / 8]) master_store8v<kM>(a, key32, i, _mm256_load_ps(pb + j));
    if (!finite) continue;
    const __m256i hm = kSR ? quant_mix32x8(ctr_m) : _mm256_setzero_si256();
    const __m256i hv = kSR ? quant_mix32x8(ctr_v) : _mm256_setzero_si256();
    q8_store8(qm + i, q8_encode8<kSR, true, true>(em, _mm256_load_ps(mb + j), hm));
    q8_store8(qv + i, q8_encode8<kSR, false, true>(ev, _mm256_load_ps(vb + j), hv));
    ctr_m = _mm256_add_epi32(ctr_m, step);
    ctr_v = _mm256_add_epi32(ctr_v, step);
  }
  if (finite) {
    u.scale_m()[blk] = fm;
    u.scale_v()[blk] = fv;
  } else {
    quant_block_encode(MomentStorage::q8, true, a.rounding, kb ^ kKeyM, mb, kQuantBlock, qm, s, u.scale_m() + blk);
    quant_block_encode(MomentStorage::q8, false, a.rounding, kb ^ kKeyV, vb, kQuantBlock, qv, s, u.scale_v() + blk);
  }
}

template <MasterStorage kM, bool kSR>
RT_AVX2_FMA void fused_range_avx2(const Lean& a, int64_t s, int64_t e) {
  const AdamWVec256 kd = adamw_vec256(a.c_decay), kp = adamw_vec256(a.c_plain);
  const uint32_t key32 = master_key32(a);
  const AdamWVec256* group[kQuantBlock / 8];
  size_t seg = 0;
  for (; s < e; s += kQuantBlock) {
    if (s + kQuantBlock <= e && block_groups<8>(a, seg, s, &kd, &kp, group))
      fused_block_avx2<kM, kSR>(a, s, group, key32);
    else
      lean_block(a, s, std::min(s + kQuantBlock, e) - s);
  }
}
#undef RT_AVX2_FMA

template <bool kQ8, MasterStorage kM>
void fused_range_rounding(const Lean& a, int64_t s, int64_t e) {
  const bool sr = a.rounding == QuantRounding::stochastic;
  if (simd_level_active() != SimdLevel::avx512) {  // AVX2: 8-bit moments only (fused_ok)
    if constexpr (kQ8) return sr ? fused_range_avx2<kM, true>(a, s, e) : fused_range_avx2<kM, false>(a, s, e);
  }
  if (sr)
    fused_range_avx512<kQ8, kM, true>(a, s, e);
  else
    fused_range_avx512<kQ8, kM, false>(a, s, e);
}

void fused_range(const Lean& a, int64_t s, int64_t e) {
  const bool q8 = a.u->moments == MomentStorage::q8, split = a.u->master_kind == MasterStorage::split;
  if (q8)
    return split ? fused_range_rounding<true, MasterStorage::split>(a, s, e)
                 : fused_range_rounding<true, MasterStorage::bf16_sr>(a, s, e);
  return split ? fused_range_rounding<false, MasterStorage::split>(a, s, e)
               : fused_range_rounding<false, MasterStorage::bf16_sr>(a, s, e);
}
#undef RT_AVX512
#pragma GCC diagnostic pop

}  // namespace

namespace {
// The per (seed, t, unit) key of a step's rounding draws.
uint64_t lean_key(const StateUnit& u, const OptimStep& o) {
  return quant_mix64(o.rounding_seed ^ quant_mix64(static_cast<uint64_t>(o.t) ^
                                                   quant_mix64(static_cast<uint64_t>(u.index) + 0x756e6974ull)));
}
}  // namespace

void bf16_master_store(StateUnit& u, int64_t b, int64_t n, const float* x, const OptimStep& o) {
  RT_CHECK(master_is_bf16(u.master_kind), "[adamw_lean] unit ", u.name, " holds a ", master_storage_name(u.master_kind),
           " master, not a bf16 one");
  RT_CHECK(0 <= b && n >= 0 && b + n <= u.numel, "[adamw_lean] range outside unit ", u.name);
  Lean a{};
  a.u = &u;
  a.out = u.shadow(u.cur_shadow);
  a.in = a.out;
  a.key = lean_key(u, o);
  const uint32_t key32 = master_key32(a);
  parallel_for(n, kLeanTask, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) master_store_one(a, key32, b + i, x[i]);
  });
}

void adamw_lean_update(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* shadow_out, const uint16_t* shadow_in) {
  if (b == e) return;
  RT_CHECK(grad, "[adamw_lean] null gradient for unit ", u.name);
  RT_CHECK(o.t >= 1, "[adamw_lean] step t = ", o.t, ": steps are 1-based (t = 1 on the first update)");
  const AdamWHyper& h = o.hyper;
  RT_CHECK(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1, "[adamw_lean] betas (", h.beta1, ", ", h.beta2,
           ") must lie in [0, 1); fix the optimizer config");
  RT_CHECK(h.eps >= 0 && o.lr >= 0 && o.weight_decay >= 0, "[adamw_lean] eps = ", h.eps, ", lr = ", o.lr,
           ", weight_decay = ", o.weight_decay, " must be >= 0; fix the optimizer config");
  RT_CHECK(!u.shadow_master() || (shadow_out && shadow_in), "[adamw_lean] unit ", u.name,
           ": a shadow master needs its shadows");
  RT_CHECK(u.split() ? u.quantized() : true, "[adamw_lean] unit ", u.name,
           ": a split master with fp32 moments takes adamw_update_split");
  Lean a{&u,
         b,
         grad,
         shadow_out,
         shadow_in,
         adamw_consts(h, o.t, o.lr, o.weight_decay, clip_coef),
         adamw_consts(h, o.t, o.lr, 0.0, clip_coef),
         {},
         o.moment_rounding,
         0};
  a.key = lean_key(u, o);
  for (size_t k = 0; k < u.entries.size(); ++k)
    a.segs.push_back({u.offsets[k], u.offsets[k] + u.entries[k].numel(), weight_decay_for(u.entries[k], o) != 0});
  const bool fused = fused_ok(u) && b % kQuantBlock == 0;
  parallel_for(e - b, kLeanTask, [&](int64_t tb, int64_t te) {
    if (fused) return fused_range(a, b + tb, std::min(b + te, e));
    for (int64_t s = b + tb; s < b + te;) {
      const int64_t end = std::min({(s / kQuantBlock + 1) * kQuantBlock, b + te, e});
      lean_block(a, s, end - s);
      s = end;
    }
  });
}

}  // namespace rt
