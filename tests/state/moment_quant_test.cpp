// Block-wise moment quantization (state/moment_quant.h): the codes' shape, the
// table lookups against brute force, round-trip error bounds derived from the
// codes' level spacing, unbiased stochastic rounding, and the storage
// conversions of HostState (fp32 <-> quantized moments, fp32 <-> bf16 masters).
#include "state/moment_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

using rt::MomentStorage;
using rt::QuantCode;

struct Named {
  const QuantCode* c;
  const char* name;
  int n;
  bool zero;
};
std::vector<Named> codes() {
  return {{&rt::quant_code_m8(), "m8", 128, true},
          {&rt::quant_code_v8(), "v8", 256, false},
          {&rt::quant_code_m4(), "m4", 8, true},
          {&rt::quant_code_v4(), "v4", 16, false}};
}

// The nearest level by brute force (ties to the lower one, as the lookup).
int brute_nearest(const QuantCode& c, float x) {
  int best = 0;
  for (int k = 1; k < c.n; ++k)
    if (x > c.mid[k - 1]) best = k;
  return best;
}

TEST(MomentQuant, CodesAreSortedEndAtOneAndHaveZeroOnlyForM) {
  for (const Named& q : codes()) {
    SCOPED_TRACE(q.name);
    ASSERT_EQ(q.c->n, q.n);
    EXPECT_EQ(q.c->has_zero, q.zero);
    EXPECT_EQ(q.c->level[q.n - 1], 1.0f);
    EXPECT_EQ(q.c->level[0] == 0.0f, q.zero);
    for (int k = 1; k < q.n; ++k) EXPECT_LT(q.c->level[k - 1], q.c->level[k]) << k;
  }
}

TEST(MomentQuant, TableLookupsEqualBruteForce) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  for (const Named& q : codes()) {
    SCOPED_TRACE(q.name);
    const QuantCode& c = *q.c;
    std::vector<float> xs = {0.f, 1.f, 1e-30f, 0.5f};
    for (int k = 0; k < c.n; ++k) {  // the levels, the midpoints and their neighbours
      for (float y : {c.level[k], k + 1 < c.n ? c.mid[k] : 1.f}) {
        xs.push_back(y);
        xs.push_back(std::nextafter(y, 0.f));
        xs.push_back(std::nextafter(y, 2.f));
      }
    }
    for (int i = 0; i < 200000; ++i) xs.push_back(std::ldexp(u01(rng), -static_cast<int>(rng() % 40)));
    for (float x : xs) {
      if (x > 1.f) {
        continue;
      }
      ASSERT_EQ(rt::quant_index_nearest(c, x), brute_nearest(c, x)) << "x = " << x;
      // stochastic: the level at or below x, or the one above (never further)
      for (float u : {0.f, 0.5f, 0.999999f}) {
        const int s = rt::quant_index_stochastic(c, x, u);
        int f = -1;
        for (int k = 0; k < c.n; ++k)
          if (c.level[k] <= x) f = k;
        if (f < 0) {
          ASSERT_EQ(s, 0) << "below the smallest level rounds up, x = " << x;
        } else {
          ASSERT_TRUE(s == f || s == std::min(f + 1, c.n - 1)) << "x = " << x << " got " << s << " floor " << f;
        }
      }
    }
  }
}

// Round trip of blocks with nearest rounding. Bound, from the code: an element
// y = |x| / absmax between levels a <= y <= b decodes to the nearer one, so
// |x' - x| <= (b - a) / 2 * absmax; below the smallest level of a no-zero code,
// <= level[0] * absmax. Plus fp32 rounding of y and of level * absmax: a few
// ulp of absmax (2^-21 relative covers them). The element at absmax is exact.
TEST(MomentQuant, NearestRoundTripWithinHalfTheLevelGap) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (MomentStorage s : {MomentStorage::q8, MomentStorage::q4})
    for (bool sgn : {true, false}) {
      const QuantCode& c = s == MomentStorage::q8 ? (sgn ? rt::quant_code_m8() : rt::quant_code_v8())
                                                  : (sgn ? rt::quant_code_m4() : rt::quant_code_v4());
      for (int trial = 0; trial < 200; ++trial) {
        const int64_t k = trial == 0 ? 37 : rt::kQuantBlock;  // a short last block too
        std::vector<float> x(static_cast<size_t>(k));
        for (auto& e : x) {  // heavy-tailed: magnitudes over ~12 decades, like Adam moments
          const float z = nd(rng) * std::exp(3.f * nd(rng));
          e = sgn ? z : z * z;
        }
        std::vector<uint8_t> codes(static_cast<size_t>(rt::quant_code_bytes(s, k)));
        float scale = 0;
        rt::quant_block_encode(s, sgn, rt::QuantRounding::nearest, 0, x.data(), k, codes.data(), 0, &scale);
        std::vector<float> y(static_cast<size_t>(k));
        rt::quant_block_decode(s, sgn, codes.data(), 0, scale, k, y.data());
        float amax = 0;
        for (float e : x) amax = std::max(amax, std::fabs(e));
        ASSERT_EQ(scale, amax);
        for (int64_t i = 0; i < k; ++i) {
          const float a = std::fabs(x[i]) / amax;
          double gap = c.level[0];  // below the smallest level
          for (int j = 0; j + 1 < c.n; ++j)
            if (c.level[j] <= a && a <= c.level[j + 1]) gap = (c.level[j + 1] - c.level[j]) / 2.0;
          if (!c.has_zero && a < c.level[0]) gap = c.level[0];
          const double bound = gap * amax + amax * 0x1.0p-21;
          ASSERT_LE(std::fabs(double(y[i]) - x[i]), bound) << "element " << i << " x " << x[i] << " got " << y[i];
          if (std::fabs(x[i]) == amax) {
            ASSERT_EQ(std::fabs(y[i]), amax);
          }
          if (sgn && y[i] != 0) {
            ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i]));
          }
        }
      }
    }
}

// Stochastic rounding is unbiased: over N independent keys the mean decode of
// x has standard deviation <= gap / (2 sqrt(N)) (a two-point variable of spread
// `gap`); the test allows 6 of those (fails with probability < 1e-8 per value).
TEST(MomentQuant, StochasticRoundingIsUnbiased) {
  const int N = 4000;
  for (MomentStorage s : {MomentStorage::q8, MomentStorage::q4}) {
    const QuantCode& c = s == MomentStorage::q8 ? rt::quant_code_m8() : rt::quant_code_m4();
    std::vector<float> x(rt::kQuantBlock);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * double(i)) * (i == 3 ? 1.0 : 0.9);
    x[3] = 1.0f;  // the absmax, so y = x
    std::vector<double> sum(x.size(), 0.0);
    std::vector<uint8_t> codes(static_cast<size_t>(rt::quant_code_bytes(s, rt::kQuantBlock)));
    std::vector<float> y(x.size());
    for (int r = 0; r < N; ++r) {
      float scale;
      rt::quant_block_encode(s, true, rt::QuantRounding::stochastic, rt::quant_mix64(r), x.data(), rt::kQuantBlock,
                             codes.data(), 0, &scale);
      rt::quant_block_decode(s, true, codes.data(), 0, scale, rt::kQuantBlock, y.data());
      for (size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
    }
    // nearest rounding on the same data, which the bound must tell apart (it is biased)
    float scale;
    std::vector<float> yn(x.size());
    rt::quant_block_encode(s, true, rt::QuantRounding::nearest, 0, x.data(), rt::kQuantBlock, codes.data(), 0, &scale);
    rt::quant_block_decode(s, true, codes.data(), 0, scale, rt::kQuantBlock, yn.data());
    bool nearest_fails = false;
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = std::fabs(x[i]);
      double gap = 0;
      for (int j = 0; j + 1 < c.n; ++j)
        if (c.level[j] <= a && a <= c.level[j + 1]) gap = c.level[j + 1] - c.level[j];
      const double bound = 6 * gap / (2 * std::sqrt(double(N))) + 1e-7;
      EXPECT_LE(std::fabs(sum[i] / N - x[i]), bound) << "element " << i << " (" << x[i] << ")";
      nearest_fails |= std::fabs(double(yn[i]) - x[i]) > bound;
    }
    EXPECT_TRUE(nearest_fails);
  }
}

TEST(MomentQuant, ZeroBlocksAndNonFiniteValues) {
  std::vector<float> x(rt::kQuantBlock, 0.f), y(rt::kQuantBlock, 1.f);
  std::vector<uint8_t> codes(rt::kQuantBlock);
  float scale = -1;
  rt::quant_block_encode(MomentStorage::q8, false, rt::QuantRounding::nearest, 0, x.data(), rt::kQuantBlock,
                         codes.data(), 0, &scale);
  rt::quant_block_decode(MomentStorage::q8, false, codes.data(), 0, scale, rt::kQuantBlock, y.data());
  for (float e : y) ASSERT_EQ(e, 0.f);  // a v block of zeros decodes to exact zeros (no-zero code, scale 0)
  x[5] = NAN;
  rt::quant_block_encode(MomentStorage::q8, true, rt::QuantRounding::nearest, 0, x.data(), rt::kQuantBlock,
                         codes.data(), 0, &scale);
  EXPECT_TRUE(std::isnan(scale));  // visible, never silently dropped
}

// The SIMD codecs (AVX2, and AVX-512 where the CPU has it) against the scalar
// one, bit for bit: every storage, sign and rounding, full and short blocks (a
// tail of k % 8 or k % 16 elements runs scalar),
// values across the codes' range, exact zeros, -0, the absmax itself, levels
// and midpoints hit exactly, NaN and inf (scale NaN: the codes still agree).
void simd_codec_equals_scalar(bool avx512) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  int blocks = 0;
  for (MomentStorage s : {MomentStorage::q8, MomentStorage::q4})
    for (bool sg : {true, false})
      for (rt::QuantRounding r : {rt::QuantRounding::nearest, rt::QuantRounding::stochastic})
        for (int64_t k : {rt::kQuantBlock, int64_t{203}, int64_t{16}, int64_t{8}, int64_t{5}})
          for (int trial = 0; trial < 6; ++trial) {
            const QuantCode& c = s == MomentStorage::q8 ? (sg ? rt::quant_code_m8() : rt::quant_code_v8())
                                                        : (sg ? rt::quant_code_m4() : rt::quant_code_v4());
            std::vector<float> x(static_cast<size_t>(k));
            for (int64_t i = 0; i < k; ++i) {
              const float mag = std::pow(10.f, -8.f * u01(rng));  // 1e-8 .. 1
              const int kind = static_cast<int>(rng() % 8);
              float a = kind == 0 ? 0.f : kind == 1 ? c.level[rng() % c.n] : kind == 2 ? c.mid[rng() % (c.n - 1)] : mag;
              x[static_cast<size_t>(i)] = sg && (rng() & 1) ? -a : a;
            }
            if (trial == 1) x[0] = -0.0f;
            if (trial == 2) x[static_cast<size_t>(k / 2)] = NAN;
            if (trial == 3) x[static_cast<size_t>(k - 1)] = INFINITY;
            if (trial == 4) std::fill(x.begin(), x.end(), 0.f);
            const uint64_t key = rng();
            const int64_t first = rt::kQuantBlock * 3;
            std::vector<uint8_t> cs(static_cast<size_t>(rt::quant_code_bytes(s, first + k)), 0x5a), cv = cs;
            std::vector<float> ys(x.size()), yv(x.size());
            float ss = 0, sv = 0;
            rt::quant_set_simd(false);
            rt::quant_block_encode(s, sg, r, key, x.data(), k, cs.data(), first, &ss);
            rt::quant_block_decode(s, sg, cs.data(), first, ss, k, ys.data());
            rt::quant_set_simd(true, avx512);
            rt::quant_block_encode(s, sg, r, key, x.data(), k, cv.data(), first, &sv);
            rt::quant_block_decode(s, sg, cv.data(), first, sv, k, yv.data());
            SCOPED_TRACE(testing::Message() << rt::moment_storage_name(s) << (sg ? " m " : " v ")
                                            << rt::quant_rounding_name(r) << " k " << k << " trial " << trial);
            ASSERT_EQ(std::memcmp(&ss, &sv, 4), 0) << ss << " vs " << sv;
            ASSERT_EQ(cs, cv);
            ASSERT_EQ(std::memcmp(ys.data(), yv.data(), ys.size() * 4), 0);
            ++blocks;
          }
  EXPECT_EQ(blocks, 2 * 2 * 2 * 5 * 6);
  rt::quant_set_simd(true);
}

TEST(MomentQuant, Avx2CodecEqualsScalarBitForBit) {
  if (!rt::quant_set_simd(true, false)) GTEST_SKIP() << "no AVX2 on this CPU";
  simd_codec_equals_scalar(false);
}

TEST(MomentQuant, Avx512CodecEqualsScalarBitForBit) {
  if (!rt::quant_set_simd(true) || !rt::quant_avx512_active()) GTEST_SKIP() << "no AVX-512F on this CPU";
  simd_codec_equals_scalar(true);
}

rt::ModelSpec spec() { return rt::test::llama_spec(64, 172, 2, 4, 2, 16, 258); }

TEST(MomentQuant, HostStateStorageConversions) {
  rt::HostState st(spec(), false);
  st.init_random(3);
  const double fp32_bpp = st.bytes_per_param();
  // fp32 moments with content, then quantized: decoding gives the nearest codes' values
  for (auto& u : st.units())
    for (int64_t i = 0; i < 2 * u.numel; ++i) u.m()[i] = i < u.numel ? std::sin(0.1 * i) : 1e-3f * (1 + (i % 7));
  std::vector<std::vector<float>> before;
  for (auto& u : st.units()) before.emplace_back(u.m(), u.m() + 2 * u.numel);
  std::vector<float> w0(static_cast<size_t>(st.units()[1].numel));
  st.units()[1].read_master(0, st.units()[1].numel, w0.data());
  st.set_moment_storage(MomentStorage::q8);
  EXPECT_LT(st.bytes_per_param(), fp32_bpp - 5.9);  // 8 -> 2.03 B/param of moments (padding aside)
  EXPECT_THROW(st.units()[0].m(), rt::Error);
  st.set_master_storage(rt::MasterStorage::split);  // the master converts, the codes stay
  st.set_master_storage(rt::MasterStorage::fp32);
  st.set_moment_storage(MomentStorage::fp32);
  for (size_t k = 0; k < st.units().size(); ++k) {
    const auto& u = st.units()[k];
    // m: 1.4% level spacing at the top of m8, half of it per element, relative to the block's absmax <= 1
    EXPECT_TRUE(rt::test::expect_near(u.name + " m", u.m(), before[k].data(), u.numel, 0.0071, 0));
    // v <= 7e-3: v8's top spacing is 0.7%, so half of it times the absmax
    EXPECT_TRUE(rt::test::expect_near(u.name + " v", u.v(), before[k].data() + u.numel, u.numel, 0.0036 * 7e-3, 0));
  }
  std::vector<float> w1(w0.size());
  st.units()[1].read_master(0, st.units()[1].numel, w1.data());
  EXPECT_EQ(0, std::memcmp(w0.data(), w1.data(), w0.size() * 4));  // masters untouched by moment conversions
  // bf16 master: rounded to nearest; back to fp32: the bf16 values exactly
  st.set_master_storage(rt::MasterStorage::bf16_kahan);
  st.set_master_storage(rt::MasterStorage::fp32);
  st.units()[1].read_master(0, st.units()[1].numel, w1.data());
  for (size_t i = 0; i < w0.size(); ++i) ASSERT_EQ(w1[i], rt::bf16_to_f32(rt::f32_to_bf16(w0[i]))) << i;
}

}  // namespace
