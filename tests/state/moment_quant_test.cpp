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
          {&rt::quant_code_m4n(), "m4n", 8, true},
          {&rt::quant_code_v4(), "v4", 16, false}};
}

// The nearest level by brute force (ties: minifloat codes up, table codes down).
int brute_nearest(const QuantCode& c, float x) {
  int best = 0;
  for (int k = 1; k < c.n; ++k)
    if (c.shift ? x >= c.mid[k - 1] : x > c.mid[k - 1]) best = k;
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
// `gap` has variance p (1 - p) gap^2 <= gap^2 / 4); the test allows 6 of those
// (fails with probability < 1e-8 per value). Values across the code's range,
// the m8 ones also below its smallest nonzero level (0 or that level), the v8
// ones from its smallest level up (below it v rounds up by design).
TEST(MomentQuant, StochasticRoundingIsUnbiased) {
  const int N = 4000;
  for (int which = 0; which < 3; ++which) {
    const MomentStorage s = which < 2 ? MomentStorage::q8 : MomentStorage::q4;
    const bool sgn = which != 1;
    const QuantCode& c = which == 0 ? rt::quant_code_m8() : which == 1 ? rt::quant_code_v8() : rt::quant_code_m4();
    SCOPED_TRACE(which == 0 ? "m8" : which == 1 ? "v8" : "m4");
    std::vector<float> x(rt::kQuantBlock);
    const double lo = sgn ? c.level[1] : c.level[0];  // the smallest nonzero level
    for (size_t i = 0; i < x.size(); ++i) {
      const double mag =
          i < 32 ? lo * (0.03 + i / 32.0) : std::pow(lo, (i % 97) / 97.0);  // lo^0 = 1 .. lo, and below lo
      x[i] = static_cast<float>((sgn && (i & 1) ? -1 : 1) * mag * (0.9 + 0.1 * std::sin(0.7 * double(i))));
    }
    x[40] = 1.0f;  // the absmax, so y = x
    std::vector<double> sum(x.size(), 0.0);
    std::vector<uint8_t> codes(static_cast<size_t>(rt::quant_code_bytes(s, rt::kQuantBlock)));
    std::vector<float> y(x.size());
    for (int r = 0; r < N; ++r) {
      float scale;
      rt::quant_block_encode(s, sgn, rt::QuantRounding::stochastic, rt::quant_mix64(r), x.data(), rt::kQuantBlock,
                             codes.data(), 0, &scale);
      rt::quant_block_decode(s, sgn, codes.data(), 0, scale, rt::kQuantBlock, y.data());
      for (size_t i = 0; i < x.size(); ++i) sum[i] += y[i];
    }
    // nearest rounding on the same data, which the bound must tell apart (it is biased)
    float scale;
    std::vector<float> yn(x.size());
    rt::quant_block_encode(s, sgn, rt::QuantRounding::nearest, 0, x.data(), rt::kQuantBlock, codes.data(), 0, &scale);
    rt::quant_block_decode(s, sgn, codes.data(), 0, scale, rt::kQuantBlock, yn.data());
    int nearest_fails = 0, checked = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = std::fabs(x[i]);
      double gap = -1;
      for (int j = 0; j + 1 < c.n; ++j)
        if (c.level[j] <= a && a <= c.level[j + 1]) gap = c.level[j + 1] - c.level[j];
      if (gap < 0) continue;  // v below its smallest level (m4: below 0 is impossible)
      ++checked;
      const double bound = 6 * gap / (2 * std::sqrt(double(N))) + 1e-7 * gap;
      EXPECT_LE(std::fabs(sum[i] / N - x[i]), bound) << "element " << i << " (" << x[i] << ")";
      nearest_fails += std::fabs(double(yn[i]) - x[i]) > bound;
    }
    EXPECT_GE(checked, which == 1 ? 200 : 250);
    EXPECT_GT(nearest_fails, 10);
  }
}

// The minifloat codes' relative error |x' - x| / x with nearest rounding over
// log-uniform x in [smallest level, 1]: at most half a step over the start of
// its binade, (1/16) / (1 + 1/16) = 1/17 with 3 mantissa bits (the worst case:
// halfway above a binade's start), fp32 rounding of y aside (2^-22 more).
// Prints max and mean for the record (moment_quant.h's comment), and the old
// dynamic codes' over the same inputs (their table lookup is brute force here).
TEST(MomentQuant, MinifloatRelativeErrorMatchesTheSpacing) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  struct Row {
    const QuantCode* c;
    const char* name;
    bool mf;
  };
  for (const Row& r : {Row{&rt::quant_code_m8(), "m8 e4m3", true}, Row{&rt::quant_code_v8(), "v8 e5m3", true},
                       Row{&rt::quant_code_m8_dynamic(), "m8 dynamic (old)", false},
                       Row{&rt::quant_code_v8_dynamic(), "v8 dynamic (old)", false}}) {
    const QuantCode& c = *r.c;
    const double lo = c.has_zero ? c.level[1] : c.level[0];
    double mx = 0;
    for (double bottom : {lo, 1e-2}) {  // the code's range, and the top two decades
      double m = 0, sum = 0;
      const int n = 200000;
      for (int i = 0; i < n; ++i) {
        const float x = static_cast<float>(std::exp(std::log(bottom) * u01(rng)));
        const int q = r.mf ? rt::quant_index_nearest(c, x) : brute_nearest(c, x);
        const double e = std::fabs(double(c.level[q]) - x) / x;
        m = std::max(m, e);
        sum += e;
      }
      std::printf("  %-18s over [%.3g, 1]: relative error max %.4f%%, mean %.4f%%\n", r.name, bottom, 100 * m,
                  100 * sum / n);
      mx = std::max(mx, m);
    }
    if (r.mf) {
      EXPECT_LE(mx, (1.0 / 17) * (1 + 0x1.0p-22)) << r.name;
      EXPECT_GT(mx, (1.0 / 17) * 0.99) << r.name << ": the worst case is reached";
    }
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
// values across the codes' range, exact zeros, -0, the absmax itself, levels,
// midpoints and their fp32 neighbours hit exactly (absmax 1), NaN and inf (scale NaN: the codes still agree).
void simd_codec_equals_scalar(bool avx512) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  int blocks = 0;
  for (MomentStorage s : {MomentStorage::q8, MomentStorage::q4, MomentStorage::q4})
    for (bool sg : {true, false})
      for (rt::QuantRounding r : {rt::QuantRounding::nearest, rt::QuantRounding::stochastic})
        for (int64_t k : {rt::kQuantBlock, int64_t{203}, int64_t{16}, int64_t{8}, int64_t{5}})
          for (int trial = 0; trial < 6; ++trial) {
            // the second q4 pass: a Muon unit's codes (m4n for m)
            const bool muon = s == MomentStorage::q4 && blocks >= 2 * 2 * 2 * 5 * 6;
            const QuantCode& c = s == MomentStorage::q8 ? (sg ? rt::quant_code_m8() : rt::quant_code_v8())
                                 : sg                   ? (muon ? rt::quant_code_m4n() : rt::quant_code_m4())
                                                        : rt::quant_code_v4();
            std::vector<float> x(static_cast<size_t>(k));
            for (int64_t i = 0; i < k; ++i) {
              const float mag = std::pow(10.f, -8.f * u01(rng));  // 1e-8 .. 1
              const int kind = static_cast<int>(rng() % 8);
              const float mid = c.mid[rng() % (c.n - 1)];
              float a = kind == 0   ? 0.f
                        : kind == 1 ? c.level[rng() % c.n]
                        : kind == 2 ? mid
                        : kind == 3 ? std::nextafter(mid, 0.f)
                        : kind == 4 ? std::nextafter(mid, 2.f)
                                    : mag;
              x[static_cast<size_t>(i)] = sg && (rng() & 1) ? -a : a;
            }
            if (trial == 0 || trial == 5) x[1] = (rng() & 1) && sg ? -1.f : 1.f;  // absmax 1: levels, mids exact
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
            rt::quant_block_encode(s, sg, r, key, x.data(), k, cs.data(), first, &ss, muon);
            rt::quant_block_decode(s, sg, cs.data(), first, ss, k, ys.data(), muon);
            rt::quant_set_simd(true, avx512);
            rt::quant_block_encode(s, sg, r, key, x.data(), k, cv.data(), first, &sv, muon);
            rt::quant_block_decode(s, sg, cv.data(), first, sv, k, yv.data(), muon);
            SCOPED_TRACE(testing::Message() << rt::moment_storage_name(s) << (muon ? " (muon)" : "") << (sg ? " m " : " v ")
                                            << rt::quant_rounding_name(r) << " k " << k << " trial " << trial);
            ASSERT_EQ(std::memcmp(&ss, &sv, 4), 0) << ss << " vs " << sv;
            ASSERT_EQ(cs, cv);
            ASSERT_EQ(std::memcmp(ys.data(), yv.data(), ys.size() * 4), 0);
            ++blocks;
          }
  EXPECT_EQ(blocks, 3 * 2 * 2 * 5 * 6);
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
    // m8, v8: nearest is within 1/17 relative (MinifloatRelativeErrorMatchesTheSpacing)
    // from the smallest nonzero level up; below it, within that level times the absmax (<= 1 for m, 7e-3 for v)
    EXPECT_TRUE(
        rt::test::expect_near(u.name + " m", u.m(), before[k].data(), u.numel, rt::quant_code_m8().level[1], 1.0 / 16));
    EXPECT_TRUE(rt::test::expect_near(u.name + " v", u.v(), before[k].data() + u.numel, u.numel,
                                      rt::quant_code_v8().level[0] * 7e-3, 1.0 / 16));
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
