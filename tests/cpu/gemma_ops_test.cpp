// The CPU ops Gemma adds (cpu/ops.h): the (1 + w) RMSNorm offset, GeGLU with
// gelu's tanh approximation, sliding-window and soft-capped attention, the
// soft-capped LM head + cross-entropy and linear RoPE scaling. Each forward
// against a double reference, each backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "cpu/ops.h"
#include "testutil.h"

namespace {

using rt::test::dot_d;
using rt::test::expect_near;
using rt::test::random_vec;
using Vec = std::vector<float>;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// rt::test::check_fd_grad (step 1e-2, atol 2e-3, rtol 2e-2), sampling 80.
void check_grad(const std::string& name, Vec& x, const Vec& analytic, const std::function<double()>& loss,
                int64_t max_samples = 80, uint64_t seed = 7) {
  rt::test::check_fd_grad(name, x, analytic, loss, max_samples, seed);
}

TEST(CpuGemmaNorm, OffsetNormIsTheNormOfOnePlusW) {
  const int64_t N = 5, C = 16;
  const float eps = 1e-6f;
  Vec x = random_vec(N * C, 1), w = random_vec(C, 2, -0.5f, 0.5f), r = random_vec(N * C, 3);
  Vec w1(w);
  for (auto& v : w1) v += 1.f;
  Vec out(N * C, kNaN), rstd(N, kNaN), out1(N * C, kNaN), rstd1(N, kNaN);
  rt::cpu::rms_norm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps, 1.f);
  rt::cpu::rms_norm_forward(out1.data(), rstd1.data(), x.data(), w1.data(), N, C, eps);
  // (1 + w) rounded once to fp32 either way: the same products, bit for bit.
  EXPECT_EQ(out, out1);
  Vec dx(N * C, kNaN), dw(C, 0.f);
  rt::cpu::rms_norm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C, 1.f);
  auto loss = [&] {
    Vec o(N * C), s(N);
    rt::cpu::rms_norm_forward(o.data(), s.data(), x.data(), w.data(), N, C, eps, 1.f);
    return dot_d(o, r);
  };
  check_grad("offset rms_norm dx", x, dx, loss);
  check_grad("offset rms_norm dw", w, dw, loss);
}

TEST(CpuGeglu, ForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 96;
  Vec gate = random_vec(n, 11, -4.f, 4.f), up = random_vec(n, 12), r = random_vec(n, 13);
  gate[0] = -30.f, gate[1] = 30.f, gate[2] = 0.f;  // saturated ends stay finite
  Vec out(n, kNaN);
  rt::cpu::geglu_forward(out.data(), gate.data(), up.data(), n);
  Vec ref(n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    ref[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * up[i]);
  }
  // tanh and a few products in fp32 on values of size <= 4: a few ulp of 4.
  EXPECT_TRUE(expect_near("geglu out", out, ref, 2e-6, 2e-6));
  Vec dg(n, kNaN), du(n, kNaN);
  rt::cpu::geglu_backward(dg.data(), du.data(), r.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << i;
  auto loss = [&] {
    Vec o(n);
    rt::cpu::geglu_forward(o.data(), gate.data(), up.data(), n);
    return dot_d(o, r);
  };
  check_grad("geglu dgate", gate, dg, loss, 200);
  check_grad("geglu dup", up, du, loss, 200);
}

// Double reference of windowed, soft-capped causal attention (scale 1/sqrt(D)).
void attention_ref(Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H,
                   int64_t G, int64_t D, int64_t window, double cap) {
  out.assign(static_cast<size_t>(B * T * H * D), 0.f);
  lse.assign(static_cast<size_t>(B * H * T), 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> sc(static_cast<size_t>(T), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          if (window > 0 && j <= i - window) continue;  // HF: kv_idx > q_idx - sliding_window
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += static_cast<double>(q[((b * T + i) * H + h) * D + e]) * k[((b * T + j) * G + g) * D + e];
          d /= std::sqrt(static_cast<double>(D));
          sc[j] = cap > 0 ? cap * std::tanh(d / cap) : d;
          mx = std::max(mx, sc[j]);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::isinf(sc[j]) ? 0.0 : std::exp(sc[j] - mx);
        lse[(b * H + h) * T + i] = static_cast<float>(mx + std::log(z));
        for (int64_t e = 0; e < D; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            if (!std::isinf(sc[j])) o += std::exp(sc[j] - mx) / z * v[((b * T + j) * G + g) * D + e];
          out[((b * T + i) * H + h) * D + e] = static_cast<float>(o);
        }
      }
    }
}

void window_case(int64_t window, float cap, uint64_t seed) {
  const int64_t B = 2, T = 13, H = 4, G = 2, D = 8;
  SCOPED_TRACE(::testing::Message() << "window " << window << " softcap " << cap);
  Vec q = random_vec(B * T * H * D, seed, -2.f, 2.f), k = random_vec(B * T * G * D, seed + 1),
      v = random_vec(B * T * G * D, seed + 2), r = random_vec(B * T * H * D, seed + 3);
  Vec out(q.size(), kNaN), lse(B * H * T, kNaN);
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, cap);
  Vec out_ref, lse_ref;
  attention_ref(out_ref, lse_ref, q, k, v, B, T, H, G, D, window, cap);
  // fp32 scores, tanh, exp and sums over <= 13 keys: a few 1e-7 relative.
  EXPECT_TRUE(expect_near("attention out", out, out_ref, 1e-5, 1e-5));
  EXPECT_TRUE(expect_near("attention lse", lse, lse_ref, 1e-5, 1e-5));
  // The window must matter: the same inputs without it give another output.
  if (window > 0) {
    Vec full(q.size()), l2(lse.size());
    rt::cpu::attention_forward(full.data(), l2.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, 0, cap);
    EXPECT_NE(full, out);
  }
  Vec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), B, T, H, G, D, nullptr, window, cap);
  auto loss = [&] {
    Vec o(q.size()), l(lse.size());
    rt::cpu::attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, cap);
    return dot_d(o, r);
  };
  check_grad("attention dq", q, dq, loss);
  check_grad("attention dk", k, dk, loss);
  check_grad("attention dv", v, dv, loss);
}

// The soft cap as the fused CUDA kernels compute it (cuda/attention/softmax.cuh
// softcap_scores, softcap_dp_*, dscores_capped; constants from attention.cu's
// shape_make), in float, against the CPU reference: raw scores z = q.k become
// z' = K - 2K / (1 + 2^(z * 2 log2(e) / K)) = K tanh(z / K), K = cap sqrt(D);
// the softmax runs on z' in raw units (p = 2^(z' c - m c), c = log2(e) /
// sqrt(D); lse = m / sqrt(D) + log(sum p)); the backward is P = 2^(z' c -
// lse log2(e)), dp = (dP - D_t)(1 - (z'/K)^2), dS = P dp, dq = dS K / sqrt(D),
// dk = dS^T Q / sqrt(D), dv = P^T dO. Scores from moderate to far past the
// cap (2^(z a2) = inf there: z' = K exactly). Tolerances: fp32 against fp32
// over <= 13 keys (as window_case: 1e-5); dropping the 1 - tanh^2 factor
// (the check can fail) moves dq by far more.
void softcap_kernel_algebra_case(int64_t window, float cap, float q_range, uint64_t seed) {
  const int64_t B = 2, T = 13, H = 4, G = 2, D = 8;
  SCOPED_TRACE(::testing::Message() << "window " << window << " softcap " << cap << " q +-" << q_range);
  Vec q = random_vec(B * T * H * D, seed, -q_range, q_range), k = random_vec(B * T * G * D, seed + 1),
      v = random_vec(B * T * G * D, seed + 2), r = random_vec(B * T * H * D, seed + 3);
  Vec out(q.size()), lse(B * H * T), dq(q.size()), dk(k.size()), dv(v.size());
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, cap);
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), B, T, H, G, D, nullptr, window, cap);
  const float scale = 1.f / std::sqrt(static_cast<float>(D)), c = scale * 1.4426950408889634f;
  const double Kd = static_cast<double>(cap) * std::sqrt(static_cast<double>(D));
  const float K = static_cast<float>(Kd), m2k = static_cast<float>(-2.0 * Kd),
              a2 = static_cast<float>(2.0 * 1.4426950408889634 / Kd), inv_k = static_cast<float>(1.0 / Kd);
  Vec kout(q.size()), klse(lse.size()), kdq(q.size(), 0.f), kdk(k.size(), 0.f), kdv(v.size(), 0.f), nodq(q.size(), 0.f);
  int64_t saturated = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t qr = ((b * T + t) * H + h) * D, li = (b * H + h) * T + t;
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        std::vector<float> zc(static_cast<size_t>(T), 0.f);
        float m = -INFINITY;
        for (int64_t j = j0; j <= t; ++j) {
          float z = 0.f;
          for (int64_t e = 0; e < D; ++e) z += q[qr + e] * k[((b * T + j) * G + g) * D + e];
          const float x = std::exp2(z * a2);
          saturated += std::isinf(x) || x == 0.f;
          zc[j] = std::fma(m2k, 1.f / (1.f + x), K);
          m = std::max(m, zc[j]);
        }
        float l = 0.f;
        for (int64_t j = j0; j <= t; ++j) l += std::exp2(zc[j] * c - m * c);
        klse[li] = m * scale + std::log(l);
        for (int64_t e = 0; e < D; ++e) {
          float o = 0.f;
          for (int64_t j = j0; j <= t; ++j) o += std::exp2(zc[j] * c - m * c) * v[((b * T + j) * G + g) * D + e];
          kout[qr + e] = o / l;
        }
        float dt = 0.f;  // D_t = rowsum(dO * out), from the reference's out as the kernels read theirs
        for (int64_t e = 0; e < D; ++e) dt += r[qr + e] * out[qr + e];
        const float lse2 = lse[li] * 1.4426950408889634f;
        for (int64_t j = j0; j <= t; ++j) {
          const int64_t kr = ((b * T + j) * G + g) * D;
          float dp = 0.f;
          for (int64_t e = 0; e < D; ++e) dp += r[qr + e] * v[kr + e];
          const float p = std::exp2(zc[j] * c - lse2), tt = zc[j] * inv_k;
          const float ds = p * ((dp - dt) * std::fma(-tt, tt, 1.f)), ds_free = p * (dp - dt);
          for (int64_t e = 0; e < D; ++e) {
            kdq[qr + e] += ds * k[kr + e] * scale;
            nodq[qr + e] += ds_free * k[kr + e] * scale;
            kdk[kr + e] += ds * q[qr + e] * scale;
            kdv[kr + e] += p * r[qr + e];
          }
        }
      }
    }
  EXPECT_TRUE(expect_near("kernel algebra lse", klse, lse, 1e-5, 1e-5));
  EXPECT_TRUE(expect_near("kernel algebra out", kout, out, 1e-5, 1e-5));
  const auto rel = [](const Vec& a, const Vec& b) {
    return rt::test::rel_l2(a.data(), b.data(), static_cast<int64_t>(a.size()));
  };
  EXPECT_LE(rel(kdq, dq), 1e-5) << "dq";
  EXPECT_LE(rel(kdk, dk), 1e-5) << "dk";
  EXPECT_LE(rel(kdv, dv), 1e-5) << "dv";
  EXPECT_GT(rel(nodq, dq), 1e-2) << "the 1 - tanh^2 factor must matter";
  if (q_range > 4 * cap) {
    EXPECT_GT(saturated, 0) << "no score reached exp2's overflow or underflow";
  }
}

TEST(CpuGemmaAttention, SoftCapAsTheFusedCudaKernelsComputeIt) {
  softcap_kernel_algebra_case(0, 1.5f, 2.f, 51);    // scores up to ~4: the cap bites
  softcap_kernel_algebra_case(5, 5.f, 20.f, 61);    // |s| up to several c
  softcap_kernel_algebra_case(0, 0.5f, 200.f, 71);  // far past the cap: 2^(z a2) overflows and underflows
}

TEST(CpuGemmaAttention, SlidingWindow) { window_case(4, 0.f, 21); }
TEST(CpuGemmaAttention, SoftCap) { window_case(0, 1.5f, 31); }  // scores up to ~4: the cap bites
TEST(CpuGemmaAttention, SlidingWindowAndSoftCap) { window_case(5, 2.f, 41); }
TEST(CpuGemmaAttention, WindowOfOneSeesItselfOnly) {
  const int64_t T = 6, D = 8;
  Vec q = random_vec(T * D, 51), k = random_vec(T * D, 52), v = random_vec(T * D, 53);
  Vec out(T * D), lse(T);
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), 1, T, 1, 1, D, nullptr, 1);
  EXPECT_EQ(out, v);
}

TEST(CpuGemmaCrossEntropy, SoftCappedLogitsMatchDoubleAndFiniteDifferences) {
  const int64_t N = 7, C = 8, V = 11;
  const float cap = 1.5f;  // logits of size ~2-3: well into the tanh's bend
  Vec h = random_vec(N * C, 61, -1.f, 1.f), w = random_vec(V * C, 62, -1.f, 1.f);
  std::vector<int32_t> targets = {3, 0, -100, 10, 5, 5, 1};
  double ref = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    std::vector<double> l(V);
    double mx = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += static_cast<double>(h[n * C + c]) * w[v * C + c];
      l[v] = cap * std::tanh(s / cap);
      mx = std::max(mx, l[v]);
    }
    for (double x : l) z += std::exp(x - mx);
    ref += mx + std::log(z) - l[targets[n]];
  }
  int64_t nv = 0;
  Vec dh(N * C, kNaN), dw(V * C, 0.f);
  const double loss = rt::cpu::lm_head_cross_entropy(dh.data(), dw.data(), h.data(), w.data(), targets.data(), N, C,
                                                     V, 1.f, 3, &nv, cap);
  EXPECT_EQ(nv, 6);
  // fp32 logits and tanh on values of size O(1), summed over 6 rows: ~1e-6 relative.
  EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
  const double plain =
      rt::cpu::lm_head_cross_entropy(nullptr, nullptr, h.data(), w.data(), targets.data(), N, C, V, 1.f, 3, &nv);
  EXPECT_GT(std::fabs(plain - loss), 1e-2) << "the cap must change the loss for this test to mean anything";
  auto f = [&] {
    int64_t v = 0;
    return rt::cpu::lm_head_cross_entropy(nullptr, nullptr, h.data(), w.data(), targets.data(), N, C, V, 1.f, 3, &v,
                                          cap);
  };
  check_grad("softcapped cross_entropy dh", h, dh, f, 200);
  check_grad("softcapped cross_entropy dw", w, dw, f, 200);
}

TEST(CpuGemmaRope, LinearScalingDividesInvFreqByTheFactor) {
  rt::RopeConfig plain;
  plain.theta = 10000.0;
  rt::RopeConfig lin = plain;
  lin.scaling = rt::RopeScaling::linear;
  lin.factor = 8.0;
  const auto a = rt::cpu::rope_inv_freq(plain, 16), b = rt::cpu::rope_inv_freq(lin, 16);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i], a[i] / 8.f) << i;  // HF: inv_freq /= factor in fp32
}

}  // namespace
