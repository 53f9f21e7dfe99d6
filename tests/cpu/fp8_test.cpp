// The FP8 twin (core/fp8.h, cpu/fp8.h) against the definitions:
// - e4m3 decode of all 256 codes against the format's formula (computed here
//   with ldexp in double); encode(decode(c)) == c for every non-NaN code.
// - encode's rounding: every midpoint between neighbouring codes goes to the
//   even code and its fp32 neighbours to the nearer one; saturation, NaN,
//   signed zero; and 200k random fp32 values against a nearest-code search.
// - the scale rule: a power of two, the smallest with amax / s <= 448.
// - quantizers (with tails): each scale recomputed from its tile's amax, and
//   the per-element bound derived below; a transposed view quantizes like the
//   explicitly transposed matrix.
// - the FP8 linear (forward, dgrad, wgrad) against the fp32 linear within the
//   bound the per-element quantization error implies (a finite-difference
//   test is meaningless: quantization is piecewise constant).
// - per-tensor scaling (--fp8-scaling tensor): the quantizer against a
//   brute-force reference (amax in double, the scale by doubling, each code by
//   nearest-code search), amax 0 / subnormal / Inf / NaN tensors, and the
//   per-tensor linear within the same bound with the tensor's amax.
//
// Per-element bound (e4m3, power-of-two scale s of the element's tile/block,
// amax its largest |x|): x/s is exact; if |x/s| >= 2^-6 (normal range) the
// rounding error is <= 2^-4 |x| (half of the 2^-3 step relative to the
// leading bit); else it is <= 2^-10 s (half the subnormal step 2^-9), and
// s < amax / 224 (amax / s lies in (224, 448] unless s was clamped at 2^-126,
// irrelevant here). So |q(x) - x| <= 2^-4 |x| + 2^-10 amax / 224 =: e(x).
// For a dot product sum_k a_k b_k of quantized operands:
//   |sum q(a)q(b) - sum ab| <= sum (e(a_k)(|b_k| + e(b_k)) + |a_k| e(b_k))
// plus the fp32 summation of both sides, <= 2 K 2^-24 sum |a||b| (2x margin
// for the quantized side's slightly larger terms), and the rounding of the
// bias add / the accumulation into dw, <= 2^-22 |ref| (margin), which the
// test adds.
#include "cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "testutil.h"

namespace {

using rt::fp8_e4m3_decode;
using rt::fp8_e4m3_encode;
using rt::test::random_vec;
using Vec = std::vector<float>;

// e4m3 value of a code from the format's definition, in double.
double e4m3_reference(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
bool is_nan_code(int c) { return (c & 0x7F) == 0x7F; }

TEST(Fp8E4m3, DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_decode(static_cast<uint8_t>(c));
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), e4m3_reference(c)) << "code " << c;
    EXPECT_EQ(std::signbit(v), c >= 128) << "code " << c;
    EXPECT_EQ(fp8_e4m3_encode(v), c) << "round trip of code " << c << " (" << v << ")";
  }
  EXPECT_EQ(fp8_e4m3_decode(0x7E), 448.f);
  EXPECT_EQ(fp8_e4m3_decode(0x01), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_e4m3_decode(0x08), std::ldexp(1.f, -6));
}

TEST(Fp8E4m3, EncodeRoundsToNearestEvenAtEveryMidpoint) {
  for (int c = 0; c < 0x7E; ++c) {  // neighbours (c, c+1), both finite and positive
    const float a = fp8_e4m3_decode(static_cast<uint8_t>(c)), b = fp8_e4m3_decode(static_cast<uint8_t>(c + 1));
    const float mid = (a + b) / 2;  // exact: both share a binade grid a step 2^-3 finer than fp32's
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(fp8_e4m3_encode(mid), even) << "midpoint of codes " << c << ", " << c + 1;
    EXPECT_EQ(fp8_e4m3_encode(std::nextafter(mid, 0.f)), c) << "just below the midpoint of " << c;
    EXPECT_EQ(fp8_e4m3_encode(std::nextafter(mid, 1e9f)), c + 1) << "just above the midpoint of " << c;
    EXPECT_EQ(fp8_e4m3_encode(-mid), 0x80 | even) << "negative midpoint of codes " << c << ", " << c + 1;
  }
}

TEST(Fp8E4m3, EncodeSaturatesAndKeepsNaNAndSign) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(fp8_e4m3_encode(448.f), 0x7E);
  EXPECT_EQ(fp8_e4m3_encode(464.f), 0x7E);  // the midpoint towards the (NaN) code 0x7F
  EXPECT_EQ(fp8_e4m3_encode(1e30f), 0x7E);
  EXPECT_EQ(fp8_e4m3_encode(inf), 0x7E);
  EXPECT_EQ(fp8_e4m3_encode(-inf), 0xFE);
  EXPECT_EQ(fp8_e4m3_encode(nan) & 0x7F, 0x7F);
  EXPECT_EQ(fp8_e4m3_encode(0.f), 0x00);
  EXPECT_EQ(fp8_e4m3_encode(-0.f), 0x80);
  EXPECT_EQ(fp8_e4m3_encode(std::ldexp(1.f, -10)), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(fp8_e4m3_encode(std::ldexp(1.f, -140)), 0x00);
  EXPECT_EQ(fp8_e4m3_encode(-std::ldexp(1.f, -140)), 0x80);
}

// Nearest code by search over all finite codes, ties to the even code.
int nearest_code(float v) {
  const double x = std::fabs(static_cast<double>(v));
  if (x >= 448) return (std::signbit(v) ? 0x80 : 0) | 0x7E;
  int best = 0;
  double best_d = 1e300;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(e4m3_reference(c) - x);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return (std::signbit(v) ? 0x80 : 0) | best;
}

TEST(Fp8E4m3, EncodeIsTheNearestCodeOnRandomValues) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-14, 10), sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    const float v = std::ldexp(mant(rng), expo(rng)) * (sign(rng) ? -1.f : 1.f);
    ASSERT_EQ(fp8_e4m3_encode(v), nearest_code(v)) << "value " << v;
  }
}

TEST(Fp8Scale, SmallestPowerOfTwoThatFits) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-100, 100);
  std::vector<float> amaxes = {448.f, 449.f, 224.f, 1.f, 1.75f, std::nextafter(1.75f, 2.f), 3.5f, 1e-30f};
  for (int i = 0; i < 10000; ++i) amaxes.push_back(std::ldexp(mant(rng), expo(rng)));
  for (float amax : amaxes) {
    const auto s = rt::fp8_block_scale(amax, false);
    int e = 0;
    const float m = std::frexp(s.scale, &e);
    ASSERT_EQ(m, 0.5f) << "scale of amax " << amax << " is not a power of two: " << s.scale;
    ASSERT_EQ(s.scale * s.inv, 1.f) << amax;
    ASSERT_LE(static_cast<double>(amax) / s.scale, 448.0) << amax;
    ASSERT_GT(static_cast<double>(amax) / (s.scale / 2), 448.0) << "scale of amax " << amax << " is not the smallest";
  }
  EXPECT_EQ(rt::fp8_block_scale(0.f, false).scale, 1.f);
  EXPECT_TRUE(std::isnan(rt::fp8_block_scale(1.f, true).scale));
  EXPECT_EQ(rt::fp8_block_scale(std::ldexp(1.f, -140), false).scale, std::ldexp(1.f, -126));  // clamped
}

// e(x) of the header comment.
double elem_bound(float x, float amax) { return std::ldexp(std::fabs(x), -4) + std::ldexp(amax, -10) / 224.0; }

// Values with a wide spread of magnitudes (a tile's small elements then sit in
// e4m3's subnormal range relative to its large ones).
Vec spread_values(int64_t n, uint64_t seed) {
  Vec v = random_vec(n, seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_int_distribution<int> e(-12, 3);
  for (float& x : v) x = std::ldexp(x, e(rng));
  return v;
}

TEST(Fp8Quantize, OneByOneTwentyEightTilesWithTails) {
  const int64_t R = 5, K = 300, KB = 3;  // tiles of 128, 128, 44
  const Vec x = spread_values(R * K, 11);
  std::vector<uint8_t> q(R * K);
  Vec s(R * KB), dq(R * K);
  rt::cpu::fp8_quantize_1x128(q.data(), s.data(), x.data(), R, K, K, 1);
  rt::cpu::fp8_dequantize_1x128(dq.data(), q.data(), s.data(), R, K);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t kb = 0; kb < KB; ++kb) {
      float amax = 0;
      for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) amax = std::max(amax, std::fabs(x[r * K + k]));
      ASSERT_EQ(s[r * KB + kb], rt::fp8_block_scale(amax, false).scale) << "tile " << r << "," << kb;
      for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) {
        ASSERT_EQ(dq[r * K + k], fp8_e4m3_decode(q[r * K + k]) * s[r * KB + kb]);
        ASSERT_LE(std::fabs(dq[r * K + k] - x[r * K + k]), elem_bound(x[r * K + k], amax))
            << "element " << r << "," << k << " x=" << x[r * K + k];
      }
    }
  // a transposed view: xt[K, R] quantized along R with swapped strides == quantizing x^T
  Vec xt(K * R);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) xt[k * R + r] = x[r * K + k];
  std::vector<uint8_t> q1(K * R), q2(K * R);
  Vec s1(K), s2(K);
  rt::cpu::fp8_quantize_1x128(q1.data(), s1.data(), xt.data(), K, R, R, 1);
  rt::cpu::fp8_quantize_1x128(q2.data(), s2.data(), x.data(), K, R, 1, K);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(s1, s2);
}

TEST(Fp8Quantize, BlocksWithTails) {
  const int64_t R = 200, K = 300, RB = 2, KB = 3;
  const Vec x = spread_values(R * K, 12);
  std::vector<uint8_t> q(R * K);
  Vec s(RB * KB), dq(R * K);
  rt::cpu::fp8_quantize_128x128(q.data(), s.data(), x.data(), R, K);
  rt::cpu::fp8_dequantize_128x128(dq.data(), q.data(), s.data(), R, K);
  for (int64_t rb = 0; rb < RB; ++rb)
    for (int64_t kb = 0; kb < KB; ++kb) {
      float amax = 0;
      for (int64_t r = rb * 128; r < std::min(R, rb * 128 + 128); ++r)
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k) amax = std::max(amax, std::fabs(x[r * K + k]));
      ASSERT_EQ(s[rb * KB + kb], rt::fp8_block_scale(amax, false).scale) << "block " << rb << "," << kb;
      for (int64_t r = rb * 128; r < std::min(R, rb * 128 + 128); ++r)
        for (int64_t k = kb * 128; k < std::min(K, kb * 128 + 128); ++k)
          ASSERT_LE(std::fabs(dq[r * K + k] - x[r * K + k]), elem_bound(x[r * K + k], amax))
              << "element " << r << "," << k;
    }
}

TEST(Fp8Quantize, NonFiniteTilePropagatesNaN) {
  const int64_t K = 256;
  Vec x = random_vec(K, 5);
  x[3] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> q(K);
  Vec s(2), dq(K);
  rt::cpu::fp8_quantize_1x128(q.data(), s.data(), x.data(), 1, K, K, 1);
  rt::cpu::fp8_dequantize_1x128(dq.data(), q.data(), s.data(), 1, K);
  for (int64_t k = 0; k < 128; ++k) EXPECT_TRUE(std::isnan(dq[k])) << k;
  for (int64_t k = 128; k < K; ++k) EXPECT_FALSE(std::isnan(dq[k])) << k;  // the next tile is unaffected
}

// Per-row amax of a [R, K] view along K in tiles of 128 (what 1x128 uses).
struct TileAmax {
  Vec a;
  int64_t KB;
  TileAmax(const float* x, int64_t R, int64_t K, int64_t rs, int64_t cs) : a(R * ((K + 127) / 128)), KB((K + 127) / 128) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k)
        a[r * KB + k / 128] = std::max(a[r * KB + k / 128], std::fabs(x[r * rs + k * cs]));
  }
  float at(int64_t r, int64_t k) const { return a[r * KB + k / 128]; }
};

// out[m, n] = sum_k A(m, k) B(n, k) of the fp8 side vs the fp32 side, within
// the bound of the header comment; A(m, k) and B(n, k) with amax lookups.
template <class FA, class FB, class AA, class AB>
void expect_within_fp8_bound(const std::string& name, const Vec& got, const Vec& ref, int64_t M, int64_t N, int64_t K,
                             FA a, FB b, AA amax_a, AB amax_b, double* worst_ratio) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double bound = 0, abs_sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float x = a(m, k), y = b(n, k);
        const double ex = elem_bound(x, amax_a(m, k)), ey = elem_bound(y, amax_b(n, k));
        bound += ex * (std::fabs(y) + ey) + std::fabs(x) * ey;
        abs_sum += std::fabs(static_cast<double>(x) * y);
      }
      bound += 2.0 * K * std::ldexp(1.0, -24) * abs_sum + std::ldexp(std::fabs(ref[m * N + n]), -22);  // + the bias/beta add
      const double err = std::fabs(static_cast<double>(got[m * N + n]) - ref[m * N + n]);
      ASSERT_LE(err, bound) << name << " element " << m << "," << n;
      *worst_ratio = std::max(*worst_ratio, err / bound);
    }
}

TEST(Fp8Linear, WithinTheQuantizationBoundOfTheFp32Linear) {
  // every dim a multiple of 16 but not of 128: tails in each GEMM's reduction dim
  const int64_t N = 144, I = 160, O = 208;
  const Vec x = random_vec(N * I, 21), w = random_vec(O * I, 22, -0.2f, 0.2f), b = random_vec(O, 23);
  const Vec dy = spread_values(N * O, 24);
  Vec y(N * O), y_ref(N * O);
  rt::cpu::fp8_linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
  rt::cpu::linear_forward(y_ref.data(), x.data(), w.data(), b.data(), N, I, O);
  Vec dx(N * I), dx_ref(N * I), dw(O * I, 0.5f), dw_ref(O * I, 0.5f), db(O, 0.25f), db_ref(O, 0.25f);
  rt::cpu::fp8_linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O);
  rt::cpu::linear_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(), x.data(), w.data(), N, I, O);

  // weight block amax (128x128 over w[O, I])
  const int64_t IB = (I + 127) / 128;
  Vec wa(((O + 127) / 128) * IB);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) wa[(o / 128) * IB + i / 128] = std::max(wa[(o / 128) * IB + i / 128], std::fabs(w[o * I + i]));
  auto w_amax = [&](int64_t o, int64_t i) { return wa[(o / 128) * IB + i / 128]; };

  double worst = 0;
  {  // forward: y[n, o] = sum_i x[n, i] w[o, i]; x tiles along I
    const TileAmax xa(x.data(), N, I, I, 1);
    expect_within_fp8_bound(
        "y", y, y_ref, N, O, I, [&](int64_t n, int64_t i) { return x[n * I + i]; },
        [&](int64_t o, int64_t i) { return w[o * I + i]; }, [&](int64_t n, int64_t i) { return xa.at(n, i); },
        [&](int64_t o, int64_t i) { return w_amax(o, i); }, &worst);
  }
  {  // dgrad: dx[n, i] = sum_o dy[n, o] w[o, i]; dy tiles along O
    const TileAmax da(dy.data(), N, O, O, 1);
    expect_within_fp8_bound(
        "dx", dx, dx_ref, N, I, O, [&](int64_t n, int64_t o) { return dy[n * O + o]; },
        [&](int64_t i, int64_t o) { return w[o * I + i]; }, [&](int64_t n, int64_t o) { return da.at(n, o); },
        [&](int64_t i, int64_t o) { return w_amax(o, i); }, &worst);
  }
  {  // wgrad: dw[o, i] = 0.5 + sum_n dy[n, o] x[n, i]; both tiles along N
    const TileAmax dta(dy.data(), O, N, 1, O), xta(x.data(), I, N, 1, I);
    expect_within_fp8_bound(
        "dw", dw, dw_ref, O, I, N, [&](int64_t o, int64_t n) { return dy[n * O + o]; },
        [&](int64_t i, int64_t n) { return x[n * I + i]; }, [&](int64_t o, int64_t n) { return dta.at(o, n); },
        [&](int64_t i, int64_t n) { return xta.at(i, n); }, &worst);
  }
  EXPECT_EQ(db, db_ref);  // the bias gradient is not quantized
  // the bound is not vacuous: FP8 moved the results by a measurable share of it
  EXPECT_GT(worst, 1e-3) << "the fp8 linear matched fp32 far inside the bound: is it quantizing at all?";
  std::printf("worst |fp8 - fp32| / bound = %.3f\n", worst);
}

// ---- per-tensor scaling ----

// The brute-force reference of fp8_quantize_tensor: amax in double; the
// scale the smallest power of two 2^k (k >= -126) with amax <= 448 * 2^k,
// found by stepping k; each code the nearest e4m3 code of x / 2^k.
struct TensorRef {
  std::vector<uint8_t> q;
  float scale;
};
TensorRef tensor_reference(const Vec& x) {
  double amax = 0;
  bool nonfinite = false;
  for (float v : x) {
    if (!std::isfinite(v)) nonfinite = true;
    else amax = std::max(amax, std::fabs(static_cast<double>(v)));
  }
  TensorRef r{std::vector<uint8_t>(x.size()), std::numeric_limits<float>::quiet_NaN()};
  if (nonfinite) {
    std::fill(r.q.begin(), r.q.end(), rt::kFp8E4m3NaN);
    return r;
  }
  int k = -126;
  if (amax > 0)
    while (amax > std::ldexp(448.0, k)) ++k;
  else
    k = 0;  // all zero: scale 1
  r.scale = std::ldexp(1.f, k);
  for (size_t i = 0; i < x.size(); ++i) r.q[i] = static_cast<uint8_t>(nearest_code(std::ldexp(x[i], -k)));
  return r;
}

void expect_tensor_matches_reference(const Vec& x, int64_t R, int64_t K, const char* what) {
  std::vector<uint8_t> q(x.size());
  const float s = rt::cpu::fp8_quantize_tensor(q.data(), x.data(), R, K, K, 1);
  const TensorRef ref = tensor_reference(x);
  ASSERT_EQ(std::memcmp(&s, &ref.scale, 4), 0) << what << ": scale " << s << " vs " << ref.scale;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(q[i], ref.q[i]) << what << ": element " << i << " x=" << x[i] << " scale " << s;
}

TEST(Fp8Tensor, QuantizeMatchesTheBruteForceReference) {
  const int64_t R = 37, K = 53;  // no multiple of anything
  expect_tensor_matches_reference(spread_values(R * K, 41), R, K, "spread");
  Vec big = random_vec(R * K, 42);
  for (float& v : big) v = std::ldexp(v, 90);
  expect_tensor_matches_reference(big, R, K, "large");
  Vec small = random_vec(R * K, 43);
  for (float& v : small) v = std::ldexp(v, -100);
  expect_tensor_matches_reference(small, R, K, "small");
  // amax exactly at the scale rule's breakpoints (1.75 * 2^E and just above)
  Vec edge = random_vec(R * K, 44);
  edge[7] = 1.75f;
  expect_tensor_matches_reference(edge, R, K, "amax 1.75");
  edge[7] = std::nextafter(1.75f, 2.f);
  expect_tensor_matches_reference(edge, R, K, "amax just above 1.75");
  // rows processed over the pool give the same as one row
  const Vec x = spread_values(R * K, 45);
  std::vector<uint8_t> q1(R * K), q2(R * K);
  const float s1 = rt::cpu::fp8_quantize_tensor(q1.data(), x.data(), R, K, K, 1);
  const float s2 = rt::cpu::fp8_quantize_tensor(q2.data(), x.data(), 1, R * K, R * K, 1);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(s1, s2);
  // a transposed view: the transposed codes, the same scale
  std::vector<uint8_t> qt(R * K);
  const float st = rt::cpu::fp8_quantize_tensor(qt.data(), x.data(), K, R, 1, K);
  EXPECT_EQ(st, s1);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(qt[k * R + r], q1[r * K + k]) << r << "," << k;
}

// Documented edge cases (cpu/fp8.h): amax 0 -> scale 1, codes 0 (signs kept);
// an fp32-subnormal amax -> scale 2^-126, codes 0; Inf or NaN anywhere -> scale
// NaN, every code NaN (dequantized: NaN everywhere).
TEST(Fp8Tensor, ZeroSubnormalAndNonFiniteTensors) {
  const int64_t n = 64;
  std::vector<uint8_t> q(n);
  Vec zero(n, 0.f);
  zero[3] = -0.f;
  EXPECT_EQ(rt::cpu::fp8_quantize_tensor(q.data(), zero.data(), 1, n, n, 1), 1.f);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(q[i] & 0x7F, 0) << i;
  expect_tensor_matches_reference(zero, 1, n, "zero");

  Vec sub(n);
  for (int64_t i = 0; i < n; ++i) sub[i] = std::ldexp(static_cast<float>(i % 7) - 3.f, -140);
  EXPECT_EQ(rt::cpu::fp8_quantize_tensor(q.data(), sub.data(), 1, n, n, 1), std::ldexp(1.f, -126));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(q[i] & 0x7F, 0) << i;
  expect_tensor_matches_reference(sub, 1, n, "subnormal");

  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Vec x = random_vec(n, 46);
    x[n - 1] = bad;
    const float s = rt::cpu::fp8_quantize_tensor(q.data(), x.data(), 8, 8, 8, 1);
    EXPECT_TRUE(std::isnan(s)) << bad;
    Vec dq(n);
    rt::cpu::fp8_dequantize_tensor(dq.data(), q.data(), s, n);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(q[i], rt::kFp8E4m3NaN) << bad << " " << i;
      EXPECT_TRUE(std::isnan(dq[i])) << bad << " " << i;
    }
  }
}

// The per-tensor linear within the bound of the header comment, each element's
// amax being its whole tensor's (so the subnormal term 2^-10 amax / 224 is
// per tensor, the point of the coarser scaling).
TEST(Fp8Tensor, LinearWithinTheQuantizationBoundOfTheFp32Linear) {
  const int64_t N = 144, I = 160, O = 208;
  const Vec x = random_vec(N * I, 51), w = random_vec(O * I, 52, -0.2f, 0.2f), b = random_vec(O, 53);
  const Vec dy = spread_values(N * O, 54);
  Vec y(N * O), y_ref(N * O);
  rt::cpu::fp8_tensor_linear_forward(y.data(), x.data(), w.data(), b.data(), N, I, O);
  rt::cpu::linear_forward(y_ref.data(), x.data(), w.data(), b.data(), N, I, O);
  Vec dx(N * I), dx_ref(N * I), dw(O * I, 0.5f), dw_ref(O * I, 0.5f), db(O, 0.25f), db_ref(O, 0.25f);
  rt::cpu::fp8_tensor_linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, I, O);
  rt::cpu::linear_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), dy.data(), x.data(), w.data(), N, I, O);
  auto amax = [](const Vec& v) {
    float m = 0;
    for (float e : v) m = std::max(m, std::fabs(e));
    return m;
  };
  const float ax = amax(x), aw = amax(w), ady = amax(dy);
  double worst = 0;
  expect_within_fp8_bound(
      "y", y, y_ref, N, O, I, [&](int64_t n, int64_t i) { return x[n * I + i]; },
      [&](int64_t o, int64_t i) { return w[o * I + i]; }, [&](int64_t, int64_t) { return ax; },
      [&](int64_t, int64_t) { return aw; }, &worst);
  expect_within_fp8_bound(
      "dx", dx, dx_ref, N, I, O, [&](int64_t n, int64_t o) { return dy[n * O + o]; },
      [&](int64_t i, int64_t o) { return w[o * I + i]; }, [&](int64_t, int64_t) { return ady; },
      [&](int64_t, int64_t) { return aw; }, &worst);
  expect_within_fp8_bound(
      "dw", dw, dw_ref, O, I, N, [&](int64_t o, int64_t n) { return dy[n * O + o]; },
      [&](int64_t i, int64_t n) { return x[n * I + i]; }, [&](int64_t, int64_t) { return ady; },
      [&](int64_t, int64_t) { return ax; }, &worst);
  EXPECT_EQ(db, db_ref);
  EXPECT_GT(worst, 1e-3) << "the per-tensor fp8 linear matched fp32 far inside the bound: is it quantizing at all?";
  // it is not the block recipe: with dy's magnitudes spread over 2^-12..2^3
  // its 1x128 tiles get other scales than the whole tensor's, so dx differs
  Vec dxb(N * I);
  rt::cpu::fp8_linear_backward(dxb.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), N, I, O);
  EXPECT_NE(dxb, dx);
  std::printf("per-tensor: worst |fp8 - fp32| / bound = %.3f\n", worst);
}

TEST(Fp8Linear, SameBitsForAnyThreadCount) {
  const int64_t N = 64, I = 272, O = 48;
  const Vec x = random_vec(N * I, 31), w = random_vec(O * I, 32), dy = random_vec(N * O, 33);
  auto run = [&](int threads) {
    rt::set_global_threads(threads);
    Vec y(N * O), dx(N * I), dw(O * I, 0.f);
    rt::cpu::fp8_linear_forward(y.data(), x.data(), w.data(), nullptr, N, I, O);
    rt::cpu::fp8_linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, I, O);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    // and the per-tensor recipe
    Vec yt(N * O), dxt(N * I), dwt(O * I, 0.f);
    rt::cpu::fp8_tensor_linear_forward(yt.data(), x.data(), w.data(), nullptr, N, I, O);
    rt::cpu::fp8_tensor_linear_backward(dxt.data(), dwt.data(), nullptr, dy.data(), x.data(), w.data(), N, I, O);
    for (const Vec* v : {&yt, &dxt, &dwt}) y.insert(y.end(), v->begin(), v->end());
    return y;
  };
  const Vec a = run(1), b = run(3);
  rt::set_global_threads(0);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

}  // namespace
