// The codes of state/moment_quant.h: their levels and lookup tables, names,
// and the re-encoding of the earlier 8-bit dynamic codes (the encode and
// decode paths are in moment_quant.cpp). No implicit FP contraction (the
// levels must be the ones every build computes; the pragma comes first).
#pragma GCC optimize("fp-contract=off")
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#include "state/moment_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace rt {

const char* moment_storage_name(MomentStorage s) {
  switch (s) {
    case MomentStorage::fp32:
      return "adamw";
    case MomentStorage::q8:
      return "adamw8bit";
    case MomentStorage::q4:
      return "adamw4bit";
  }
  return "unknown";
}

const char* quant_rounding_name(QuantRounding r) { return r == QuantRounding::nearest ? "nearest" : "stochastic"; }

double moment_bytes_per_param(MomentStorage s) {
  const double scales = 2.0 * 4.0 / static_cast<double>(kQuantBlock);
  return s == MomentStorage::fp32 ? 8.0 : s == MomentStorage::q8 ? 2.0 + scales : 1.0 + scales;
}

namespace {

constexpr uint32_t kPrefixes = 0x3f81;  // bf16 prefixes of [0, 1]: 0 .. 0x3f80 (1.0)

float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }

// Fills the tables of c (levels set) and checks that one compare finishes a lookup.
void build_tables(QuantCode& c, const char* what) {
  for (int k = 0; k + 1 < c.n; ++k) c.mid[k] = 0.5f * (c.level[k] + c.level[k + 1]);
  c.nearest_key.resize(kPrefixes);
  c.floor_key.resize(kPrefixes);
  for (uint32_t p = 0; p < kPrefixes; ++p) {
    const float lo = bits_to_f32(p << 16), hi = p + 1 < kPrefixes ? bits_to_f32((p + 1) << 16) : 1.0f;
    int mids_lo = 0, mids_hi = 0, lev_le_lo = 0, lev_lt_hi = 0;
    for (int k = 0; k + 1 < c.n; ++k) {
      mids_lo += c.mid[k] < lo;
      mids_hi += c.mid[k] < hi;
    }
    for (int k = 0; k < c.n; ++k) {
      lev_le_lo += c.level[k] <= lo;
      lev_lt_hi += c.level[k] < hi;
    }
    RT_CHECK(mids_hi - mids_lo <= 1 && lev_lt_hi - lev_le_lo <= 1, "[quant] code ", what,
             ": more than one level in the bf16 prefix ", p, "; the lookup needs a finer table");
    // the next mid / level above the prefix's start, when it lies inside the prefix
    const bool mid_in = mids_lo < c.n - 1 && (f32_bits(c.mid[mids_lo]) >> 16) == p;
    const bool lev_in = lev_le_lo < c.n && (f32_bits(c.level[lev_le_lo]) >> 16) == p;
    c.nearest_key[p] = mids_lo << 17 | (mid_in ? static_cast<int32_t>(f32_bits(c.mid[mids_lo]) & 0xffff) + 1 : 0x10000);
    c.floor_key[p] = lev_le_lo << 17 | (lev_in ? static_cast<int32_t>(f32_bits(c.level[lev_le_lo]) & 0xffff) : 0x10000);
  }
}

// The dynamic code of `bits` bits (see the header): decades E = 0, 1, ... with
// 2^(bits-1-E) levels each; with_zero adds 0, else one more level a decade lower.
QuantCode make_dynamic(int bits, bool with_zero, const char* what, bool tables = true) {
  std::vector<double> v;
  for (int e = 0; e < bits; ++e) {
    const int f = 1 << (bits - 1 - e);
    for (int j = 0; j < f; ++j) v.push_back(std::pow(10.0, -e) * (0.1 + 0.9 * (j + 0.5) / f));
  }
  if (with_zero)
    v.push_back(0.0);
  else
    v.push_back(std::pow(10.0, -bits) * 0.55);
  std::sort(v.begin(), v.end());
  QuantCode c;
  c.n = static_cast<int>(v.size());
  c.has_zero = with_zero;
  for (int k = 0; k < c.n; ++k) c.level[k] = static_cast<float>(v[k] / v.back());
  c.level[c.n - 1] = 1.0f;
  if (tables)
    build_tables(c, what);
  else
    for (int k = 0; k + 1 < c.n; ++k) c.mid[k] = 0.5f * (c.level[k] + c.level[k + 1]);
  return c;
}

// A minifloat code (see the header): n levels, 0 first when with_zero, then
// the window of fp32 values with `mant` mantissa bits ending at 1.0.
QuantCode make_minifloat(int n, bool with_zero, int mant) {
  QuantCode c;
  c.n = n;
  c.has_zero = with_zero;
  c.shift = 23 - mant;
  const int win = n - (with_zero ? 1 : 0);
  c.base = (127 << mant) - (win - 1);
  for (int k = 0; k < n; ++k)
    c.level[k] =
        with_zero && k == 0 ? 0.0f : bits_to_f32(static_cast<uint32_t>(c.base + k - (with_zero ? 1 : 0)) << c.shift);
  for (int k = 0; k + 1 < n; ++k) c.mid[k] = 0.5f * (c.level[k] + c.level[k + 1]);
  return c;
}

QuantCode make_pow2(int levels, const char* what) {
  QuantCode c;
  c.n = levels;
  for (int k = 0; k < levels; ++k) c.level[k] = std::ldexp(1.0f, k - (levels - 1));
  build_tables(c, what);
  return c;
}

}  // namespace

const QuantCode& quant_code_m8() {
  static const QuantCode c = make_minifloat(128, true, 3);  // e4m3
  return c;
}
const QuantCode& quant_code_v8() {
  static const QuantCode c = make_minifloat(256, false, 3);  // e5m3
  return c;
}
const QuantCode& quant_code_m8_dynamic() {
  static const QuantCode c = make_dynamic(7, true, "m8 dynamic", false);
  return c;
}
const QuantCode& quant_code_v8_dynamic() {
  static const QuantCode c = make_dynamic(8, false, "v8 dynamic", false);
  return c;
}
const char* quant_code_id(MomentStorage s, bool muon) {
  return s == MomentStorage::q8   ? "m8e4m3-v8e5m3"
         : s == MomentStorage::q4 ? (muon ? "m4normal-v4pow2" : "m4dynamic-v4pow2")
                                  : "";
}
const QuantCode& quant_code_m4() {
  static const QuantCode c = make_dynamic(3, true, "m4");
  return c;
}
const QuantCode& quant_code_m4n() {
  static const QuantCode c = [] {
    QuantCode q;
    const float lv[8] = {0.0f, 0.0911f, 0.1848f, 0.2844f, 0.3949f, 0.5251f, 0.6962f, 1.0f};
    q.n = 8;
    q.has_zero = true;
    for (int k = 0; k < 8; ++k) q.level[k] = lv[k];
    build_tables(q, "m4n");
    return q;
  }();
  return c;
}
const QuantCode& quant_code_v4() {
  static const QuantCode c = make_pow2(16, "v4");  // exact powers of two: encode_avx512 relies on it
  return c;
}

void quant_recode_dynamic8(bool signed_code, uint8_t* codes, float* scales, int64_t n) {
  const QuantCode& old = signed_code ? quant_code_m8_dynamic() : quant_code_v8_dynamic();
  parallel_for(quant_blocks(n), 64, [&](int64_t b0, int64_t b1) {
    float x[kQuantBlock];
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t first = blk * kQuantBlock, k = std::min(kQuantBlock, n - first);
      for (int64_t i = 0; i < k; ++i) {
        const int q = codes[first + i];
        const float y = old.level[q & (signed_code ? 0x7f : 0xff)] * scales[blk];
        x[i] = signed_code && (q & 0x80) ? -y : y;
      }
      quant_block_encode(MomentStorage::q8, signed_code, QuantRounding::nearest, 0, x, k, codes, first, scales + blk);
    }
  });
}

}  // namespace rt
