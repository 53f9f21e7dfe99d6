// See adamw_lean.h. No implicit FP contraction (optim/adamw_math.h's rule):
// the pragma comes before any include.
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "optim/adamw_lean.h"

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

// Writes the updated master of unit elements [lo, hi) (p: their new fp32 values).
void master_store(const Lean& a, int64_t lo, int64_t hi, const float* p) {
  StateUnit& u = *a.u;
  switch (u.master_kind) {
    case MasterStorage::fp32:  // the shadow was written by adamw_span
      std::memcpy(u.master() + lo, p, static_cast<size_t>(hi - lo) * 4);
      return;
    case MasterStorage::split:  // whole tie words belong to this block (block-aligned ranges)
      for (int64_t i = lo; i < hi; ++i) {
        bool t;
        a.out[i] = split_master_encode_one(p[i - lo], u.rem() + i, &t);
        tie_set(u.tie(), i, t);
      }
      return;
    case MasterStorage::bf16_sr: {
      const uint64_t key = quant_mix64(a.key ^ kKeyMaster);
      for (int64_t i = lo; i < hi; ++i)
        a.out[i] = bf16_round_stochastic(
            p[i - lo],
            static_cast<uint32_t>(quant_mix64(key + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull) >> 48));
      return;
    }
    case MasterStorage::bf16_kahan: {
      uint16_t* comp = u.comp();
      for (int64_t i = lo; i < hi; ++i) {
        const float old = bf16_to_f32(a.in[i]);
        const float y = (p[i - lo] - old) - bf16_to_f32(comp[i]);
        const uint16_t t = f32_to_bf16(old + y);
        comp[i] = f32_to_bf16((bf16_to_f32(t) - old) - y);
        a.out[i] = t;
      }
      return;
    }
  }
}

// Unit elements [s, s + k), inside one quantization block.
void lean_block(const Lean& a, int64_t s, int64_t k) {
  StateUnit& u = *a.u;
  alignas(64) float p[kQuantBlock], m[kQuantBlock], v[kQuantBlock];
  switch (u.master_kind) {
    case MasterStorage::fp32:
      std::memcpy(p, u.master() + s, static_cast<size_t>(k) * 4);
      break;
    case MasterStorage::split:
      for (int64_t i = 0; i < k; ++i)
        p[i] = split_master_decode_one(a.in[s + i], u.rem()[s + i], tie_bit(u.tie(), s + i));
      break;
    case MasterStorage::bf16_sr:
    case MasterStorage::bf16_kahan:
      for (int64_t i = 0; i < k; ++i) p[i] = bf16_to_f32(a.in[s + i]);
      break;
  }
  const int64_t blk = s / kQuantBlock;
  if (u.quantized()) {
    quant_block_decode(u.moments, true, u.qm(), s, u.scale_m()[blk], k, m);
    quant_block_decode(u.moments, false, u.qv(), s, u.scale_v()[blk], k, v);
  } else {
    std::memcpy(m, u.m() + s, static_cast<size_t>(k) * 4);
    std::memcpy(v, u.v() + s, static_cast<size_t>(k) * 4);
  }
  for (const Seg& sg : a.segs) {
    const int64_t lo = std::max(sg.lo, s), hi = std::min(sg.hi, s + k);
    if (lo >= hi) continue;
    adamw_span(p + (lo - s), m + (lo - s), v + (lo - s), a.g + (lo - a.b), hi - lo, sg.decays ? a.c_decay : a.c_plain,
               u.master_kind == MasterStorage::fp32 && a.out ? a.out + lo : nullptr);
    master_store(a, lo, hi, p + (lo - s));
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
