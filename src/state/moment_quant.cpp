#include "state/moment_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

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

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Fills the tables of c (levels set) and checks that one compare finishes a lookup.
void build_tables(QuantCode& c, const char* what) {
  for (int k = 0; k + 1 < c.n; ++k) c.mid[k] = 0.5f * (c.level[k] + c.level[k + 1]);
  c.below_mid.resize(kPrefixes);
  c.at_or_below.resize(kPrefixes);
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
    c.below_mid[p] = static_cast<uint8_t>(mids_lo);
    c.at_or_below[p] = static_cast<uint16_t>(lev_le_lo);
  }
}

// The dynamic code of `bits` bits (see the header): decades E = 0, 1, ... with
// 2^(bits-1-E) levels each; with_zero adds 0, else one more level a decade lower.
QuantCode make_dynamic(int bits, bool with_zero, const char* what) {
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
  build_tables(c, what);
  return c;
}

QuantCode make_pow2(int levels, const char* what) {
  QuantCode c;
  c.n = levels;
  for (int k = 0; k < levels; ++k) c.level[k] = std::ldexp(1.0f, k - (levels - 1));
  build_tables(c, what);
  return c;
}

inline float clamp01(float x) { return x > 0 ? (x < 1 ? x : 1.0f) : 0.0f; }  // NaN -> 0

}  // namespace

const QuantCode& quant_code_m8() {
  static const QuantCode c = make_dynamic(7, true, "m8");
  return c;
}
const QuantCode& quant_code_v8() {
  static const QuantCode c = make_dynamic(8, false, "v8");
  return c;
}
const QuantCode& quant_code_m4() {
  static const QuantCode c = make_dynamic(3, true, "m4");
  return c;
}
const QuantCode& quant_code_v4() {
  static const QuantCode c = make_pow2(16, "v4");
  return c;
}

namespace {

inline int index_nearest(const QuantCode& c, float x) {
  x = clamp01(x);
  int k = c.below_mid[f32_bits(x) >> 16];
  if (k < c.n - 1 && x > c.mid[k]) ++k;
  return k;
}

inline int index_stochastic(const QuantCode& c, float x, float u) {
  x = clamp01(x);
  int a = c.at_or_below[f32_bits(x) >> 16];
  if (a < c.n && c.level[a] <= x) ++a;  // a = count of levels <= x
  const int f = a - 1;
  if (f < 0) return 0;  // below the smallest level of a no-zero code: up
  if (f >= c.n - 1) return c.n - 1;
  const float lo = c.level[f], hi = c.level[f + 1];
  return u < (x - lo) / (hi - lo) ? f + 1 : f;
}

}  // namespace

int quant_index_nearest(const QuantCode& c, float x) { return index_nearest(c, x); }
int quant_index_stochastic(const QuantCode& c, float x, float u) { return index_stochastic(c, x, u); }

namespace {

inline const QuantCode& code_of(MomentStorage s, bool signed_code) {
  return s == MomentStorage::q8 ? (signed_code ? quant_code_m8() : quant_code_v8())
                                : (signed_code ? quant_code_m4() : quant_code_v4());
}

// Specialised on rounding, width and sign so the loop has no mode branches.
template <bool kStochastic, bool kQ8, bool kSigned>
void encode_loop(const QuantCode& c, uint64_t key, const float* x, int64_t k, uint8_t* codes, int64_t first,
                 float amax) {
  const float inv = amax > 0 ? 1.0f / amax : 0.0f;
  constexpr int sign_shift = kQ8 ? 7 : 3;
  for (int64_t i = 0; i < k; ++i) {
    const float a = std::fabs(x[i]);
    const float y = a == amax ? 1.0f : a * inv;
    int q = kStochastic ? index_stochastic(c, y, quant_uniform(key, static_cast<uint64_t>(i))) : index_nearest(c, y);
    if (kSigned && std::signbit(x[i])) q |= 1 << sign_shift;
    if (kQ8) {
      codes[first + i] = static_cast<uint8_t>(q);
    } else {
      uint8_t& b = codes[(first + i) >> 1];
      b = ((first + i) & 1) ? static_cast<uint8_t>((b & 0x0f) | (q << 4)) : static_cast<uint8_t>((b & 0xf0) | q);
    }
  }
}

}  // namespace

void quant_block_encode(MomentStorage s, bool signed_code, QuantRounding r, uint64_t key, const float* x, int64_t k,
                        uint8_t* codes, int64_t first, float* scale) {
  const QuantCode& c = code_of(s, signed_code);
  float amax = 0;
  bool finite = true;
  for (int64_t i = 0; i < k; ++i) {
    const float a = std::fabs(x[i]);
    finite &= std::isfinite(a);
    amax = a > amax ? a : amax;
  }
  *scale = finite ? amax : NAN;
  const bool sr = r == QuantRounding::stochastic, q8 = s == MomentStorage::q8;
  using Loop = void (*)(const QuantCode&, uint64_t, const float*, int64_t, uint8_t*, int64_t, float);
  static constexpr Loop loops[8] = {encode_loop<false, false, false>, encode_loop<false, false, true>,
                                    encode_loop<false, true, false>,  encode_loop<false, true, true>,
                                    encode_loop<true, false, false>,  encode_loop<true, false, true>,
                                    encode_loop<true, true, false>,   encode_loop<true, true, true>};
  loops[(sr ? 4 : 0) + (q8 ? 2 : 0) + (signed_code ? 1 : 0)](c, key, x, k, codes, first, amax);
}

void quant_block_decode(MomentStorage s, bool signed_code, const uint8_t* codes, int64_t first, float scale, int64_t k,
                        float* x) {
  const QuantCode& c = code_of(s, signed_code);
  if (s == MomentStorage::q8) {
    for (int64_t i = 0; i < k; ++i) {
      const int q = codes[first + i];
      const float y = c.level[q & (signed_code ? 0x7f : 0xff)] * scale;
      x[i] = signed_code && (q & 0x80) ? -y : y;
    }
    return;
  }
  for (int64_t i = 0; i < k; ++i) {
    const int b = codes[(first + i) >> 1];
    const int q = ((first + i) & 1) ? b >> 4 : b & 0x0f;
    const float y = c.level[q & (signed_code ? 0x7 : 0xf)] * scale;
    x[i] = signed_code && (q & 0x8) ? -y : y;
  }
}

}  // namespace rt
