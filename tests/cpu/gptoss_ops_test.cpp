// The CPU ops gpt-oss adds (cpu/ops.h, cpu/moe.h): attention sinks (with a
// sliding window), the clamped SwiGLU, and the MoE variant (router bias,
// softmax over the top-k logits, expert biases, the clamped SwiGLU). Each
// forward against a double reference, each backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "cpu/moe.h"
#include "cpu/ops.h"
#include "testutil.h"

namespace {

using rt::test::dot_d;
using rt::test::expect_near;
using rt::test::random_vec;
using Vec = std::vector<float>;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Double reference of windowed causal attention with a sink logit per head.
void sink_attention_ref(Vec& out, Vec& lse, const Vec& q, const Vec& k, const Vec& v, const Vec& sinks, int64_t B,
                        int64_t T, int64_t H, int64_t G, int64_t D, int64_t window) {
  out.assign(static_cast<size_t>(B * T * H * D), 0.f);
  lse.assign(static_cast<size_t>(B * H * T), 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        std::vector<double> sc(static_cast<size_t>(T), 0.0);
        double mx = sinks[h];
        for (int64_t j = j0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += static_cast<double>(q[((b * T + i) * H + h) * D + e]) * k[((b * T + j) * G + g) * D + e];
          sc[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[j]);
        }
        double z = std::exp(sinks[h] - mx);
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

// The sink tests' inputs at B = 2, T = 11, H = 4, G = 2, D = 8: q in +-2, sinks
// from -1 to 3 (from barely there to taking most of a row's weight), r the
// output's cotangent.
struct SinkInputs {
  Vec q, k, v, r, sinks;
};
SinkInputs sink_inputs(uint64_t seed) {
  const int64_t B = 2, T = 11, H = 4, G = 2, D = 8;
  return {random_vec(B * T * H * D, seed, -2.f, 2.f), random_vec(B * T * G * D, seed + 1),
          random_vec(B * T * G * D, seed + 2), random_vec(B * T * H * D, seed + 3), random_vec(H, seed + 4, -1.f, 3.f)};
}

void sink_case(int64_t window, uint64_t seed) {
  const int64_t B = 2, T = 11, H = 4, G = 2, D = 8;
  SCOPED_TRACE(::testing::Message() << "window " << window);
  auto [q, k, v, r, sinks] = sink_inputs(seed);
  Vec out(q.size(), kNaN), lse(B * H * T, kNaN);
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, 0.f,
                             sinks.data());
  Vec out_ref, lse_ref;
  sink_attention_ref(out_ref, lse_ref, q, k, v, sinks, B, T, H, G, D, window);
  // fp32 scores, exp and sums over <= 11 keys and the sink: a few 1e-7 relative.
  EXPECT_TRUE(expect_near("sink attention out", out, out_ref, 1e-5, 1e-5));
  EXPECT_TRUE(expect_near("sink attention lse", lse, lse_ref, 1e-5, 1e-5));
  {  // the sinks must matter: without them the output differs
    Vec plain(q.size()), l2(lse.size());
    rt::cpu::attention_forward(plain.data(), l2.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window);
    EXPECT_GT(rt::test::rel_l2(plain.data(), out.data(), static_cast<int64_t>(out.size())), 1e-2);
  }
  Vec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN), dsinks(H, 0.5f);
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), B, T, H, G, D, nullptr, window, 0.f, sinks.data(), dsinks.data());
  for (auto& x : dsinks) x -= 0.5f;  // '+=' onto 0.5
  auto loss = [&] {
    Vec o(q.size()), l(lse.size());
    rt::cpu::attention_forward(o.data(), l.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, 0.f,
                               sinks.data());
    return dot_d(o, r);
  };
  rt::test::check_fd_grad("sink attention dq", q, dq, loss, 80);
  rt::test::check_fd_grad("sink attention dk", k, dk, loss, 80);
  rt::test::check_fd_grad("sink attention dv", v, dv, loss, 80);
  rt::test::check_fd_grad("sink attention dsinks", sinks, dsinks, loss, 80);
}

TEST(CpuGptOssAttention, Sinks) { sink_case(0, 71); }
TEST(CpuGptOssAttention, SinksAndSlidingWindow) { sink_case(4, 81); }

// The flash-style backward the fused CUDA kernels run, in double, from the
// forward's lse and out only: P = exp(s - lse), D_t = rowsum(dO * out),
// dS = P (dP - D_t), dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, and
// d sink[h] = -sum_t exp(sink_h - lse_t) D_t (sinks nullable).
void flash_backward_ref(Vec& dq, Vec& dk, Vec& dv, Vec& dsinks, const Vec& dout, const Vec& q, const Vec& k,
                        const Vec& v, const Vec& out, const Vec& lse, const float* sinks, int64_t B, int64_t T,
                        int64_t H, int64_t G, int64_t D, int64_t window) {
  std::vector<double> gq(q.size(), 0.0), gk(k.size(), 0.0), gv(v.size(), 0.0), gs(static_cast<size_t>(H), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t qr = ((b * T + t) * H + h) * D;
        const double l = lse[(b * H + h) * T + t];
        double dt = 0;
        for (int64_t e = 0; e < D; ++e) dt += static_cast<double>(dout[qr + e]) * out[qr + e];
        if (sinks) gs[h] -= std::exp(sinks[h] - l) * dt;
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        for (int64_t j = j0; j <= t; ++j) {
          const int64_t kr = ((b * T + j) * G + g) * D;
          double s = 0, dp = 0;
          for (int64_t e = 0; e < D; ++e) {
            s += static_cast<double>(q[qr + e]) * k[kr + e];
            dp += static_cast<double>(dout[qr + e]) * v[kr + e];
          }
          const double p = std::exp(s * scale - l), ds = p * (dp - dt);
          for (int64_t e = 0; e < D; ++e) {
            gq[qr + e] += scale * ds * k[kr + e];
            gk[kr + e] += scale * ds * q[qr + e];
            gv[kr + e] += p * dout[qr + e];
          }
        }
      }
    }
  dq.assign(gq.begin(), gq.end());
  dk.assign(gk.begin(), gk.end());
  dv.assign(gv.begin(), gv.end());
  dsinks.assign(gs.begin(), gs.end());
}

// What the fused CUDA kernels do with gpt-oss's sinks (cuda/attention/
// softmax.cuh softmax_row_finish, attention/sinks.h), checked against the
// CPU reference: (1) the forward without sinks, then lse' = logaddexp(lse,
// sink) and out' = out * exp(lse - lse'), is the forward with sinks; (2) the
// plain flash backward on that lse' and out' gives the reference's dq, dk, dv
// and, with one more per-head sum, its d sink. Tolerances: fp32 against
// double over <= 11 keys of scores up to ~4 (the sink test's 1e-5 for out and
// lse; norm-wise 1e-5 for the gradients, a few 1e-7 expected), while leaving
// the sink out of lse moves P by the sink's share (up to ~0.9 of a row).
void sink_fold_case(int64_t window, uint64_t seed) {
  const int64_t B = 2, T = 11, H = 4, G = 2, D = 8;
  SCOPED_TRACE(::testing::Message() << "window " << window);
  auto [q, k, v, r, sinks] = sink_inputs(seed);
  Vec out(q.size()), lse(B * H * T), out0(q.size()), lse0(B * H * T);
  rt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window, 0.f,
                             sinks.data());
  rt::cpu::attention_forward(out0.data(), lse0.data(), q.data(), k.data(), v.data(), B, T, H, G, D, nullptr, window);
  Vec out_f(q.size()), lse_f(lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t li = (b * H + h) * T + t;
        const double l = lse0[li], sk = sinks[h], m = std::max(l, sk);
        const double lf = m + std::log(std::exp(l - m) + std::exp(sk - m));
        lse_f[li] = static_cast<float>(lf);
        for (int64_t e = 0; e < D; ++e) {
          const int64_t i = ((b * T + t) * H + h) * D + e;
          out_f[i] = static_cast<float>(out0[i] * std::exp(l - lf));
        }
      }
  EXPECT_TRUE(expect_near("folded sink lse", lse_f, lse, 1e-5, 1e-5));
  EXPECT_TRUE(expect_near("folded sink out", out_f, out, 1e-5, 1e-5));

  Vec dq(q.size()), dk(k.size()), dv(v.size()), dsinks(H, 0.f);
  rt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), B, T, H, G, D, nullptr, window, 0.f, sinks.data(), dsinks.data());
  Vec fq, fk, fv, fs;
  flash_backward_ref(fq, fk, fv, fs, r, q, k, v, out_f, lse_f, sinks.data(), B, T, H, G, D, window);
  const auto rel = [](const Vec& a, const Vec& b) {
    return rt::test::rel_l2(a.data(), b.data(), static_cast<int64_t>(a.size()));
  };
  EXPECT_LE(rel(fq, dq), 1e-5) << "dq";
  EXPECT_LE(rel(fk, dk), 1e-5) << "dk";
  EXPECT_LE(rel(fv, dv), 1e-5) << "dv";
  EXPECT_LE(rel(fs, dsinks), 1e-5) << "dsinks";
  // the check can fail: the same backward on the sink-free lse and out is far off
  Vec nq, nk, nv, ns;
  flash_backward_ref(nq, nk, nv, ns, r, q, k, v, out0, lse0, nullptr, B, T, H, G, D, window);
  EXPECT_GT(rel(nv, dv), 1e-2) << "the sinks must matter";
}

TEST(CpuGptOssAttention, SinksFoldIntoLseAndOutput) {
  sink_fold_case(0, 91);
  sink_fold_case(4, 101);
}

// Inputs at least `gap` away from the clamps' kinks (+-limit), where central
// differences with step 1e-2 would straddle a kink.
Vec away_from(Vec x, float limit, float gap) {
  for (auto& v : x)
    for (float kink : {limit, -limit})
      if (std::fabs(v - kink) < gap) v = kink + (v < kink ? -gap : gap);
  return x;
}

TEST(CpuGptOssSwiglu, ClampedForwardMatchesDoubleAndBackwardMatchesFiniteDifferences) {
  const int64_t n = 200;
  const float limit = 1.5f, alpha = 1.702f;
  // values from -3 to 3: a third of the gates and two thirds of the ups clamped
  Vec g = away_from(random_vec(n, 91, -3.f, 3.f), limit, 0.05f),
      u = away_from(random_vec(n, 92, -3.f, 3.f), limit, 0.05f);
  Vec r = random_vec(n, 93);
  Vec out(n, kNaN);
  rt::cpu::swiglu_clamped_forward(out.data(), g.data(), u.data(), n, limit, alpha);
  Vec ref(n);
  int clamped_g = 0, clamped_u = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double gg = std::min<double>(g[i], limit), uu = std::clamp<double>(u[i], -limit, limit);
    clamped_g += g[i] > limit;
    clamped_u += std::fabs(u[i]) > limit;
    ref[i] = static_cast<float>((uu + 1.0) * gg / (1.0 + std::exp(-alpha * gg)));
  }
  EXPECT_GT(clamped_g, 20);
  EXPECT_GT(clamped_u, 40);
  // elementwise fp32 of values of size O(1): exp and three products, ~1e-7 relative
  EXPECT_TRUE(expect_near("clamped swiglu", out, ref, 1e-6, 1e-6));
  Vec dg(n, kNaN), du(n, kNaN);
  rt::cpu::swiglu_clamped_backward(dg.data(), du.data(), r.data(), g.data(), u.data(), n, limit, alpha);
  auto loss = [&] {
    Vec o(n);
    rt::cpu::swiglu_clamped_forward(o.data(), g.data(), u.data(), n, limit, alpha);
    return dot_d(o, r);
  };
  rt::test::check_fd_grad("clamped swiglu dgate", g, dg, loss, n);
  rt::test::check_fd_grad("clamped swiglu dup", u, du, loss, n);
}

// gpt-oss's MoE layer: N tokens, E experts, top K, width F.
struct GptOssMoe {
  int64_t N = 7, C = 6, E = 4, K = 2, F = 5;
  float limit = 1.0f, alpha = 1.702f;
  Vec x, router, router_bias, dout;
  std::vector<Vec> gate, up, down, gate_b, up_b, down_b;
  explicit GptOssMoe(uint64_t seed) {
    x = random_vec(N * C, seed, -1.f, 1.f);
    router = random_vec(E * C, seed + 1, -1.f, 1.f);
    router_bias = random_vec(E, seed + 2, -1.f, 1.f);
    dout = random_vec(N * C, seed + 3, -1.f, 1.f);
    for (int64_t e = 0; e < E; ++e) {
      gate.push_back(random_vec(F * C, seed + 10 + e, -0.6f, 0.6f));
      up.push_back(random_vec(F * C, seed + 20 + e, -0.6f, 0.6f));
      down.push_back(random_vec(C * F, seed + 30 + e, -0.6f, 0.6f));
      gate_b.push_back(random_vec(F, seed + 40 + e, -0.5f, 0.5f));
      up_b.push_back(random_vec(F, seed + 50 + e, -0.5f, 0.5f));
      down_b.push_back(random_vec(C, seed + 60 + e, -0.5f, 0.5f));
    }
  }
  static std::vector<const float*> ptrs(const std::vector<Vec>& v) {
    std::vector<const float*> r;
    for (const auto& t : v) r.push_back(t.data());
    return r;
  }
  std::vector<const float*> pg, pu, pd, pgb, pub, pdb;
  rt::cpu::MoeVariant variant() {
    pg = ptrs(gate), pu = ptrs(up), pd = ptrs(down), pgb = ptrs(gate_b), pub = ptrs(up_b), pdb = ptrs(down_b);
    return rt::cpu::MoeVariant{true, limit, alpha, router_bias.data(), pgb.data(), pub.data(), pdb.data()};
  }
  // out, logits, and the selected sets (for change detection)
  void forward(Vec* out, Vec* logits, std::vector<int32_t>* sel) {
    out->assign(static_cast<size_t>(N * C), 0.f);
    logits->assign(static_cast<size_t>(N * E), 0.f);
    const rt::cpu::MoeVariant v = variant();
    rt::cpu::moe_forward(out->data(), logits->data(), x.data(), router.data(), pg.data(), pu.data(), pd.data(), N, C, E,
                         K, F, false, nullptr, nullptr, v);
    sel->assign(static_cast<size_t>(N * K), 0);
    Vec w(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      rt::cpu::moe_topk(logits->data() + n * E, E, K, false, sel->data() + n * K, w.data());
      std::sort(sel->begin() + n * K, sel->begin() + (n + 1) * K);
    }
  }
  double loss(std::vector<int32_t>* sel) {
    Vec out, logits;
    forward(&out, &logits, sel);
    return dot_d(out, dout);
  }
};

// The forward against each token's top-k experts evaluated in double.
TEST(CpuGptOssMoe, ForwardMatchesPerTokenEvaluation) {
  GptOssMoe c(5);
  Vec out, logits;
  std::vector<int32_t> sel;
  c.forward(&out, &logits, &sel);
  Vec ref(out.size(), 0.f);
  int clamped = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    std::vector<double> l(c.E);
    for (int64_t e = 0; e < c.E; ++e) {
      l[e] = c.router_bias[e];
      for (int64_t k = 0; k < c.C; ++k) l[e] += double(c.x[n * c.C + k]) * c.router[e * c.C + k];
      EXPECT_NEAR(logits[n * c.E + e], l[e], 1e-5);
    }
    std::vector<int> order(c.E);
    for (int e = 0; e < c.E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    const double m = l[order[0]];
    double z = 0;
    for (int j = 0; j < c.K; ++j) z += std::exp(l[order[j]] - m);
    for (int j = 0; j < c.K; ++j) {
      const int e = order[j];
      const double w = std::exp(l[e] - m) / z;
      std::vector<double> a(c.F);
      for (int64_t f = 0; f < c.F; ++f) {
        double g = c.gate_b[e][f], u = c.up_b[e][f];
        for (int64_t k = 0; k < c.C; ++k) {
          g += double(c.x[n * c.C + k]) * c.gate[e][f * c.C + k];
          u += double(c.x[n * c.C + k]) * c.up[e][f * c.C + k];
        }
        clamped += g > c.limit || std::fabs(u) > c.limit;
        g = std::min<double>(g, c.limit);
        u = std::clamp<double>(u, -c.limit, c.limit);
        a[f] = (u + 1.0) * g / (1.0 + std::exp(-c.alpha * g));
      }
      for (int64_t k = 0; k < c.C; ++k) {
        double o = c.down_b[e][k];
        for (int64_t f = 0; f < c.F; ++f) o += a[f] * c.down[e][k * c.F + f];
        ref[n * c.C + k] += static_cast<float>(w * o);
      }
    }
  }
  EXPECT_GT(clamped, 5) << "the clamps must bite for this test to mean anything";
  // fp32 against double, regrouped sums of K terms per token: norm-wise (testutil.h)
  EXPECT_TRUE(rt::test::expect_regrouped_norm("gpt-oss moe out", out, ref));
}

// Central differences as in moe_test.cpp (h = 1e-2, |fd - analytic| <= 2e-3
// + 2e-2 |analytic|); a perturbation that changes some token's top-k set is
// skipped (counted, and most must stay).
TEST(CpuGptOssMoe, BackwardMatchesFiniteDifferences) {
  GptOssMoe c(17);
  Vec out, logits;
  std::vector<int32_t> sel0;
  c.forward(&out, &logits, &sel0);
  Vec dx(c.x.size()), drouter(c.router.size(), 0.f), drb(c.E, 0.f);
  std::vector<Vec> dg(c.E, Vec(c.F * c.C, 0.f)), du = dg, dd(c.E, Vec(c.C * c.F, 0.f)), dgb(c.E, Vec(c.F, 0.f)),
                                                 dub = dgb, ddb(c.E, Vec(c.C, 0.f));
  std::vector<float*> pg, pu, pd, pgb, pub, pdb;
  for (int64_t e = 0; e < c.E; ++e) {
    pg.push_back(dg[e].data()), pu.push_back(du[e].data()), pd.push_back(dd[e].data());
    pgb.push_back(dgb[e].data()), pub.push_back(dub[e].data()), pdb.push_back(ddb[e].data());
  }
  const rt::cpu::MoeVariant v = c.variant();
  rt::cpu::moe_backward(dx.data(), drouter.data(), pg.data(), pu.data(), pd.data(), c.dout.data(), c.x.data(),
                        logits.data(), c.router.data(), c.pg.data(), c.pu.data(), c.pd.data(), c.N, c.C, c.E, c.K, c.F,
                        false, nullptr, v, rt::MoeBiasGrads{drb.data(), pgb.data(), pub.data(), pdb.data()});
  int checked = 0, skipped = 0;
  auto check = [&](const char* name, Vec& param, const Vec& grad) {
    for (size_t i = 0; i < param.size(); ++i) {
      const float h = 1e-2f, orig = param[i];
      std::vector<int32_t> sp, sm;
      param[i] = orig + h;
      const double lp = c.loss(&sp);
      param[i] = orig - h;
      const double lm = c.loss(&sm);
      param[i] = orig;
      if (sp != sel0 || sm != sel0) {
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2.0 * h);
      EXPECT_NEAR(fd, grad[i], 2e-3 + 2e-2 * std::fabs(grad[i])) << name << "[" << i << "]";
      ++checked;
    }
  };
  check("x", c.x, dx);
  check("router", c.router, drouter);
  check("router_bias", c.router_bias, drb);
  for (int64_t e = 0; e < c.E; ++e) {
    check("gate", c.gate[e], dg[e]);
    check("up", c.up[e], du[e]);
    check("down", c.down[e], dd[e]);
    check("gate_bias", c.gate_b[e], dgb[e]);
    check("up_bias", c.up_b[e], dub[e]);
    check("down_bias", c.down_b[e], ddb[e]);
  }
  EXPECT_GT(checked, 10 * skipped) << "routing changed under too many perturbations";
  EXPECT_GT(checked, 300);
}

}  // namespace
