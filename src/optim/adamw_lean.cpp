// See adamw_lean.h. No implicit FP contraction (optim/adamw_math.h's rule):
// the pragma comes before any include.
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "optim/adamw_lean.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw_math.h"

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
// of a tie word) run with AVX-512F when optim's SIMD level is avx512, the
// elements around them through the scalar functions below; both give the same
// bits. The stochastic rounding draw of element i: quant_mix32(key32 + i *
// kQuantCounterStep) >> 16 (its top 16 bits), a pure function of (key, i).
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
RT_AVX512 inline __m512 bf16x16_load(const uint16_t* q) { return _mm512_castsi512_ps(_mm512_slli_epi32(widen16(q), 16)); }
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
// f32_to_bf16 of 16 lanes (round to nearest even; NaN -> (u >> 16) | 0x40).
RT_AVX512 inline __m512i bf16_rne16(__m512i u) {
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                 _mm512_set1_epi32(0x7f800000));
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
  return _mm512_mask_blend_epi32(nan, _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16),
                                 _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}

// Group [i, i + 16) -> p[0, 16).
RT_AVX512 void master_load16(const Lean& a, int64_t i, float* p) {
  const StateUnit& u = *a.u;
  if (u.master_kind == MasterStorage::split) {
    const __m512i sh = widen16(a.in + i), rem = widen16(u.rem() + i);
    const __mmask16 nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(sh, _mm512_set1_epi32(0x7fff)), _mm512_set1_epi32(0x7f80));
    const __m512i down = _mm512_maskz_mov_epi32(
        tie16_load(u.tie(), i), _mm512_mask_blend_epi32(nan, _mm512_set1_epi32(1), _mm512_set1_epi32(0x40)));
    _mm512_storeu_si512(p, _mm512_or_si512(_mm512_slli_epi32(_mm512_sub_epi32(sh, down), 16), rem));
  } else {  // bf16 masters (an fp32 master is used in place)
    _mm512_storeu_ps(p, bf16x16_load(a.in + i));
  }
}

// Stores the new values p[0, 16) of group [i, i + 16).
RT_AVX512 void master_store16(const Lean& a, uint32_t key32, int64_t i, const float* p) {
  StateUnit& u = *a.u;
  const __m512 x = _mm512_loadu_ps(p);
  const __m512i xb = _mm512_castps_si512(x);
  switch (u.master_kind) {
    case MasterStorage::fp32:
      _mm512_storeu_ps(u.master() + i, x);
      return;
    case MasterStorage::split: {
      const __m512i sh = bf16_rne16(xb);
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
      const __mmask16 finite = _mm512_cmplt_epi32_mask(_mm512_and_si512(xb, _mm512_set1_epi32(0x7fffffff)),
                                                       _mm512_set1_epi32(0x7f800000));
      const __m512i sr = _mm512_srli_epi32(_mm512_add_epi32(xb, _mm512_srli_epi32(h, 16)), 16);
      narrow16_store(a.out + i, _mm512_mask_blend_epi32(finite, bf16_rne16(xb), sr));
      return;
    }
    case MasterStorage::bf16_kahan: {
      uint16_t* comp = u.comp();
      const __m512 old = bf16x16_load(a.in + i);
      const __m512 y = _mm512_sub_ps(_mm512_sub_ps(x, old), bf16x16_load(comp + i));
      const __m512i t = bf16_rne16(_mm512_castps_si512(_mm512_add_ps(old, y)));
      const __m512 tf = _mm512_castsi512_ps(_mm512_slli_epi32(t, 16));
      narrow16_store(comp + i, bf16_rne16(_mm512_castps_si512(_mm512_sub_ps(_mm512_sub_ps(tf, old), y))));
      narrow16_store(a.out + i, t);
      return;
    }
  }
}
#undef RT_AVX512
#pragma GCC diagnostic pop

// Unit elements [lo, hi) of one block through fn16(i) for its whole 16-groups
// (on the AVX-512 path) and fn1(i) for the rest.
template <class Fn16, class Fn1>
inline void master_walk(bool wide, int64_t lo, int64_t hi, Fn16&& fn16, Fn1&& fn1) {
  int64_t i = lo;
  if (wide) {
    const int64_t g0 = std::min(hi, (lo + 15) & ~int64_t{15});
    for (; i < g0; ++i) fn1(i);
    for (; i + 16 <= hi; i += 16) fn16(i);
  }
  for (; i < hi; ++i) fn1(i);
}

// Unit elements [s, s + k), inside one quantization block.
void lean_block(const Lean& a, int64_t s, int64_t k) {
  StateUnit& u = *a.u;
  alignas(64) float pb[kQuantBlock], m[kQuantBlock], v[kQuantBlock];
  const bool fp32 = u.master_kind == MasterStorage::fp32;
  const bool wide = simd_level_active() == SimdLevel::avx512;
  float* p = fp32 ? u.master() + s : pb;  // an fp32 master is updated in place
  if (!fp32)
    master_walk(wide, s, s + k, [&](int64_t i) { master_load16(a, i, pb + (i - s)); },
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
      master_walk(wide, lo, hi, [&](int64_t i) { master_store16(a, key32, i, pb + (i - s)); },
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

}  // namespace

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
  a.key = quant_mix64(o.rounding_seed ^ quant_mix64(static_cast<uint64_t>(o.t) ^
                                                    quant_mix64(static_cast<uint64_t>(u.index) + 0x756e6974ull)));
  for (size_t k = 0; k < u.entries.size(); ++k)
    a.segs.push_back({u.offsets[k], u.offsets[k] + u.entries[k].numel(), weight_decay_for(u.entries[k], o) != 0});
  parallel_for(e - b, kLeanTask, [&](int64_t tb, int64_t te) {
    for (int64_t s = b + tb; s < b + te;) {
      const int64_t end = std::min({(s / kQuantBlock + 1) * kQuantBlock, b + te, e});
      lean_block(a, s, end - s);
      s = end;
    }
  });
}

}  // namespace rt
