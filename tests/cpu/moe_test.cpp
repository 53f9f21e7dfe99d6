// The CPU reference MoE MLP (cpu/moe.h): top-k routing rules, the forward
// against a direct per-token evaluation, and the backward (router, experts,
// the dprob input of the load-balancing loss) against central differences.
#include "cpu/moe.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/ops.h"
#include "testutil.h"

namespace {

TEST(MoeTopk, LargestFirstTiesToLowerIndexAndRenormalises) {
  const float p[5] = {0.1f, 0.3f, 0.05f, 0.3f, 0.25f};
  int32_t idx[3];
  float w[3];
  rt::cpu::moe_topk(p, 5, 3, false, idx, w);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 4);
  EXPECT_EQ(w[0], 0.3f);
  EXPECT_EQ(w[2], 0.25f);
  rt::cpu::moe_topk(p, 5, 3, true, idx, w);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0f, 1e-6f);
  EXPECT_NEAR(w[2], 0.25f / 0.85f, 1e-6f);
}

struct MoeCase {
  int64_t N = 7, C = 6, E = 4, K = 2, F = 5;
  bool norm = false;
  std::vector<float> x, router, dout, dprob;
  std::vector<std::vector<float>> gate, up, down;
  MoeCase(bool norm_topk, uint64_t seed) : norm(norm_topk) {
    x = rt::test::random_vec(N * C, seed, -1.f, 1.f);
    router = rt::test::random_vec(E * C, seed + 1, -1.f, 1.f);
    dout = rt::test::random_vec(N * C, seed + 2, -1.f, 1.f);
    dprob = rt::test::random_vec(E, seed + 3, -1.f, 1.f);
    for (int64_t e = 0; e < E; ++e) {
      gate.push_back(rt::test::random_vec(F * C, seed + 10 + e, -0.6f, 0.6f));
      up.push_back(rt::test::random_vec(F * C, seed + 20 + e, -0.6f, 0.6f));
      down.push_back(rt::test::random_vec(C * F, seed + 30 + e, -0.6f, 0.6f));
    }
  }
  std::vector<const float*> ptrs(const std::vector<std::vector<float>>& v) const {
    std::vector<const float*> r;
    for (const auto& t : v) r.push_back(t.data());
    return r;
  }
  // out, probs, and the routing (for change detection)
  void forward(std::vector<float>* out, std::vector<float>* probs, std::vector<int32_t>* sel) const {
    out->assign(static_cast<size_t>(N * C), 0.f);
    probs->assign(static_cast<size_t>(N * E), 0.f);
    auto g = ptrs(gate), u = ptrs(up), d = ptrs(down);
    rt::cpu::moe_forward(out->data(), probs->data(), x.data(), router.data(), g.data(), u.data(), d.data(), N, C, E, K,
                         F, norm, nullptr, nullptr);
    sel->assign(static_cast<size_t>(N * K), 0);
    std::vector<float> w(static_cast<size_t>(K));
    for (int64_t n = 0; n < N; ++n) {
      rt::cpu::moe_topk(probs->data() + n * E, E, K, norm, sel->data() + n * K, w.data());
      std::sort(sel->begin() + n * K, sel->begin() + (n + 1) * K);  // the set decides the output
    }
  }
  // L = sum(out * dout) + sum_{n,e} p[n,e] dprob[e], in double
  double loss(std::vector<int32_t>* sel) const {
    std::vector<float> out, probs;
    forward(&out, &probs, sel);
    double L = 0;
    for (int64_t i = 0; i < N * C; ++i) L += static_cast<double>(out[i]) * dout[i];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) L += static_cast<double>(probs[n * E + e]) * dprob[e];
    return L;
  }
};

// The forward against a direct evaluation of each token's top-k experts.
TEST(MoeForward, MatchesPerTokenEvaluation) {
  for (bool norm : {false, true}) {
    MoeCase c(norm, 5);
    std::vector<float> out, probs;
    std::vector<int32_t> sel;
    c.forward(&out, &probs, &sel);
    std::vector<float> ref(out.size(), 0.f), g(c.F), u(c.F), a(c.F), o(c.C);
    for (int64_t n = 0; n < c.N; ++n) {
      // softmax in double for the probabilities
      std::vector<double> l(c.E);
      double mx = -1e30, sum = 0;
      for (int64_t e = 0; e < c.E; ++e) {
        l[e] = 0;
        for (int64_t k = 0; k < c.C; ++k) l[e] += double(c.x[n * c.C + k]) * c.router[e * c.C + k];
        mx = std::max(mx, l[e]);
      }
      for (int64_t e = 0; e < c.E; ++e) sum += std::exp(l[e] - mx);
      for (int64_t e = 0; e < c.E; ++e) EXPECT_NEAR(probs[n * c.E + e], std::exp(l[e] - mx) / sum, 1e-6);
      int32_t idx[4];
      float w[4];
      rt::cpu::moe_topk(probs.data() + n * c.E, c.E, c.K, norm, idx, w);
      for (int64_t j = 0; j < c.K; ++j) {
        const int32_t e = idx[j];
        rt::cpu::linear_forward(g.data(), &c.x[n * c.C], c.gate[e].data(), nullptr, 1, c.C, c.F);
        rt::cpu::linear_forward(u.data(), &c.x[n * c.C], c.up[e].data(), nullptr, 1, c.C, c.F);
        rt::cpu::swiglu_forward(a.data(), g.data(), u.data(), c.F);
        rt::cpu::linear_forward(o.data(), a.data(), c.down[e].data(), nullptr, 1, c.F, c.C);
        for (int64_t k = 0; k < c.C; ++k) ref[n * c.C + k] += w[j] * o[k];
      }
    }
    // fp32, a different order of the K expert terms per token (and possibly
    // the experts' GEMM blocking): norm-wise, kRegroupRelL2 (testutil.h), not
    // an element-wise rtol, which a token whose experts cancel would break.
    EXPECT_TRUE(rt::test::expect_regrouped_norm("moe out", out, ref));
  }
}

// Central differences of L (in double from fp32 forwards) with h = 1e-2 on
// inputs of size ~1: fp32 rounding of L (~1e-6 relative, L ~ 10) over 2h
// gives ~5e-4 of noise and the O(h^2) truncation ~1e-4, so |fd - analytic|
// <= 2e-3 + 2e-2 |analytic|. A perturbation that changes some token's
// top-k set makes L jump; such samples are skipped (counted, and most stay).
TEST(MoeBackward, FiniteDifferencesMatchForRouterExpertsInputAndDprob) {
  for (bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "norm_topk_prob" : "raw top-k weights");
    MoeCase c(norm, 17);
    std::vector<float> out, probs;
    std::vector<int32_t> sel0;
    c.forward(&out, &probs, &sel0);
    std::vector<float> dx(c.x.size()), drouter(c.router.size(), 0.f);
    std::vector<std::vector<float>> dg(c.E, std::vector<float>(c.F * c.C, 0.f)),
        du = dg, dd(c.E, std::vector<float>(c.C * c.F, 0.f));
    std::vector<float*> pg, pu, pd;
    for (int64_t e = 0; e < c.E; ++e)
      pg.push_back(dg[e].data()), pu.push_back(du[e].data()), pd.push_back(dd[e].data());
    auto g = c.ptrs(c.gate), u = c.ptrs(c.up), d = c.ptrs(c.down);
    rt::cpu::moe_backward(dx.data(), drouter.data(), pg.data(), pu.data(), pd.data(), c.dout.data(), c.x.data(),
                          probs.data(), c.router.data(), g.data(), u.data(), d.data(), c.N, c.C, c.E, c.K, c.F, norm,
                          c.dprob.data());
    int checked = 0, skipped = 0;
    auto check = [&](const char* name, std::vector<float>& param, const std::vector<float>& grad) {
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
    for (int64_t e = 0; e < c.E; ++e) {
      check("gate", c.gate[e], dg[e]);
      check("up", c.up[e], du[e]);
      check("down", c.down[e], dd[e]);
    }
    EXPECT_GT(checked, 10 * skipped) << "routing changed under too many perturbations";
    EXPECT_GT(checked, 300);
  }
}

// Calling the backward twice adds the weight gradients twice and writes dx once.
TEST(MoeBackward, WeightGradsAccumulateInputGradIsWritten) {
  MoeCase c(true, 3);
  std::vector<float> out, probs;
  std::vector<int32_t> sel;
  c.forward(&out, &probs, &sel);
  auto g = c.ptrs(c.gate), u = c.ptrs(c.up), d = c.ptrs(c.down);
  std::vector<float> dx1(c.x.size()), dx2(c.x.size(), 7.f), dr(c.router.size(), 0.f);
  std::vector<std::vector<float>> dg(c.E, std::vector<float>(c.F * c.C, 0.f)), du = dg, dd = dg;
  std::vector<float*> pg, pu, pd;
  for (int64_t e = 0; e < c.E; ++e) pg.push_back(dg[e].data()), pu.push_back(du[e].data()), pd.push_back(dd[e].data());
  rt::cpu::moe_backward(dx1.data(), dr.data(), pg.data(), pu.data(), pd.data(), c.dout.data(), c.x.data(), probs.data(),
                        c.router.data(), g.data(), u.data(), d.data(), c.N, c.C, c.E, c.K, c.F, true, nullptr);
  const std::vector<float> dr1 = dr;
  rt::cpu::moe_backward(dx2.data(), dr.data(), pg.data(), pu.data(), pd.data(), c.dout.data(), c.x.data(), probs.data(),
                        c.router.data(), g.data(), u.data(), d.data(), c.N, c.C, c.E, c.K, c.F, true, nullptr);
  EXPECT_EQ(dx1, dx2);
  for (size_t i = 0; i < dr.size(); ++i) EXPECT_EQ(dr[i], 2 * dr1[i]);
}

}  // namespace
