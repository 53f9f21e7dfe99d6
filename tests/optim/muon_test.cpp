// Muon (optim/muon.h, optim/muon_unit.h) against references written here:
//   - NS5 / muon_orthogonalize vs a straightforward double-precision NS5;
//   - the output's singular values in the quintic's band for random and
//     ill-conditioned inputs (singular values by Jacobi in double);
//   - a full update of a tiny model's units vs the formulas in double, the
//     non-matrix tensors bit-identical to --optimizer adamw;
//   - muon8bit, muon4bit: the first step equals muon's, the momentum muon's to
//     the m8 (m4) code's resolution;
//   - set_update_rule and whole-unit-only updates.
#include "optim/muon.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "optim/muon_unit.h"
#include "optim/unit_update.h"
#include "testutil.h"

namespace {

using Mat = std::vector<double>;  // row-major

// X [r, c], r <= c: five quintic steps, plainly, in double.
Mat ns5_ref(Mat x, int64_t r, int64_t c) {
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < 5; ++s) {
    Mat A(r * r, 0.0), B(r * r, 0.0), Y(r * c, 0.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < c; ++k) A[i * r + j] += x[i * c + k] * x[j * c + k];
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < r; ++k) aa += A[i * r + k] * A[k * r + j];
        B[i * r + j] = b * A[i * r + j] + cc * aa;
      }
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < r; ++k) bx += B[i * r + k] * x[k * c + j];
        Y[i * c + j] = a * x[i * c + j] + bx;
      }
    x = Y;
  }
  return x;
}

// orthogonalise(U) [R, C] in double: normalise, transpose to rows <= cols, NS5, back.
Mat orthogonalize_ref(const Mat& u, int64_t R, int64_t C) {
  double ss = 0;
  for (double v : u) ss += v * v;
  const double d = std::sqrt(ss) + 1e-7;
  const bool tr = R > C;
  const int64_t r = tr ? C : R, c = tr ? R : C;
  Mat x(R * C);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) (tr ? x[j * R + i] : x[i * C + j]) = u[i * C + j] / d;
  x = ns5_ref(x, r, c);
  Mat o(R * C);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) o[i * C + j] = tr ? x[j * R + i] : x[i * C + j];
  return o;
}

// Singular values of M [R, C] (double): square roots of the eigenvalues of the
// smaller Gram matrix, by cyclic Jacobi.
std::vector<double> singular_values(const Mat& m, int64_t R, int64_t C) {
  const int64_t n = std::min(R, C);
  Mat g(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < std::max(R, C); ++k)
        g[i * n + j] += R <= C ? m[i * C + k] * m[j * C + k] : m[k * C + i] * m[k * C + j];
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) off += g[p * n + q] * g[p * n + q];
    if (off < 1e-30) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (std::fabs(g[p * n + q]) < 1e-300) continue;
        const double theta = (g[q * n + q] - g[p * n + p]) / (2 * g[p * n + q]);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double gp = g[k * n + p], gq = g[k * n + q];
          g[k * n + p] = cs * gp - sn * gq;
          g[k * n + q] = sn * gp + cs * gq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double gp = g[p * n + k], gq = g[q * n + k];
          g[p * n + k] = cs * gp - sn * gq;
          g[q * n + k] = sn * gp + cs * gq;
        }
      }
  }
  std::vector<double> s(n);
  for (int64_t i = 0; i < n; ++i) s[i] = std::sqrt(std::max(0.0, g[i * n + i]));
  std::sort(s.begin(), s.end());
  return s;
}

Mat gaussian(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd;
  Mat x(n);
  for (double& v : x) v = nd(rng);
  return x;
}

// Rows of a [r, c] gaussian made orthonormal (Gram-Schmidt twice), r <= c.
Mat orthonormal_rows(int64_t r, int64_t c, uint64_t seed) {
  Mat q = gaussian(r * c, seed);
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        double d = 0;
        for (int64_t k = 0; k < c; ++k) d += q[i * c + k] * q[j * c + k];
        for (int64_t k = 0; k < c; ++k) q[i * c + k] -= d * q[j * c + k];
      }
      double nrm = 0;
      for (int64_t k = 0; k < c; ++k) nrm += q[i * c + k] * q[i * c + k];
      for (int64_t k = 0; k < c; ++k) q[i * c + k] /= std::sqrt(nrm);
    }
  return q;
}

// [r, c] = Q1 diag(s) Q2, Q1 [r, r], Q2 [r, c] with orthonormal rows; r <= c.
Mat with_singular_values(const std::vector<double>& s, int64_t r, int64_t c, uint64_t seed) {
  const Mat q1 = orthonormal_rows(r, r, seed), q2 = orthonormal_rows(r, c, seed + 1);
  Mat m(r * c, 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t k = 0; k < r; ++k)
      for (int64_t j = 0; j < c; ++j) m[i * c + j] += q1[i * r + k] * s[k] * q2[k * c + j];
  return m;
}

std::vector<float> to_f32(const Mat& m) { return std::vector<float>(m.begin(), m.end()); }
Mat to_f64(const std::vector<float>& v) { return Mat(v.begin(), v.end()); }
std::vector<float> orthogonalize(const std::vector<float>& u, int64_t R, int64_t C) {
  std::vector<float> o(u.size());
  rt::muon_orthogonalize(u.data(), o.data(), R, C);
  return o;
}

// fp32 NS5 vs double. Tolerance: each step's GEMMs accumulate <= 48 products
// in fp32 (relative error ~ 48 * 6e-8 ~ 3e-6 of the entries' scale), and the
// quintic amplifies an input error by its slope (a = 3.44 at small singular
// values) per step: 3.44^5 * 3e-6 ~ 1.5e-3 in the worst case; measured ~1e-6.
// 2e-4 of the output's scale is far below a wrong coefficient, a missing step
// or a lost transpose (all O(1) of the scale; checked by breaking the code).
TEST(Muon, NewtonSchulzMatchesADoubleReference) {
  struct Shape {
    int64_t r, c;
  };
  uint64_t seed = 1;
  for (const Shape sh : {Shape{20, 36}, Shape{36, 20}, Shape{16, 16}, Shape{1, 17}, Shape{48, 32}}) {
    SCOPED_TRACE(std::to_string(sh.r) + "x" + std::to_string(sh.c));
    const std::vector<float> u = to_f32(gaussian(sh.r * sh.c, seed++));
    const std::vector<float> got = orthogonalize(u, sh.r, sh.c);
    const std::vector<float> ref = to_f32(orthogonalize_ref(to_f64(u), sh.r, sh.c));
    EXPECT_LE(rt::test::max_rel_to_scale(got.data(), ref.data(), sh.r * sh.c), 2e-4);
  }
  // newton_schulz5 on its own (normalised input, rows <= cols)
  const int64_t r = 12, c = 30;
  Mat x = gaussian(r * c, 99);
  double ss = 0;
  for (double v : x) ss += v * v;
  for (double& v : x) v /= std::sqrt(ss);
  std::vector<float> xf = to_f32(x);
  rt::newton_schulz5(xf.data(), r, c);
  const std::vector<float> ref = to_f32(ns5_ref(x, r, c));
  EXPECT_LE(rt::test::max_rel_to_scale(xf.data(), ref.data(), r * c), 2e-4);
  EXPECT_THROW(rt::newton_schulz5(xf.data(), c, r), rt::Error);  // rows > cols is the caller's transpose
}

// The quintic maps every singular value of the normalised input that is not
// tiny (>= ~3e-3 of ||U||_F) into its oscillation band: 5 steps from 3e-3 reach
// 1.11, and the band of the (3.4445, -4.7750, 2.0315) iteration is ~[0.68, 1.2]
// (Jordan 2024). Inputs: gaussian (well conditioned) and condition number 100
// (geometric spectrum), both orientations.
TEST(Muon, SingularValuesLandInTheQuinticBand) {
  const int64_t r = 24, c = 40;
  std::vector<double> s(r);
  for (int64_t i = 0; i < r; ++i) s[i] = std::pow(100.0, -static_cast<double>(i) / (r - 1));  // 1 .. 1e-2
  const Mat ill = with_singular_values(s, r, c, 5);
  const std::vector<double> sv_in = singular_values(ill, r, c);
  ASSERT_GT(sv_in.back() / sv_in.front(), 99.0);  // really ill-conditioned
  Mat ill_t(r * c);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) ill_t[j * r + i] = ill[i * c + j];
  struct Case {
    const char* name;
    Mat m;
    int64_t R, C;
  };
  for (const Case& k : {Case{"gaussian", gaussian(r * c, 7), r, c}, Case{"gaussian^T", gaussian(r * c, 8), c, r},
                        Case{"cond 100", ill, r, c}, Case{"cond 100 ^T", ill_t, c, r}}) {
    SCOPED_TRACE(k.name);
    const std::vector<float> o = orthogonalize(to_f32(k.m), k.R, k.C);
    const std::vector<double> sv = singular_values(to_f64(o), k.R, k.C);
    EXPECT_GE(sv.front(), 0.68) << "smallest singular value";
    EXPECT_LE(sv.back(), 1.2) << "largest singular value";
  }
}

rt::ModelSpec spec() { return rt::test::llama_spec(32, 48, 2, 4, 2, 8, 64, /*qkv_bias=*/true); }

// An independent statement of which tensors Muon takes (the issue's list).
bool is_muon_name(const std::string& n) {
  for (const char* k : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                        "up_proj.weight", "down_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight"})
    if (n.size() > std::strlen(k) && n.compare(n.size() - std::strlen(k), std::strlen(k), k) == 0) return true;
  return false;
}

std::vector<float> unit_grad(const rt::StateUnit& u, int t) {
  return rt::test::random_vec(u.numel, 1000 * static_cast<uint64_t>(t) + static_cast<uint64_t>(u.index), -1.f, 1.f);
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, static_cast<size_t>(n) * 4) == 0; }

TEST(Muon, TheMatricesAreTheLayersProjections) {
  rt::HostState st(spec(), false);
  int matrices = 0;
  for (auto& u : st.units())
    for (auto& e : u.entries) {
      EXPECT_EQ(rt::muon_matrix(e), is_muon_name(e.name)) << e.name;
      matrices += rt::muon_matrix(e);
    }
  EXPECT_EQ(matrices, 2 * 7);
  // MoE: experts (Qwen2-MoE's gate_proj..., Mixtral's w1, w2, w3) and the shared
  // expert are Muon's; the router and the shared-expert gate are not
  const std::string qwen2_moe = R"({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
    "hidden_size": 16, "intermediate_size": 40, "moe_intermediate_size": 10, "shared_expert_intermediate_size": 14,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 11,
    "num_experts": 5, "num_experts_per_tok": 2, "norm_topk_prob": false, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "rope_theta": 100.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 64})";
  const std::string mixtral = R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "hidden_size": 16, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 11, "num_local_experts": 4, "num_experts_per_tok": 2,
    "rope_theta": 100.0, "max_position_embeddings": 64})";
  struct Moe {
    std::string config;
    int per_layer;
  };
  for (const Moe& m : {Moe{qwen2_moe, 4 + 5 * 3 + 3}, Moe{mixtral, 4 + 4 * 3}}) {
    const rt::ModelSpec s = rt::spec_from_config_text(m.config, "config.json");
    ASSERT_TRUE(s.is_moe());
    int n = 0;
    for (const rt::WeightEntry& e : rt::weight_map(s)) {
      EXPECT_EQ(rt::muon_matrix(e), is_muon_name(e.name)) << e.name;
      n += rt::muon_matrix(e);
    }
    EXPECT_EQ(n, 2 * m.per_layer) << s.architecture;
  }
}

// Three steps of update_unit over every unit of a tiny model (biases, norms,
// embedding, head; gate/up [48, 32] take the transposed path) against the
// formulas of optim/muon.h in double, and the non-matrix tensors against an
// --optimizer adamw state bit for bit.
TEST(Muon, AStepOfATinyModelMatchesTheFormulas) {
  rt::HostState mu(spec(), false), aw(spec(), false);
  mu.init_random(3);
  aw.init_random(3);
  mu.set_update_rule(rt::UpdateRule::muon);
  EXPECT_EQ(mu.update_rule(), rt::UpdateRule::muon);
  rt::OptimStep o;
  o.lr = 0.02;
  o.weight_decay = 0.1;
  o.hyper.beta1 = 0.9;
  o.hyper.beta2 = 0.95;
  o.muon.momentum = 0.8;  // not beta1, so a mix-up shows
  const double m_ = 0.8;
  const float coef = 0.7f;
  // the reference: per Muon tensor, weights and momentum in double
  struct Ref {
    size_t unit;
    size_t entry;
    Mat w, m;
  };
  std::vector<Ref> refs;
  for (size_t i = 0; i < mu.units().size(); ++i) {
    const rt::StateUnit& u = mu.units()[i];
    for (size_t k = 0; k < u.entries.size(); ++k)
      if (is_muon_name(u.entries[k].name)) {
        const float* p = u.master() + u.offsets[k];
        refs.push_back({i, k, Mat(p, p + u.entries[k].numel()), Mat(u.entries[k].numel(), 0.0)});
      }
  }
  ASSERT_EQ(refs.size(), 14u);
  for (int t = 1; t <= 3; ++t) {
    o.t = t;
    double max_step = 0;
    for (size_t i = 0; i < mu.units().size(); ++i) {
      rt::StateUnit& a = mu.units()[i];
      const std::vector<float> g = unit_grad(a, t);
      std::vector<uint16_t> shadow(static_cast<size_t>(a.numel), 0);
      rt::update_unit(a, g.data(), o, coef, shadow.data());
      rt::update_unit(aw.units()[i], g.data(), o, coef, nullptr);
      for (size_t k = 0; k < a.entries.size(); ++k) {  // the shadow is the new master, rounded
        const int64_t off = a.offsets[k];
        for (int64_t j = 0; j < a.entries[k].numel(); ++j)
          ASSERT_EQ(shadow[off + j], rt::f32_to_bf16(a.master()[off + j])) << a.entries[k].name << " " << j;
      }
    }
    for (Ref& r : refs) {
      const rt::StateUnit& u = mu.units()[r.unit];
      const rt::WeightEntry& e = u.entries[r.entry];
      const int64_t R = e.shape[0], C = e.shape[1], n = R * C, off = u.offsets[r.entry];
      const std::vector<float> g = unit_grad(u, t);
      Mat U(n);
      for (int64_t j = 0; j < n; ++j) {
        const double G = static_cast<double>(g[off + j] * coef);  // the clipped gradient, as both compute it
        r.m[j] = m_ * r.m[j] + G;
        U[j] = G + m_ * r.m[j];
      }
      const Mat O = orthogonalize_ref(U, R, C);
      const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(R, C)));
      for (int64_t j = 0; j < n; ++j) {
        const double before = r.w[j];
        r.w[j] = r.w[j] * (1 - o.lr * o.weight_decay) - o.lr * scale * O[j];
        max_step = std::max(max_step, std::fabs(r.w[j] - before));
      }
      SCOPED_TRACE(e.name + " step " + std::to_string(t));
      // momentum: a few fp32 roundings of O(1) values per step
      EXPECT_TRUE(rt::test::expect_near("m", u.m() + off, to_f32(r.m).data(), n, 1e-6, 1e-5));
      EXPECT_EQ(u.v_at(r.entry), -1) << "a Muon matrix has no v";
    }
    // weights: the update is lr*scale*O (~4e-3 per element); O agrees to 2e-4 of
    // its scale (the NS5 test), the weights' own fp32 rounding is ~1e-8: 1e-3 of
    // the largest step per step taken bounds both with a margin
    for (const Ref& r : refs) {
      const rt::StateUnit& u = mu.units()[r.unit];
      SCOPED_TRACE(u.entries[r.entry].name + " step " + std::to_string(t));
      EXPECT_TRUE(rt::test::expect_near("w", u.master() + u.offsets[r.entry], to_f32(r.w).data(),
                                        static_cast<int64_t>(r.w.size()), 1e-3 * max_step * t, 0));
    }
    // every other tensor: AdamW bit for bit (master, m, v)
    for (size_t i = 0; i < mu.units().size(); ++i) {
      const rt::StateUnit& a = mu.units()[i];
      const rt::StateUnit& b = aw.units()[i];
      for (size_t k = 0; k < a.entries.size(); ++k) {
        if (is_muon_name(a.entries[k].name)) continue;
        const int64_t off = a.offsets[k], n = a.entries[k].numel();
        EXPECT_TRUE(same_bits(a.master() + off, b.master() + off, n)) << a.entries[k].name;
        EXPECT_TRUE(same_bits(a.m() + off, b.m() + off, n)) << a.entries[k].name;
        EXPECT_TRUE(same_bits(a.v() + a.v_at(k), b.v() + b.v_at(k), n)) << a.entries[k].name;
      }
    }
  }
  // and the momentum default is beta1: momentum < 0 resolves to it
  rt::OptimStep d;
  d.hyper.beta1 = 0.77;
  EXPECT_EQ(rt::muon_momentum(d), 0.77);
}

// muon8bit: step 1 updates from the fp32 momentum G before it is encoded, so
// its weights equal muon's bit for bit; its stored momentum is muon's to the
// m8 code's resolution (adjacent levels at most 1.4% of the block's absmax
// apart: |error| <= 0.015 absmax with stochastic rounding); later steps drift
// apart by a small fraction of a step.
TEST(Muon, Muon8bitTracksMuon) {
  rt::HostState a(spec(), false), q(spec(), false, rt::MomentStorage::q8);
  a.init_random(4);
  q.init_random(4);
  a.set_update_rule(rt::UpdateRule::muon);
  q.set_update_rule(rt::UpdateRule::muon);
  rt::OptimStep o;
  o.lr = 0.02;
  o.rounding_seed = 9;
  for (int t = 1; t <= 2; ++t) {
    o.t = t;
    for (size_t i = 0; i < a.units().size(); ++i) {
      const std::vector<float> g = unit_grad(a.units()[i], t);
      rt::update_unit(a.units()[i], g.data(), o, 1.0f, nullptr);
      rt::update_unit(q.units()[i], g.data(), o, 1.0f, nullptr);
    }
    for (size_t i = 0; i < a.units().size(); ++i) {
      const rt::StateUnit& ua = a.units()[i];
      const rt::StateUnit& uq = q.units()[i];
      if (t == 1) {
        EXPECT_TRUE(same_bits(ua.master(), uq.master(), ua.numel)) << ua.name;
        std::vector<float> m(static_cast<size_t>(uq.numel));
        for (int64_t b = 0; b < rt::quant_blocks(uq.numel); ++b) {
          const int64_t first = b * rt::kQuantBlock, k = std::min(rt::kQuantBlock, uq.numel - first);
          rt::quant_block_decode(uq.moments, true, uq.qm(), first, uq.scale_m()[b], k, m.data() + first);
          float absmax = 0;
          for (int64_t j = first; j < first + k; ++j) absmax = std::max(absmax, std::fabs(ua.m()[j]));
          // stochastic rounding: within one level step, <= 1/8 of the value in m8's
          // e4m3 (state/moment_quant.h), or its smallest level times the absmax below it
          for (int64_t j = first; j < first + k; ++j)
            ASSERT_LE(std::fabs(m[j] - ua.m()[j]),
                      std::fabs(ua.m()[j]) / 8 + rt::quant_code_m8().level[1] * absmax + absmax * 0x1.0p-21f)
                << uq.name << " element " << j;
        }
      } else {
        EXPECT_FALSE(same_bits(ua.master(), uq.master(), ua.numel)) << ua.name;
        float worst = 0;  // steps of up to ~0.4 lr (Muon), ~lr (AdamW); they differ by a fraction of one
        for (int64_t j = 0; j < ua.numel; ++j) worst = std::max(worst, std::fabs(uq.master()[j] - ua.master()[j]));
        EXPECT_LE(worst, 0.2 * o.lr) << ua.name;  // measured <= 0.09 lr
      }
    }
  }
}

// muon4bit: as muon8bit, step 1 equals muon's bit for bit; the stored
// momentum is muon's rounded stochastically to one of the two m4n levels that
// bracket |m| / absmax (state/moment_quant.h: a Muon unit's m code, 8
// magnitudes at normal quantiles, 0 included), so its error is at most the
// bracket's width times the absmax (per element, from the code's table;
// + 2^-21 absmax for the encoder's fp32 division). Step 2 is muon's step from
// the decoded moments bit for bit (a muon state given them), and it stays
// within a fraction of muon's own step 2, norm-wise per tensor: Muon matrices
// 0.35 (measured <= 0.17: the momentum's error enters U scaled by mu^2 next
// to the fresh gradient), the other tensors 0.9 (AdamW's per-element step on
// m4n's coarse small levels and v4's powers of two, which put sqrt(v) up to
// sqrt(2) off; measured <= 0.72, on a 32-element norm). A lost, doubled or
// reversed update is >= 1.
TEST(Muon, Muon4bitTracksMuon) {
  rt::HostState a(spec(), false), c(spec(), false), q(spec(), false, rt::MomentStorage::q4);
  for (rt::HostState* st : {&a, &c, &q}) {
    st->init_random(4);
    st->set_update_rule(rt::UpdateRule::muon);
  }
  EXPECT_STREQ(rt::optimizer_name(q.update_rule(), q.moment_storage()), "muon4bit");
  const rt::QuantCode& code = rt::quant_code_m4n();  // a Muon unit's 4-bit m code
  ASSERT_TRUE(code.has_zero);
  rt::OptimStep o;
  o.lr = 0.02;
  o.rounding_seed = 9;
  for (int t = 1; t <= 2; ++t) {
    o.t = t;
    std::vector<std::vector<float>> before;  // muon's weights before this step
    for (const rt::StateUnit& u : a.units()) before.emplace_back(u.master(), u.master() + u.numel);
    for (size_t i = 0; i < a.units().size(); ++i) {
      const std::vector<float> g = unit_grad(a.units()[i], t);
      for (rt::HostState* st : {&a, &c, &q}) rt::update_unit(st->units()[i], g.data(), o, 1.0f, nullptr);
    }
    for (size_t i = 0; i < a.units().size(); ++i) {
      const rt::StateUnit& ua = a.units()[i];
      rt::StateUnit& uc = c.units()[i];
      const rt::StateUnit& uq = q.units()[i];
      SCOPED_TRACE(ua.name + " step " + std::to_string(t));
      if (t == 1) {
        EXPECT_TRUE(same_bits(ua.master(), uq.master(), ua.numel));
        std::vector<float> m(static_cast<size_t>(uq.numel));
        int64_t rounded = 0;  // elements strictly inside a bracket (so the bound is not vacuous)
        for (int64_t b = 0; b < rt::quant_blocks(uq.numel); ++b) {
          const int64_t first = b * rt::kQuantBlock, k = std::min(rt::kQuantBlock, uq.numel - first);
          rt::quant_block_decode(uq.moments, true, uq.qm(), first, uq.scale_m()[b], k, m.data() + first, true);
          float absmax = 0;
          for (int64_t j = first; j < first + k; ++j) absmax = std::max(absmax, std::fabs(ua.m()[j]));
          for (int64_t j = first; j < first + k; ++j) {
            const float y = absmax > 0 ? std::fabs(ua.m()[j]) / absmax : 0.0f;
            int lo = 0;
            while (lo + 1 < code.n && code.level[lo + 1] <= y) ++lo;
            const float width = lo + 1 < code.n ? code.level[lo + 1] - code.level[lo] : 0.0f;
            rounded += width > 0 && y > code.level[lo];
            ASSERT_LE(std::fabs(m[j] - ua.m()[j]), width * absmax + absmax * 0x1.0p-21f)
                << "element " << j << " (|m| / absmax " << y << ")";
          }
        }
        EXPECT_GT(rounded, uq.numel / 2);
        // c continues from muon4bit's moments, decoded
        rt::quant_decode(uq.moments, true, uq.qm(), uq.scale_m(), uq.numel, uc.m(), true);
        rt::quant_decode(uq.moments, false, uq.qv(), uq.scale_v(), uq.v_len(), uc.v(), true);
        continue;
      }
      EXPECT_TRUE(same_bits(uc.master(), uq.master(), ua.numel)) << "muon from the decoded moments";
      EXPECT_FALSE(same_bits(ua.master(), uq.master(), ua.numel));
      for (size_t k = 0; k < ua.entries.size(); ++k) {
        const int64_t off = ua.offsets[k], n = ua.entries[k].numel();
        double d2 = 0, s2 = 0;
        for (int64_t j = off; j < off + n; ++j) {
          const double d = static_cast<double>(uq.master()[j]) - ua.master()[j];
          const double st = static_cast<double>(ua.master()[j]) - before[i][static_cast<size_t>(j)];
          d2 += d * d;
          s2 += st * st;
        }
        EXPECT_LE(std::sqrt(d2), (rt::muon_matrix(ua.entries[k]) ? 0.35 : 0.9) * std::sqrt(s2)) << ua.entries[k].name;
      }
    }
  }
}

// Muon over a bf16 master (--master bf16-sr | bf16-kahan). Each step is
// checked against an fp32 Muon state given the bf16 state's master (its bf16
// values) and moments before the step, so the only difference left is how
// the new fp32 weights x are stored: bf16-sr stores one of the two bf16
// values around x (x itself when it is one), bf16-kahan exactly the Kahan step
// of optim/adamw_lean.h (t = bf16(p + y), y = (x - p) - c, c' = bf16((t - p) - y)),
// written out here. The moments equal the fp32 state's bit for bit. And the
// non-matrix tensors equal an --optimizer adamw state's of the same master bit
// for bit (bf16-sr: the same stochastic-rounding draws as adamw_lean_update).
TEST(Muon, Bf16MastersStoreMuonsUpdateWithTheirRounding) {
  for (rt::MasterStorage ms : {rt::MasterStorage::bf16_sr, rt::MasterStorage::bf16_kahan}) {
    SCOPED_TRACE(rt::master_storage_name(ms));
    rt::HostState q(spec(), false, rt::MomentStorage::fp32, ms, rt::UpdateRule::muon);
    rt::HostState aw(spec(), false, rt::MomentStorage::fp32, ms);
    rt::HostState c(spec(), false, rt::MomentStorage::fp32, rt::MasterStorage::fp32, rt::UpdateRule::muon);
    q.init_random(5);
    aw.init_random(5);
    rt::OptimStep o;
    o.lr = 0.02;
    o.weight_decay = 0.1;
    o.rounding_seed = 3;
    int64_t inexact = 0;  // stored values that had to be rounded (so the checks are not vacuous)
    for (int t = 1; t <= 3; ++t) {
      o.t = t;
      for (size_t i = 0; i < q.units().size(); ++i) {
        rt::StateUnit& uq = q.units()[i];
        rt::StateUnit& uc = c.units()[i];
        ASSERT_EQ(uq.n_shadows, 1);
        const std::vector<uint16_t> p(uq.shadow(0), uq.shadow(0) + uq.numel);
        const std::vector<uint16_t> comp = ms == rt::MasterStorage::bf16_kahan
                                               ? std::vector<uint16_t>(uq.comp(), uq.comp() + uq.numel)
                                               : std::vector<uint16_t>();
        uq.read_master(0, uq.numel, uc.master());  // the bf16 values
        std::memcpy(uc.m(), uq.m(), static_cast<size_t>(uq.numel + uq.v_len()) * 4);
        const std::vector<float> g = unit_grad(uq, t);
        rt::update_unit(uq, g.data(), o, 0.9f, nullptr);
        rt::update_unit(uc, g.data(), o, 0.9f, nullptr);
        rt::update_unit(aw.units()[i], g.data(), o, 0.9f, nullptr);
        SCOPED_TRACE(uq.name + " step " + std::to_string(t));
        ASSERT_TRUE(same_bits(uq.m(), uc.m(), uq.numel + uq.v_len()));
        for (int64_t j = 0; j < uq.numel; ++j) {
          const float x = uc.master()[j];
          const uint16_t got = uq.shadow(0)[j];
          if (ms == rt::MasterStorage::bf16_sr) {
            const uint16_t down = static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);  // toward 0
            const bool exact = rt::bf16_to_f32(down) == x;
            inexact += !exact;
            ASSERT_TRUE(got == down || (!exact && got == down + 1)) << "element " << j << ": " << x;
          } else {
            const float old = rt::bf16_to_f32(p[static_cast<size_t>(j)]);
            const float y = (x - old) - rt::bf16_to_f32(comp[static_cast<size_t>(j)]);
            const uint16_t want = rt::f32_to_bf16(old + y);
            inexact += rt::bf16_to_f32(want) != old + y;
            ASSERT_EQ(got, want) << "element " << j;
            ASSERT_EQ(uq.comp()[j], rt::f32_to_bf16((rt::bf16_to_f32(want) - old) - y)) << "element " << j;
          }
        }
        const rt::StateUnit& ua = aw.units()[i];
        for (size_t k = 0; k < uq.entries.size(); ++k) {
          if (rt::muon_matrix(uq.entries[k])) continue;
          const int64_t off = uq.offsets[k], n = uq.entries[k].numel();
          EXPECT_EQ(std::memcmp(uq.shadow(0) + off, ua.shadow(0) + off, static_cast<size_t>(n) * 2), 0)
              << uq.entries[k].name;
          EXPECT_TRUE(same_bits(uq.m() + off, ua.m() + off, n)) << uq.entries[k].name;
          EXPECT_TRUE(same_bits(uq.v() + uq.v_at(k), ua.v() + ua.v_at(k), n)) << uq.entries[k].name;
        }
      }
    }
    EXPECT_GT(inexact, 1000);
  }
}

// The quantized update decodes m and v through windows of whole blocks,
// tensor by tensor (a matrix whole, other tensors in pieces) and encodes each
// block once the update has passed it: any piece length gives the same bits
// (masters, codes, scales), here 1, 7, 256 and 300 elements against the
// default, which takes this model's tensors whole. 8- and 4-bit moments,
// fp32, split and bf16 masters.
TEST(Muon, QuantizedPiecesOfAnyLengthGiveTheSameBits) {
  for (rt::MomentStorage mo : {rt::MomentStorage::q8, rt::MomentStorage::q4})
    for (rt::MasterStorage ms : {rt::MasterStorage::fp32, rt::MasterStorage::split, rt::MasterStorage::bf16_kahan})
      for (int64_t piece : {int64_t(1), int64_t(7), int64_t(256), int64_t(300)}) {
        SCOPED_TRACE(std::string(rt::optimizer_name(rt::UpdateRule::muon, mo)) + " " + rt::master_storage_name(ms) +
                     " piece " + std::to_string(piece));
        rt::HostState a(spec(), false, mo, ms, rt::UpdateRule::muon), b(spec(), false, mo, ms, rt::UpdateRule::muon);
        a.init_random(6);
        b.init_random(6);
        rt::OptimStep o;
        o.lr = 0.02;
        o.weight_decay = 0.1;
        o.rounding_seed = 11;
        for (int t = 1; t <= 2; ++t) {
          o.t = t;
          for (size_t i = 0; i < a.units().size(); ++i) {
            rt::StateUnit &ua = a.units()[i], &ub = b.units()[i];
            const std::vector<float> g = unit_grad(ua, t);
            rt::muon_unit_update(ua, g.data(), o, 0.8f, nullptr);
            rt::muon_unit_update(ub, g.data(), o, 0.8f, nullptr, piece);
            std::vector<float> wa(static_cast<size_t>(ua.numel)), wb(wa.size());
            ua.read_master(0, ua.numel, wa.data());
            ub.read_master(0, ub.numel, wb.data());
            ASSERT_TRUE(same_bits(wa.data(), wb.data(), ua.numel)) << ua.name;
            ASSERT_EQ(std::memcmp(ua.qm(), ub.qm(), static_cast<size_t>(rt::quant_code_bytes(mo, ua.numel))), 0);
            ASSERT_EQ(std::memcmp(ua.qv(), ub.qv(), static_cast<size_t>(rt::quant_code_bytes(mo, ua.v_len()))), 0);
            ASSERT_TRUE(
                same_bits(ua.scale_m(), ub.scale_m(), rt::quant_blocks(ua.numel) + rt::quant_blocks(ua.v_len())));
          }
        }
      }
}

TEST(Muon, ChangingTheRuleZeroesOnlyTheMatricesState) {
  rt::HostState st(spec(), false);
  st.init_random(2);
  rt::OptimStep o;
  o.t = 1;
  o.lr = 1e-3;
  for (auto& u : st.units()) {
    const std::vector<float> g = unit_grad(u, 1);
    rt::update_unit(u, g.data(), o, 1.0f, nullptr);  // AdamW: every m, v nonzero
  }
  std::vector<std::vector<float>> before;
  for (auto& u : st.units()) before.emplace_back(u.m(), u.m() + 2 * u.numel);
  const uint64_t adamw_bytes = st.bytes_total();
  st.set_update_rule(rt::UpdateRule::muon);
  for (size_t i = 0; i < st.units().size(); ++i) {
    const rt::StateUnit& u = st.units()[i];
    EXPECT_TRUE(u.muon);
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t off = u.offsets[k], n = u.entries[k].numel();
      const float* m = u.m() + off;
      if (rt::muon_matrix(u.entries[k])) {
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(m[j], 0.0f) << u.entries[k].name;
        EXPECT_EQ(u.v_at(k), -1) << u.entries[k].name;
      } else {
        EXPECT_TRUE(same_bits(m, before[i].data() + off, n)) << u.entries[k].name;
        ASSERT_GE(u.v_at(k), 0) << u.entries[k].name;
        EXPECT_TRUE(same_bits(u.v() + u.v_at(k), before[i].data() + u.numel + off, n)) << u.entries[k].name;
      }
    }
  }
  // the matrices' v is gone: 4 B per matrix element fewer
  uint64_t matrix_floats = 0;
  for (const auto& u : st.units())
    for (const auto& e : u.entries)
      if (rt::muon_matrix(e)) matrix_floats += static_cast<uint64_t>((e.numel() + 15) / 16 * 16);
  EXPECT_EQ(st.bytes_total(), adamw_bytes - 4 * matrix_floats);
  // and back: the non-matrix moments survive the round trip, the matrices' are 0
  st.set_update_rule(rt::UpdateRule::adamw);
  for (size_t i = 0; i < st.units().size(); ++i) {
    const rt::StateUnit& u = st.units()[i];
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t off = u.offsets[k], n = u.entries[k].numel();
      for (int part = 0; part < 2; ++part) {
        const float* got = u.m() + part * u.numel + off;
        if (rt::muon_matrix(u.entries[k])) {
          for (int64_t j = 0; j < n; ++j) ASSERT_EQ(got[j], 0.0f) << u.entries[k].name;
        } else {
          EXPECT_TRUE(same_bits(got, before[i].data() + part * u.numel + off, n)) << u.entries[k].name;
        }
      }
    }
  }
  EXPECT_EQ(st.bytes_total(), adamw_bytes);
  st.set_update_rule(rt::UpdateRule::muon);
  // Muon updates whole units in place: a range, or a previous shadow, is refused
  rt::StateUnit& u = st.units()[1];
  const std::vector<float> g = unit_grad(u, 2);
  o.t = 2;
  rt::test::expect_error([&] { rt::update_unit_range(u, 0, 256, g.data(), o, 1.0f, nullptr); },
                         {"Muon orthogonalises whole matrices", u.name});
}

// planned_bytes knows the packed v: equal to what a Muon state holds, fp32,
// 8-bit and 4-bit, with and without gradients.
TEST(Muon, PlannedBytesEqualTheState) {
  for (rt::MomentStorage mo : {rt::MomentStorage::fp32, rt::MomentStorage::q8, rt::MomentStorage::q4})
    for (bool grads : {false, true}) {
      rt::HostState st(spec(), grads, mo);
      st.set_update_rule(rt::UpdateRule::muon);
      EXPECT_EQ(st.bytes_total(),
                rt::HostState::planned_bytes(spec(), rt::MasterStorage::fp32, 0, grads, mo, rt::UpdateRule::muon));
      EXPECT_LT(st.bytes_total(), rt::HostState::planned_bytes(spec(), rt::MasterStorage::fp32, 0, grads, mo));
    }
}

}  // namespace
