// Tests for the CPU reference ops (cpu/ops.h).
// - Forward of every op against an independent naive reference written here in
//   double (triple-loop GEMMs, full-softmax attention, direct rotation, ...).
// - Finite-difference gradients for every op with a backward: the scalar
//   L = sum(out .* R) for a fixed random R (for cross-entropy: grad_scale * loss),
//   central differences on the fp32 input, L accumulated in double.
// - '+=' semantics of weight gradients, '=' of activations/input gradients
//   (outputs prefilled with NaN), bit-identical results for 1 vs 3 threads,
//   and rt::Error on bad targets.
#include "cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "testutil.h"

namespace {

using rt::test::check_fd_grad;
using rt::test::dot_d;
using rt::test::expect_near;
using rt::test::random_vec;
using Vec = std::vector<float>;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

void expect_bitwise(const std::string& name, const Vec& a, const Vec& b) {
  ASSERT_EQ(a.size(), b.size()) << name;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name << " differs bitwise";
}

Vec doubled(const Vec& a) {
  Vec r(a);
  for (auto& x : r) x *= 2.f;
  return r;
}

// ---------------------------------------------------------------- matmul

enum class Mm { nt, nn, tn };

// Naive double reference: out = beta*out0 + op(a) @ op(b).
Vec matmul_ref(Mm mode, const Vec& a, const Vec& b, const Vec& out0, int64_t M, int64_t N, int64_t K, float beta) {
  Vec out(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = beta != 0.f ? static_cast<double>(beta) * out0[m * N + n] : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = mode == Mm::tn ? a[k * M + m] : a[m * K + k];
        const double bv = mode == Mm::nt ? b[n * K + k] : b[k * N + n];
        s += av * bv;
      }
      out[m * N + n] = static_cast<float>(s);
    }
  return out;
}

void matmul_call(Mm mode, Vec& out, const Vec& a, const Vec& b, int64_t M, int64_t N, int64_t K, float beta) {
  switch (mode) {
    case Mm::nt:
      rt::cpu::matmul_nt(out.data(), a.data(), b.data(), M, N, K, beta);
      break;
    case Mm::nn:
      rt::cpu::matmul_nn(out.data(), a.data(), b.data(), M, N, K, beta);
      break;
    case Mm::tn:
      rt::cpu::matmul_tn(out.data(), a.data(), b.data(), M, N, K, beta);
      break;
  }
}

TEST(CpuMatmul, AllLayoutsMatchTripleLoopWithBetaZeroAndOne) {
  // M = 150 spans three 64-row blocks (the last one partial).
  const int64_t M = 150, N = 37, K = 70;
  // fp32 GEMM error bound: K * 2^-24 * sum_k |a_k b_k| <= 70 * 6e-8 * 70 * 0.25
  // ~ 7e-5 for entries uniform in [-1, 1]; atol 1e-4.
  const double atol = 1e-4;
  const char* names[] = {"nt", "nn", "tn"};
  for (Mm mode : {Mm::nt, Mm::nn, Mm::tn}) {
    const std::string nm = names[static_cast<int>(mode)];
    Vec a = random_vec(M * K, 1), b = random_vec(N * K, 2), out0 = random_vec(M * N, 3);
    Vec out(static_cast<size_t>(M * N), kNaN);  // beta = 0 must overwrite garbage, even NaN
    matmul_call(mode, out, a, b, M, N, K, 0.f);
    EXPECT_TRUE(expect_near("matmul_" + nm + " beta=0", out, matmul_ref(mode, a, b, out0, M, N, K, 0.f), atol, 0));
    out = out0;
    matmul_call(mode, out, a, b, M, N, K, 1.f);
    EXPECT_TRUE(expect_near("matmul_" + nm + " beta=1", out, matmul_ref(mode, a, b, out0, M, N, K, 1.f), atol, 0));
  }
}

TEST(CpuMatmul, EmptyInnerDimensionGivesBetaTimesOut) {
  Vec out(6, kNaN);
  rt::cpu::matmul_nt(out.data(), nullptr, nullptr, 2, 3, 0, 0.f);
  for (float v : out) EXPECT_EQ(v, 0.f);
  Vec acc = {1, 2, 3, 4, 5, 6}, want = acc;
  rt::cpu::matmul_tn(acc.data(), nullptr, nullptr, 2, 3, 0, 1.f);
  expect_bitwise("matmul_tn K=0 beta=1", acc, want);
}

TEST(CpuMatmul, BetaOneAccumulatesTheSameProductEachCall) {
  // K = 300 is longer than one OpenBLAS K-panel, where a plain beta=1 sgemm
  // would add partial sums into out and not double exactly.
  const int64_t M = 70, N = 20, K = 300;
  Vec a = random_vec(K * M, 4), b = random_vec(K * N, 5);
  Vec out(static_cast<size_t>(M * N), 0.f);
  rt::cpu::matmul_tn(out.data(), a.data(), b.data(), M, N, K, 1.f);
  Vec once = out;
  rt::cpu::matmul_tn(out.data(), a.data(), b.data(), M, N, K, 1.f);
  expect_bitwise("matmul_tn accumulated twice", out, doubled(once));
}

// ---------------------------------------------------------------- embedding

TEST(CpuEmbedding, ForwardGathersRowsAndBackwardMatchesFiniteDifferences) {
  const int64_t V = 7, C = 5, N = 9;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 1, 3, 0, 2, 5};  // repeats; id 4 unused
  Vec table = random_vec(V * C, 11), r = random_vec(N * C, 12);
  Vec out(static_cast<size_t>(N * C), kNaN);
  rt::cpu::embedding_forward(out.data(), ids.data(), table.data(), N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], table[ids[n] * C + c]) << n << "," << c;

  Vec dtable(static_cast<size_t>(V * C), 0.f);
  rt::cpu::embedding_backward(dtable.data(), r.data(), ids.data(), N, C);
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[4 * C + c], 0.f) << "unused id 4 got a gradient";
  auto loss = [&] {
    Vec o(static_cast<size_t>(N * C));
    rt::cpu::embedding_forward(o.data(), ids.data(), table.data(), N, C);
    return dot_d(o, r);
  };
  check_fd_grad("embedding dtable", table, dtable, loss);

  // '+=': a second call adds exactly the same sum again.
  Vec once = dtable;
  rt::cpu::embedding_backward(dtable.data(), r.data(), ids.data(), N, C);
  expect_bitwise("embedding dtable twice", dtable, doubled(once));
}

// The host embedding's landing (engine/cuda/host_embedding.cpp) scatters the
// device's bf16 dx as it reads it: the same bits as the fp32 scatter of the
// widened rows, and the same "+=".
TEST(CpuEmbedding, Bf16ScatterEqualsTheFp32ScatterOfTheWidenedRows) {
  const int64_t V = 50, C = 24, N = 300;
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 7 + n / 5) % 37);  // repeats; ids 37..49 unused
  const Vec r = random_vec(N * C, 13, -3.f, 3.f);
  std::vector<uint16_t> rb(r.size());
  Vec widened(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    rb[i] = rt::f32_to_bf16(r[i]);
    widened[i] = rt::bf16_to_f32(rb[i]);
  }
  Vec want = random_vec(V * C, 14), got = want;  // a non-zero start: both add
  rt::cpu::embedding_backward(want.data(), widened.data(), ids.data(), N, C);
  rt::cpu::embedding_backward(got.data(), rb.data(), ids.data(), N, C);
  expect_bitwise("bf16 scatter", got, want);
  EXPECT_NE(want, random_vec(V * C, 14)) << "the scatter changed nothing";
}

// ---------------------------------------------------------------- RMSNorm

TEST(CpuRmsNorm, ForwardMatchesDoubleReference) {
  const int64_t N = 6, C = 16;
  const float eps = 1e-5f;
  Vec x = random_vec(N * C, 21), w = random_vec(C, 22, 0.5f, 1.5f);
  Vec out(static_cast<size_t>(N * C), kNaN), rstd(N, kNaN);
  rt::cpu::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  Vec out_ref(out.size()), rstd_ref(N);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    rstd_ref[n] = static_cast<float>(r);
    for (int64_t c = 0; c < C; ++c) out_ref[n * C + c] = static_cast<float>(w[c] * (x[n * C + c] * r));
  }
  // A handful of fp32 roundings (mean, sqrt, divide, two products): a few ulp,
  // i.e. ~1e-6 relative on values of size O(1).
  EXPECT_TRUE(expect_near("rms_norm rstd", rstd, rstd_ref, 1e-6, 1e-5));
  EXPECT_TRUE(expect_near("rms_norm out", out, out_ref, 1e-6, 1e-5));
}

TEST(CpuRmsNorm, BackwardMatchesFiniteDifferencesAndAccumulatesDw) {
  const int64_t N = 6, C = 16;
  const float eps = 1e-5f;
  Vec x = random_vec(N * C, 23), w = random_vec(C, 24, 0.5f, 1.5f), r = random_vec(N * C, 25);
  Vec out(static_cast<size_t>(N * C)), rstd(N);
  rt::cpu::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  Vec dx(static_cast<size_t>(N * C), kNaN), dw(C, 0.f);
  rt::cpu::rms_norm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] {
    Vec o(static_cast<size_t>(N * C)), s(N);
    rt::cpu::rms_norm_forward(o.data(), s.data(), x.data(), w.data(), N, C, eps);
    return dot_d(o, r);
  };
  check_fd_grad("rms_norm dx", x, dx, loss, 200);
  check_fd_grad("rms_norm dw", w, dw, loss);

  Vec once = dw;
  rt::cpu::rms_norm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_bitwise("rms_norm dw twice", dw, doubled(once));
}

// ---------------------------------------------------------------- linear

void linear_case(int64_t N, int64_t I, int64_t O, bool with_bias, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " I=" << I << " O=" << O << " bias=" << with_bias);
  Vec x = random_vec(N * I, seed), w = random_vec(O * I, seed + 1), bias = random_vec(O, seed + 2);
  Vec r = random_vec(N * O, seed + 3);
  const float* bp = with_bias ? bias.data() : nullptr;
  Vec out(static_cast<size_t>(N * O), kNaN);
  rt::cpu::linear_forward(out.data(), x.data(), w.data(), bp, N, I, O);
  Vec out_ref(out.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = with_bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < I; ++i) s += static_cast<double>(x[n * I + i]) * w[o * I + i];
      out_ref[n * O + o] = static_cast<float>(s);
    }
  // K <= 9 products of values in [-1, 1]: error <= 10 * 6e-8 * 9 ~ 5e-6.
  EXPECT_TRUE(expect_near("linear out", out, out_ref, 1e-5, 0));

  Vec dx(static_cast<size_t>(N * I), kNaN), dw(static_cast<size_t>(O * I), 0.f), db(O, 0.f);
  rt::cpu::linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, r.data(), x.data(), w.data(), N, I,
                           O);
  auto loss = [&] {
    Vec o(static_cast<size_t>(N * O));
    rt::cpu::linear_forward(o.data(), x.data(), w.data(), bp, N, I, O);
    return dot_d(o, r);
  };
  check_fd_grad("linear dx", x, dx, loss);
  check_fd_grad("linear dw", w, dw, loss);
  if (with_bias) check_fd_grad("linear dbias", bias, db, loss);

  // dx == nullptr: only the weight gradients, identical to the full call's.
  Vec dw2(dw.size(), 0.f), db2(O, 0.f);
  rt::cpu::linear_backward(nullptr, dw2.data(), with_bias ? db2.data() : nullptr, r.data(), x.data(), w.data(), N, I,
                           O);
  expect_bitwise("linear dw without dx", dw2, dw);
  // '+=': a second call doubles dw and dbias exactly.
  Vec dw_once = dw, db_once = db;
  rt::cpu::linear_backward(dx.data(), dw.data(), with_bias ? db.data() : nullptr, r.data(), x.data(), w.data(), N, I,
                           O);
  expect_bitwise("linear dw twice", dw, doubled(dw_once));
  if (with_bias) expect_bitwise("linear dbias twice", db, doubled(db_once));
}

TEST(CpuLinear, WithBias) { linear_case(5, 7, 6, true, 31); }
TEST(CpuLinear, WithoutBiasAcrossRowBlocks) { linear_case(70, 9, 67, false, 41); }  // 70, 67 > 64-row block

// ---------------------------------------------------------------- RoPE

TEST(CpuRope, DefaultInvFreqMatchesFormula) {
  for (auto [theta, D] : {std::pair<double, int64_t>{10000.0, 16}, {1e6, 96}, {500000.0, 128}}) {
    rt::RopeConfig cfg;
    cfg.theta = theta;
    Vec got = rt::cpu::rope_inv_freq(cfg, D);
    ASSERT_EQ(static_cast<int64_t>(got.size()), D / 2);
    Vec ref(got.size());
    for (int64_t i = 0; i < D / 2; ++i) ref[i] = static_cast<float>(std::pow(theta, -2.0 * i / D));
    // fp32 pow and reciprocal (~1 ulp each) plus the fp32 exponent 2i/D
    // (relative error 6e-8, times ln(theta) <= 14): <= ~1e-6 relative.
    EXPECT_TRUE(expect_near("inv_freq theta=" + std::to_string(theta), got, ref, 0, 2e-6));
  }
  // Values printed by transformers 5.24 LlamaRotaryEmbedding (torch 2.15 CPU)
  // for theta = 1e6, head_dim 96 (Qwen-style), where 2i/96 is not exact in
  // fp32: within 1 ulp (bit-identical when written; see the llama3 test).
  rt::RopeConfig cfg;
  cfg.theta = 1e6;
  const Vec got = rt::cpu::rope_inv_freq(cfg, 96);
  const std::pair<int, float> hf[] = {{1, 0x1.7ff222p-1f}, {17, 0x1.eb7362p-8f}, {47, 0x1.65f6dep-20f}};
  for (auto [i, v] : hf) EXPECT_NEAR(got[i], v, std::fabs(v) * 0x1p-23) << "index " << i;
}

TEST(CpuRope, Llama3InvFreqMatchesDoubleReimplementation) {
  rt::RopeConfig cfg;  // Llama 3.1 settings
  cfg.theta = 500000.0;
  cfg.scaling = rt::RopeScaling::llama3;
  cfg.factor = 8.0;
  cfg.low_freq_factor = 1.0;
  cfg.high_freq_factor = 4.0;
  cfg.original_max_positions = 8192;
  const int64_t D = 128;
  Vec got = rt::cpu::rope_inv_freq(cfg, D);
  Vec ref(D / 2);
  int n_high = 0, n_low = 0, n_mid = 0;
  const double low_wl = 8192.0 / 1.0, high_wl = 8192.0 / 4.0;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / D);
    const double wl = 2 * std::numbers::pi / f;
    double o;
    if (wl < high_wl) {
      o = f, ++n_high;
    } else if (wl > low_wl) {
      o = f / 8.0, ++n_low;
    } else {
      const double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
      o = (1 - s) * f / 8.0 + s * f, ++n_mid;
    }
    ref[i] = static_cast<float>(o);
  }
  // All three bands occur, so every branch of the formula is checked.
  EXPECT_GT(n_high, 0);
  EXPECT_GT(n_low, 0);
  EXPECT_GT(n_mid, 0);
  // fp32 evaluation of the same formula: a few ulp beyond the default case.
  EXPECT_TRUE(expect_near("llama3 inv_freq", got, ref, 0, 4e-6));

  // And values printed by transformers 5.24 (_compute_llama3_parameters with
  // torch 2.15 on CPU) for this config: indices 0, 20 (high band), 29, 30, 34
  // (smooth band), 35 and 63 (low band). Our fp32 emulation of its operation
  // order reproduced all 64 values bit for bit when this test was written; the
  // check allows 1 ulp because torch's vectorised pow may round differently
  // from this libm's powf on other machines.
  const std::pair<int, float> hf[] = {{0, 0x1p+0f},          {20, 0x1.0f5386p-6f},  {29, 0x1.1bfa0cp-9f},
                                      {30, 0x1.67a23ap-10f}, {34, 0x1.765ba4p-13f}, {35, 0x1.90d10cp-14f},
                                      {63, 0x1.4985fep-22f}};
  for (auto [i, v] : hf) EXPECT_NEAR(got[i], v, std::fabs(v) * 0x1p-23) << "index " << i;
}

// x [N, heads, D]: direct rotation with the fp32 angle the contract specifies,
// cos/sin and products in double, rotate-half layout.
Vec rope_ref(const Vec& x, const std::vector<int32_t>& pos, const Vec& inv, int64_t N, int64_t heads, int64_t D) {
  Vec out(x.size());
  const int64_t half = D / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<float>(pos[n]) * inv[i];
        const int64_t base = (n * heads + h) * D;
        const double a = x[base + i], b = x[base + half + i];
        out[base + i] = static_cast<float>(a * std::cos(ang) - b * std::sin(ang));
        out[base + half + i] = static_cast<float>(b * std::cos(ang) + a * std::sin(ang));
      }
  return out;
}

TEST(CpuRope, ForwardMatchesDirectRotationAndBackwardMatchesFiniteDifferences) {
  const int64_t N = 5, heads = 3, D = 8;
  const std::vector<int32_t> pos = {0, 1, 7, 33, 5000};
  rt::RopeConfig cfg;
  const Vec inv = rt::cpu::rope_inv_freq(cfg, D);
  Vec x = random_vec(N * heads * D, 51), r = random_vec(N * heads * D, 52);
  Vec y = x;
  rt::cpu::rope_forward(y.data(), pos.data(), inv.data(), N, heads, D);
  // cos/sin rounded to fp32 and two fp32 products + a sum: ~3 ulp of O(1).
  EXPECT_TRUE(expect_near("rope forward", y, rope_ref(x, pos, inv, N, heads, D), 1e-6, 1e-6));

  Vec dx = r;
  rt::cpu::rope_backward(dx.data(), pos.data(), inv.data(), N, heads, D);
  auto loss = [&] {
    Vec o = x;
    rt::cpu::rope_forward(o.data(), pos.data(), inv.data(), N, heads, D);
    return dot_d(o, r);
  };
  check_fd_grad("rope dx", x, dx, loss, 200);
}

// Partial rotary with a cos/sin scale (Phi3): x [N, heads, D], the first R
// dims rotate in rotate-half layout within [0, R), the rest pass through.
Vec rope_partial_ref(const Vec& x, const std::vector<int32_t>& pos, const Vec& inv, int64_t N, int64_t heads,
                     int64_t D, int64_t R, double scale) {
  Vec out = x;
  const int64_t half = R / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<float>(pos[n]) * inv[i];
        const int64_t base = (n * heads + h) * D;
        const double a = x[base + i], b = x[base + half + i], c = scale * std::cos(ang), sn = scale * std::sin(ang);
        out[base + i] = static_cast<float>(a * c - b * sn);
        out[base + half + i] = static_cast<float>(b * c + a * sn);
      }
  return out;
}

TEST(CpuRope, PartialRotaryScaledMatchesDirectRotationAndFiniteDifferences) {
  // head_dim 16, partial_rotary_factor 0.75: 12 dims rotate, 4 pass through; scale sqrt(2)
  const int64_t N = 5, heads = 3, D = 16, R = 12;
  const float scale = static_cast<float>(std::sqrt(2.0));
  const std::vector<int32_t> pos = {0, 1, 7, 33, 5000};
  rt::RopeConfig cfg;
  cfg.partial_rotary_factor = 0.75;
  const Vec inv = rt::cpu::rope_inv_freq(cfg, D);
  ASSERT_EQ(static_cast<int64_t>(inv.size()), R / 2);
  Vec x = random_vec(N * heads * D, 61), r = random_vec(N * heads * D, 62);
  Vec y = x;
  rt::cpu::rope_forward(y.data(), pos.data(), inv.data(), N, heads, D, R, scale);
  // cos/sin rounded to fp32, scaled (1 rounding) and two fp32 products + a sum: a few ulp of O(1)
  EXPECT_TRUE(expect_near("partial rope forward", y, rope_partial_ref(x, pos, inv, N, heads, D, R, scale), 2e-6, 2e-6));
  for (int64_t n = 0; n < N; ++n)  // the pass-through dims are copied bit for bit
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = R; d < D; ++d) ASSERT_EQ(y[(n * heads + h) * D + d], x[(n * heads + h) * D + d]);

  Vec dx = r;
  rt::cpu::rope_backward(dx.data(), pos.data(), inv.data(), N, heads, D, R, scale);
  auto loss = [&] {
    Vec o = x;
    rt::cpu::rope_forward(o.data(), pos.data(), inv.data(), N, heads, D, R, scale);
    return dot_d(o, r);
  };
  check_fd_grad("partial rope dx", x, dx, loss, 240);
}

TEST(CpuRope, LongRopeTablesDivideByTheFactorsAndSwitchAboveTheOriginalContext) {
  rt::ModelSpec s = rt::spec_preset("phi-4-mini");  // head_dim 128, 96 rotate
  s.rope.theta = 10000.0;
  s.rope.original_max_positions = 4096;
  for (size_t i = 0; i < s.rope.short_factor.size(); ++i) {
    s.rope.short_factor[i] = 1.0 + 0.1 * static_cast<double>(i);
    s.rope.long_factor[i] = 2.0 + 0.5 * static_cast<double>(i);
  }
  const rt::cpu::RopeTables t(s);
  ASSERT_EQ(t.rotary_dim, 96);
  ASSERT_EQ(t.inv_short.size(), 48u);
  ASSERT_EQ(t.inv_long.size(), 48u);
  Vec ref_s(48), ref_l(48);
  for (int64_t i = 0; i < 48; ++i) {
    const double f = std::pow(10000.0, -2.0 * static_cast<double>(i) / 96.0);
    ref_s[i] = static_cast<float>(f / s.rope.short_factor[i]);
    ref_l[i] = static_cast<float>(f / s.rope.long_factor[i]);
  }
  // fp32 pow, product and reciprocal: a few ulp (as the default case above)
  EXPECT_TRUE(expect_near("longrope short inv_freq", t.inv_short, ref_s, 0, 3e-6));
  EXPECT_TRUE(expect_near("longrope long inv_freq", t.inv_long, ref_l, 0, 3e-6));
  // transformers: long factors when max(position_ids) + 1 > original_max_position_embeddings
  const std::vector<int32_t> short_pos = {0, 4095, 17}, long_pos = {0, 4096, 3};
  EXPECT_FALSE(t.use_long(short_pos.data(), 3));
  EXPECT_TRUE(t.use_long(long_pos.data(), 3));
  EXPECT_EQ(t.select(long_pos.data(), 3), t.inv_long.data());
  // the attention factor transformers derives: sqrt(1 + ln(131072 / 4096) / ln 4096)
  EXPECT_FLOAT_EQ(t.scale, static_cast<float>(std::sqrt(1.0 + std::log(32.0) / std::log(4096.0))));
}

// ---------------------------------------------------------------- attention

struct AttnShape {
  int64_t B, T, H, G, D;
};

// Naive double reference: full [T, T] scores, causal mask (and the document
// mask: keys before doc_start[b,i] hidden), softmax.
void attention_ref(Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v, const AttnShape& s,
                   const int32_t* doc_start = nullptr) {
  const auto [B, T, H, G, D] = s;
  out.assign(static_cast<size_t>(B * T * H * D), 0.f);
  lse.assign(static_cast<size_t>(B * H * T), 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> sc(static_cast<size_t>(T), -INFINITY);
        const int64_t j0 = doc_start ? doc_start[b * T + i] : 0;
        double mx = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += static_cast<double>(q[((b * T + i) * H + h) * D + e]) * k[((b * T + j) * G + g) * D + e];
          sc[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (int64_t j = j0; j <= i; ++j) z += std::exp(sc[j] - mx);
        lse[(b * H + h) * T + i] = static_cast<float>(mx + std::log(z));
        for (int64_t e = 0; e < D; ++e) {
          double o = 0;
          for (int64_t j = j0; j <= i; ++j) o += std::exp(sc[j] - mx) / z * v[((b * T + j) * G + g) * D + e];
          out[((b * T + i) * H + h) * D + e] = static_cast<float>(o);
        }
      }
    }
}

// doc_start: packed documents [B*T] or empty (one document per sequence).
void attention_case(const AttnShape& s, uint64_t seed, const std::vector<int32_t>& docs = {}) {
  const auto [B, T, H, G, D] = s;
  const int32_t* doc = docs.empty() ? nullptr : docs.data();
  SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T << " H=" << H << " G=" << G << " D=" << D);
  Vec q = random_vec(B * T * H * D, seed, -2.f, 2.f);  // wider q: sharper softmax
  Vec k = random_vec(B * T * G * D, seed + 1), v = random_vec(B * T * G * D, seed + 2);
  Vec r = random_vec(B * T * H * D, seed + 3);
  Vec out(q.size(), kNaN), lse(static_cast<size_t>(B * H * T), kNaN);
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D, doc);
  Vec out_ref, lse_ref;
  attention_ref(out_ref, lse_ref, q, k, v, s, doc);
  // fp32 scores, exp and sums over <= 70 keys: a few 1e-7 relative on
  // lse ~ O(5) and on out (a convex combination of v in [-1, 1]).
  EXPECT_TRUE(expect_near("attention out", out, out_ref, 1e-5, 1e-5));
  EXPECT_TRUE(expect_near("attention lse", lse, lse_ref, 1e-5, 1e-5));

  Vec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);  // '=' outputs: prefilled garbage
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), B, T, H, G, D, doc);
  auto loss = [&] {
    Vec o(q.size()), l(lse.size());
    rt::cpu::attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), B, T, H, G, D, doc);
    return dot_d(o, r);
  };
  check_fd_grad("attention dq", q, dq, loss);
  check_fd_grad("attention dk", k, dk, loss);
  check_fd_grad("attention dv", v, dv, loss);
}

TEST(CpuAttention, MultiHead) { attention_case({2, 12, 4, 4, 8}, 61); }
TEST(CpuAttention, GroupedQuery) { attention_case({2, 12, 4, 2, 16}, 71); }
TEST(CpuAttention, MultiQuery) { attention_case({2, 9, 6, 1, 8}, 81); }
TEST(CpuAttention, LongerThanOneQueryBlock) { attention_case({1, 70, 2, 1, 8}, 91); }  // 64-row query blocks

// doc_start [B*T] of B sequences of length T packed with documents of the given
// lengths (per sequence; each list sums to T).
std::vector<int32_t> doc_starts(const std::vector<std::vector<int>>& lens, int64_t T) {
  std::vector<int32_t> d;
  for (const auto& seq : lens) {
    int32_t start = 0;
    for (int n : seq) {
      for (int i = 0; i < n; ++i) d.push_back(start);
      start += n;
    }
    EXPECT_EQ(start, T) << "document lengths must fill the sequence";
  }
  return d;
}

// against the double reference with the document mask, and finite differences
TEST(CpuAttention, PackedDocuments) {
  attention_case({2, 12, 4, 2, 8}, 101, doc_starts({{5, 1, 6}, {12}}, 12));
  attention_case({1, 70, 2, 1, 8}, 111, doc_starts({{33, 30, 7}}, 70));  // a boundary inside a query block
}

// Packed documents give each document exactly what it gets alone: the same
// operations on the same values in the same order, so bit-identical outputs
// and gradients (the reason packing with masking is safe to turn on).
TEST(CpuAttention, PackedEqualsSeparate) {
  const int64_t H = 4, G = 2, D = 8;
  const std::vector<int> lens = {7, 1, 12, 4};
  const int64_t T = 24;
  Vec q = random_vec(T * H * D, 121, -2.f, 2.f), k = random_vec(T * G * D, 122), v = random_vec(T * G * D, 123),
      r = random_vec(T * H * D, 124);
  const std::vector<int32_t> doc = doc_starts({lens}, T);
  Vec out(q.size()), lse(H * T), dq(q.size()), dk(k.size()), dv(v.size());
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, H, G, D, doc.data());
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), 1, T, H, G, D, doc.data());
  int64_t t0 = 0;
  for (int n : lens) {
    auto part = [&](const Vec& x, int64_t w) { return Vec(x.begin() + t0 * w, x.begin() + (t0 + n) * w); };
    Vec qs = part(q, H * D), ks = part(k, G * D), vs = part(v, G * D), rs = part(r, H * D);
    Vec o(qs.size()), l(H * n), gq(qs.size()), gk(ks.size()), gv(vs.size());
    rt::cpu::attention_forward(o.data(), l.data(), qs.data(), ks.data(), vs.data(), 1, n, H, G, D);
    rt::cpu::attention_backward(gq.data(), gk.data(), gv.data(), rs.data(), qs.data(), ks.data(), vs.data(), o.data(),
                                l.data(), 1, n, H, G, D);
    EXPECT_EQ(part(out, H * D), o) << "document at " << t0;
    EXPECT_EQ(part(dq, H * D), gq) << "document at " << t0;
    EXPECT_EQ(part(dk, G * D), gk) << "document at " << t0;
    EXPECT_EQ(part(dv, G * D), gv) << "document at " << t0;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < n; ++t) EXPECT_EQ(lse[h * T + t0 + t], l[h * n + t]) << "lse h=" << h << " t=" << t0 + t;
    t0 += n;
  }
}

TEST(CpuAttention, BadDocStartIsRefused) {
  const int64_t T = 4, H = 1, G = 1, D = 8;
  Vec q = random_vec(T * D, 131), k = random_vec(T * D, 132), v = random_vec(T * D, 133);
  Vec out(q.size()), lse(T);
  const std::vector<int32_t> gap = {0, 0, 1, 1};     // position 2 neither starts a document nor continues one
  const std::vector<int32_t> future = {0, 2, 2, 2};  // a start after the position
  for (const auto* d : {&gap, &future})
    EXPECT_THROW(
        rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, H, G, D, d->data()),
        rt::Error);
}

// ---------------------------------------------------------------- SwiGLU and add

TEST(CpuSwiglu, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 64;
  Vec gate = random_vec(n, 101, -4.f, 4.f), up = random_vec(n, 102), r = random_vec(n, 103);
  gate[0] = -100.f, gate[1] = 100.f, gate[2] = 0.f;  // saturated ends must stay finite
  Vec out(n, kNaN);
  rt::cpu::swiglu_forward(out.data(), gate.data(), up.data(), n);
  Vec ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = static_cast<float>(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]);
  // exp, divide and multiply in fp32: ~3 ulp.
  EXPECT_TRUE(expect_near("swiglu out", out, ref, 1e-6, 1e-6));

  Vec dgate(n, kNaN), dup(n, kNaN);
  rt::cpu::swiglu_backward(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dgate[i]) && std::isfinite(dup[i])) << i;
  auto loss = [&] {
    Vec o(n);
    rt::cpu::swiglu_forward(o.data(), gate.data(), up.data(), n);
    return dot_d(o, r);
  };
  check_fd_grad("swiglu dgate", gate, dgate, loss, 200);
  check_fd_grad("swiglu dup", up, dup, loss, 200);
}

TEST(CpuAdd, AddsInPlace) {
  Vec y = random_vec(100, 111), x = random_vec(100, 112), want(100);
  for (int i = 0; i < 100; ++i) want[i] = y[i] + x[i];
  rt::cpu::add_inplace(y.data(), x.data(), 100);
  expect_bitwise("add_inplace", y, want);
}

// ---------------------------------------------------------------- cross-entropy

struct CeCase {
  int64_t N = 11, C = 8, V = 13;
  Vec h, w;
  std::vector<int32_t> targets;
  explicit CeCase(uint64_t seed) : h(random_vec(N * C, seed)), w(random_vec(V * C, seed + 1)) {
    std::mt19937_64 g(seed + 2);
    for (int64_t n = 0; n < N; ++n) targets.push_back(static_cast<int32_t>(g() % V));
    targets[2] = targets[5] = targets[10] = -100;  // ignored, including the last row
  }
};

double ce_loss_ref(const CeCase& c, int64_t* n_valid) {
  double total = 0;
  *n_valid = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    if (c.targets[n] == -100) continue;
    std::vector<double> l(static_cast<size_t>(c.V));
    double mx = -INFINITY;
    for (int64_t v = 0; v < c.V; ++v) {
      double s = 0;
      for (int64_t k = 0; k < c.C; ++k) s += static_cast<double>(c.h[n * c.C + k]) * c.w[v * c.C + k];
      l[v] = s;
      mx = std::max(mx, s);
    }
    double z = 0;
    for (double x : l) z += std::exp(x - mx);
    total += mx + std::log(z) - l[c.targets[n]];
    ++*n_valid;
  }
  return total;
}

// The absolute twins of the cross-entropy gradients (testutil.h,
// expect_regrouped): dh = D W (V-term sums) and dw = D^T H (N-term sums), with
// D = scale (softmax(H W^T) - onehot) on valid rows, 0 on ignored ones. The
// chunkings under comparison may also round the logits differently (their
// C-term GEMM blocking): |dz| <= 2 C u max_nv sum_k |h_nk w_vk| =: e, which
// moves each softmax p_nv by at most 2 p_nv e, i.e. D by 2 scale p_nv e. With
// c = 2, the twin carries that as an extra (2 scale p e) / (2 K u) per term,
// K being the length of the sum it feeds.
struct CeTwins {
  std::vector<double> dh, dw;
};
CeTwins ce_twins(const CeCase& c, float scale) {
  const double u = rt::test::kFp32Unit;
  std::vector<double> P(static_cast<size_t>(c.N * c.V), 0.0), A(P.size(), 0.0);  // p, |D|
  double zt = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    std::vector<double> l(static_cast<size_t>(c.V));
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < c.V; ++v) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < c.C; ++k) {
        s += static_cast<double>(c.h[n * c.C + k]) * c.w[v * c.C + k];
        a += std::fabs(static_cast<double>(c.h[n * c.C + k]) * c.w[v * c.C + k]);
      }
      l[v] = s;
      mx = std::max(mx, s);
      zt = std::max(zt, a);
    }
    for (double x : l) z += std::exp(x - mx);
    if (c.targets[n] == -100) continue;
    for (int64_t v = 0; v < c.V; ++v) {
      const double p = std::exp(l[v] - mx) / z;
      P[n * c.V + v] = scale * p;
      A[n * c.V + v] = scale * std::fabs(p - (v == c.targets[n] ? 1.0 : 0.0));
    }
  }
  const double e = 2.0 * c.C * u * zt;  // bound on a logit's change
  CeTwins t{std::vector<double>(c.h.size(), 0.0), std::vector<double>(c.w.size(), 0.0)};
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t v = 0; v < c.V; ++v) {
      const double a = A[n * c.V + v], pe = 2.0 * P[n * c.V + v] * e;
      for (int64_t k = 0; k < c.C; ++k) {
        t.dh[n * c.C + k] += (a + pe / (2.0 * c.V * u)) * std::fabs(c.w[v * c.C + k]);
        t.dw[v * c.C + k] += (a + pe / (2.0 * c.N * u)) * std::fabs(c.h[n * c.C + k]);
      }
    }
  return t;
}

TEST(CpuCrossEntropy, LossMatchesDoubleReferenceForEveryChunkSize) {
  CeCase c(121);
  int64_t nv_ref = 0;
  const double ref = ce_loss_ref(c, &nv_ref);
  ASSERT_EQ(nv_ref, 8);
  int64_t nv = -1;
  const double full = rt::cpu::lm_head_cross_entropy(nullptr, nullptr, c.h.data(), c.w.data(), c.targets.data(), c.N,
                                                     c.C, c.V, 1.f, c.N, &nv);
  EXPECT_EQ(nv, 8);
  // fp32 logits (8-term dot products, ~1e-7 abs) and fp32 exp: ~1e-6 relative on a sum of 8 losses.
  EXPECT_NEAR(full, ref, 1e-5 * std::fabs(ref));
  for (int64_t chunk : {1, 3, 4, 64}) {
    nv = -1;
    const double l = rt::cpu::lm_head_cross_entropy(nullptr, nullptr, c.h.data(), c.w.data(), c.targets.data(), c.N,
                                                    c.C, c.V, 1.f, chunk, &nv);
    EXPECT_EQ(nv, 8) << "chunk " << chunk;
    // Same math; only GEMM blocking of the logits can change the last bits.
    EXPECT_NEAR(l, full, 1e-6 * std::fabs(full)) << "chunk " << chunk;
  }
}

TEST(CpuCrossEntropy, GradientsMatchFiniteDifferencesWithIgnoredRows) {
  CeCase c(131);
  const float scale = 1.f / 8.f;  // 1 / n_valid, as a mean loss would use
  const int64_t chunk = 4;        // does not divide N = 11
  Vec dh(c.h.size(), kNaN), dw(c.w.size(), 0.f);
  int64_t nv = 0;
  const double loss0 = rt::cpu::lm_head_cross_entropy(dh.data(), dw.data(), c.h.data(), c.w.data(), c.targets.data(),
                                                      c.N, c.C, c.V, scale, chunk, &nv);
  // Gradients do not change the loss value.
  EXPECT_EQ(loss0, rt::cpu::lm_head_cross_entropy(nullptr, nullptr, c.h.data(), c.w.data(), c.targets.data(), c.N, c.C,
                                                  c.V, scale, chunk, &nv));
  for (int64_t n : {2, 5, 10})
    for (int64_t k = 0; k < c.C; ++k) EXPECT_EQ(dh[n * c.C + k], 0.f) << "ignored row " << n;
  auto loss = [&] {
    int64_t v = 0;
    return scale * rt::cpu::lm_head_cross_entropy(nullptr, nullptr, c.h.data(), c.w.data(), c.targets.data(), c.N, c.C,
                                                  c.V, scale, chunk, &v);
  };
  check_fd_grad("cross_entropy dh", c.h, dh, loss, 200);
  check_fd_grad("cross_entropy dw", c.w, dw, loss, 200);

  // Other chunkings give the same gradients up to regrouping: the V-term sums
  // of dh, the N-term token sums of dw (per chunk, then across chunks), and
  // the logits' GEMM blocking, each bounded through its absolute twin.
  const CeTwins tw = ce_twins(c, scale);
  for (int64_t other : {1, 11}) {
    Vec dh2(c.h.size(), kNaN), dw2(c.w.size(), 0.f);
    rt::cpu::lm_head_cross_entropy(dh2.data(), dw2.data(), c.h.data(), c.w.data(), c.targets.data(), c.N, c.C, c.V,
                                   scale, other, &nv);
    EXPECT_TRUE(rt::test::expect_regrouped("dh chunk " + std::to_string(other), dh2, dh, tw.dh, c.V));
    EXPECT_TRUE(rt::test::expect_regrouped("dw chunk " + std::to_string(other), dw2, dw, tw.dw, c.N));
  }

  // '+=' with several chunks: dw receives one += per chunk, so a second call
  // adds the same 3 per-chunk terms onto a different base: 2x up to the order
  // of 6 identical partial sums, whose absolute values add up to at most
  // 2 twin (hence c = 4, K = 6). dh is rewritten ('='), bit for bit.
  Vec dw_once = dw, dh_once = dh;
  rt::cpu::lm_head_cross_entropy(dh.data(), dw.data(), c.h.data(), c.w.data(), c.targets.data(), c.N, c.C, c.V, scale,
                                 chunk, &nv);
  EXPECT_TRUE(rt::test::expect_regrouped("cross_entropy dw twice (3 chunks)", dw, doubled(dw_once), tw.dw, 6, 4));
  expect_bitwise("cross_entropy dh twice", dh, dh_once);
  // With one chunk there is a single += per call, so dw doubles exactly.
  Vec dw1(c.w.size(), 0.f);
  rt::cpu::lm_head_cross_entropy(nullptr, dw1.data(), c.h.data(), c.w.data(), c.targets.data(), c.N, c.C, c.V, scale,
                                 c.N, &nv);
  dw_once = dw1;
  rt::cpu::lm_head_cross_entropy(nullptr, dw1.data(), c.h.data(), c.w.data(), c.targets.data(), c.N, c.C, c.V, scale,
                                 c.N, &nv);
  expect_bitwise("cross_entropy dw twice (1 chunk)", dw1, doubled(dw_once));
}

TEST(CpuCrossEntropy, RejectsOutOfRangeTargets) {
  CeCase c(141);
  for (int32_t bad : {13, 14, -1, -101}) {
    auto t = c.targets;
    t[7] = bad;
    int64_t nv = 0;
    EXPECT_THROW(
        rt::cpu::lm_head_cross_entropy(nullptr, nullptr, c.h.data(), c.w.data(), t.data(), c.N, c.C, c.V, 1.f, 4, &nv),
        rt::Error)
        << "target " << bad;
  }
}

// ---------------------------------------------------------------- determinism

struct DeterminismOutputs {
  std::vector<Vec> tensors;
  double loss = 0;
};

DeterminismOutputs run_all_ops() {
  DeterminismOutputs r;
  {  // GEMMs over several 64-row blocks, both betas
    const int64_t M = 200, N = 50, K = 90;
    Vec a = random_vec(M * K, 201), b = random_vec(N * K, 202);
    for (Mm mode : {Mm::nt, Mm::nn, Mm::tn})
      for (float beta : {0.f, 1.f}) {
        Vec out = random_vec(M * N, 203);
        matmul_call(mode, out, a, b, M, N, K, beta);
        r.tensors.push_back(out);
      }
  }
  {  // attention forward + backward, GQA, two query blocks
    const int64_t B = 2, T = 80, H = 4, G = 2, D = 16;
    Vec q = random_vec(B * T * H * D, 211), k = random_vec(B * T * G * D, 212), v = random_vec(B * T * G * D, 213);
    Vec dout = random_vec(B * T * H * D, 214);
    Vec out(q.size()), lse(static_cast<size_t>(B * H * T)), dq(q.size()), dk(k.size()), dv(v.size());
    rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D);
    rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                                lse.data(), B, T, H, G, D);
    for (Vec* t : {&out, &lse, &dq, &dk, &dv}) r.tensors.push_back(*t);
  }
  {  // cross-entropy with gradients
    const int64_t N = 100, C = 16, V = 50;
    Vec h = random_vec(N * C, 221), w = random_vec(V * C, 222);
    std::vector<int32_t> t(N);
    for (int64_t n = 0; n < N; ++n) t[n] = n % 9 == 0 ? -100 : static_cast<int32_t>((n * 7) % V);
    Vec dh(h.size()), dw(w.size(), 0.f);
    int64_t nv = 0;
    r.loss =
        rt::cpu::lm_head_cross_entropy(dh.data(), dw.data(), h.data(), w.data(), t.data(), N, C, V, 0.01f, 37, &nv);
    r.tensors.push_back(dh);
    r.tensors.push_back(dw);
  }
  {  // row and column reductions: RMSNorm and embedding backward
    const int64_t N = 100, C = 80;
    Vec x = random_vec(N * C, 231), w = random_vec(C, 232), dout = random_vec(N * C, 233);
    Vec out(x.size()), rstd(N), dx(x.size()), dw(C, 0.f), dtable(10 * C, 0.f);
    std::vector<int32_t> ids(N);
    for (int64_t n = 0; n < N; ++n) ids[n] = static_cast<int32_t>((n * 3) % 10);
    rt::cpu::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    rt::cpu::rms_norm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    rt::cpu::embedding_backward(dtable.data(), dout.data(), ids.data(), N, C);
    for (Vec* t : {&out, &rstd, &dx, &dw, &dtable}) r.tensors.push_back(*t);
  }
  return r;
}

// Many concurrent sgemm blocks must all equal the single-threaded result. This
// is a stress check for races (Debian's USE_THREAD=0 OpenBLAS is not safe for
// concurrent callers; cpu/blas.h serialises its calls). It is probabilistic:
// with the lock removed it failed in about 1 of 5 runs on the 2-core dev
// machine, so a pass does not prove safety, but a failure always means a bug.
TEST(CpuOpsDeterminism, ConcurrentGemmBlocksAreCorrect) {
  const int64_t M = 640, N = 96, K = 96;  // 10 row blocks per call
  Vec a = random_vec(M * K, 241), b = random_vec(N * K, 242);
  Vec want(static_cast<size_t>(M * N)), got(want.size());
  rt::set_global_threads(1);
  rt::cpu::matmul_nt(want.data(), a.data(), b.data(), M, N, K);
  rt::set_global_threads(3);
  int n_bad = 0;
  for (int it = 0; it < 1000; ++it) {
    rt::cpu::matmul_nt(got.data(), a.data(), b.data(), M, N, K);
    n_bad += std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0;
  }
  rt::set_global_threads(0);
  EXPECT_EQ(n_bad, 0) << "of 1000 multi-threaded GEMMs differed from the single-threaded result";
}

TEST(CpuOpsDeterminism, OneAndThreeThreadsGiveBitIdenticalResults) {
  rt::set_global_threads(1);
  const DeterminismOutputs a = run_all_ops();
  rt::set_global_threads(3);
  const DeterminismOutputs b = run_all_ops();
  const DeterminismOutputs c = run_all_ops();  // and run to run
  rt::set_global_threads(0);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    expect_bitwise("tensor " + std::to_string(i) + " (1 vs 3 threads)", a.tensors[i], b.tensors[i]);
    expect_bitwise("tensor " + std::to_string(i) + " (run to run)", b.tensors[i], c.tensors[i]);
  }
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << a.loss << " vs " << b.loss;
  EXPECT_EQ(std::memcmp(&b.loss, &c.loss, sizeof(double)), 0);
}

}  // namespace
