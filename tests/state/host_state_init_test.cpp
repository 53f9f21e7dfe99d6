// HostState::init_random: every matrix is drawn from normal(0, std) and every
// norm weight is 1, bias 0; the draw is a pure function of (seed, tensor,
// element), so the thread count and the master storage do not change it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "state/host_state.h"

namespace {

rt::ModelSpec spec() {
  rt::ModelSpec s;
  s.architecture = "Qwen2ForCausalLM";
  s.hidden = 128;
  s.intermediate = 384;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.vocab = 500;
  s.max_positions = 64;
  s.qkv_bias = true;
  return s;
}

std::vector<float> masters(const rt::HostState& st) {
  std::vector<float> all;
  for (const auto& u : st.units()) {
    std::vector<float> w(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, w.data());
    all.insert(all.end(), w.begin(), w.end());
  }
  return all;
}

// The pooled matrices' elements against normal(0, std): n ~ 500k draws, so a
// correct sampler's mean lies within 5 sigma/sqrt(n) of 0, its variance within
// 5 * sqrt(2/n) (relative) of std^2, and the fraction inside one std and two
// stds within 5 binomial standard errors of 0.682689 and 0.954500; a broken
// polar step (e.g. dropping the 1/s, or using s outside the circle) misses by
// far more.
TEST(HostStateInit, MatricesAreNormalAndNormsAreOnes) {
  const float sd = 0.02f;
  rt::HostState st(spec(), false);
  st.init_random(7, sd);
  std::vector<double> x;
  for (const auto& u : st.units())
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const auto& e = u.entries[k];
      std::vector<float> w(static_cast<size_t>(e.numel()));
      u.read_master(u.offsets[k], e.numel(), w.data());
      if (e.is_norm_or_bias) {
        const bool is_bias = e.name.find("bias") != std::string::npos;
        for (float v : w) ASSERT_EQ(v, is_bias ? 0.0f : 1.0f) << e.name;
        continue;
      }
      for (float v : w) x.push_back(v / sd);
    }
  const double n = static_cast<double>(x.size());
  ASSERT_GT(n, 4e5);
  double sum = 0, sq = 0, in1 = 0, in2 = 0, mx = 0;
  for (double v : x) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += v * v;
    in1 += std::fabs(v) < 1.0;
    in2 += std::fabs(v) < 2.0;
    mx = std::max(mx, std::fabs(v));
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_LT(std::fabs(mean), 5.0 / std::sqrt(n)) << "mean " << mean;
  EXPECT_LT(std::fabs(var - 1.0), 5.0 * std::sqrt(2.0 / n)) << "variance " << var;
  const double p1 = 0.682689492, p2 = 0.954499736;
  EXPECT_LT(std::fabs(in1 / n - p1), 5.0 * std::sqrt(p1 * (1 - p1) / n)) << "within 1 std " << in1 / n;
  EXPECT_LT(std::fabs(in2 / n - p2), 5.0 * std::sqrt(p2 * (1 - p2) / n)) << "within 2 std " << in2 / n;
  EXPECT_GT(mx, 3.5) << "no tail: the largest |x| of " << n << " normals is ~4.5 sigma";
  // neighbours (the two halves of a pair, and across pairs) uncorrelated
  double c1 = 0;
  for (size_t i = 0; i + 1 < x.size(); ++i) c1 += x[i] * x[i + 1];
  EXPECT_LT(std::fabs(c1 / n), 5.0 / std::sqrt(n)) << "lag-1 correlation " << c1 / n;
}

TEST(HostStateInit, DrawDoesNotDependOnThreadsOrSeedReuse) {
  const int threads = rt::global_pool().size();
  rt::set_global_threads(1);
  rt::HostState a(spec(), false);
  a.init_random(3);
  rt::set_global_threads(std::max(2, threads));
  rt::HostState b(spec(), false), c(spec(), false);
  b.init_random(3);
  c.init_random(4);
  rt::set_global_threads(threads);
  const std::vector<float> wa = masters(a), wb = masters(b), wc = masters(c);
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * 4)) << "the thread count changed the init";
  size_t same = 0, total = 0;
  for (size_t i = 0; i < wa.size(); ++i)
    if (wa[i] != 0.0f && wa[i] != 1.0f) {
      ++total;
      same += wa[i] == wc[i];
    }
  EXPECT_LT(same, total / 1000 + 1) << "seeds 3 and 4 share draws";
}

// Split and bf16 masters draw through one reused fp32 scratch: the same values
// as the fp32 master (split: bit for bit; bf16: its rounding).
TEST(HostStateInit, ShadowStoragesDrawTheSameValues) {
  rt::HostState f(spec(), false), s(spec(), false, rt::MomentStorage::fp32, rt::MasterStorage::split);
  f.init_random(9);
  s.init_random(9);
  const std::vector<float> wf = masters(f), ws = masters(s);
  ASSERT_EQ(wf.size(), ws.size());
  EXPECT_EQ(0, std::memcmp(wf.data(), ws.data(), wf.size() * 4));
}

// A state made for Muon has the layout (packed v) and the init of one made
// for AdamW and then switched with set_update_rule, without the rebuild.
TEST(HostStateInit, MuonFromTheConstructorEqualsTheSwitch) {
  for (rt::MasterStorage ms : {rt::MasterStorage::fp32, rt::MasterStorage::split})
    for (rt::MomentStorage mo : {rt::MomentStorage::fp32, rt::MomentStorage::q8}) {
      rt::HostState a(spec(), false, mo, ms, rt::UpdateRule::muon), b(spec(), false, mo, ms);
      b.set_update_rule(rt::UpdateRule::muon);
      a.init_random(5);
      b.init_random(5);
      ASSERT_EQ(a.update_rule(), rt::UpdateRule::muon);
      EXPECT_EQ(a.bytes_total(), b.bytes_total());
      for (size_t u = 0; u < a.units().size(); ++u) {
        const rt::StateUnit &ua = a.units()[u], &ub = b.units()[u];
        EXPECT_TRUE(ua.muon && ub.muon);
        EXPECT_EQ(ua.v_off, ub.v_off) << ua.name;
        EXPECT_EQ(ua.nv, ub.nv) << ua.name;
        if (ua.name.rfind("layer.", 0) == 0) {
          EXPECT_LT(ua.v_len(), ua.numel) << ua.name << ": its matrices keep no v";
        }
      }
      const std::vector<float> wa = masters(a), wb = masters(b);
      EXPECT_EQ(0, std::memcmp(wa.data(), wb.data(), wa.size() * 4));
    }
}

}  // namespace
