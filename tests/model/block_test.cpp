// The decoder block template (model/block.h) on the CPU backend, with MLP
// token chunks (BlockDims::mlp_chunk_tokens) against the unchunked block:
//  - a chunk >= N, and the recompute forward (y == nullptr), are the same op
//    calls on the same inputs: bit-identical outputs and gradients;
//  - chunks < N regroup the token sums of the MLP weight gradients (fp32
//    rounding only): close within a justified tolerance;
//  - central finite differences of L = sum(y * r) against the chunked
//    backward (dy = r) for the block input and weights of every kind;
//  - buffers sized for other dims are refused.
// Every buffer the backward reads or writes is poisoned with NaN first, so a
// chunk that reads memory it did not fill shows as NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "cpu/cpu_ops.h"
#include "state/host_state.h"
#include "model/block.h"
#include "testutil.h"

namespace {

using Acts = rt::BlockActs<rt::CpuOps>;
using Scratch = rt::BlockScratch<rt::CpuOps>;

rt::ModelSpec tiny_spec(rt::Family f) {
  rt::ModelSpec s;
  s.family = f;
  s.hidden = 16;
  s.intermediate = 24;
  s.n_layers = 1;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 4;
  s.vocab = 11;
  s.rms_eps = 1e-5;
  s.max_positions = 64;
  s.rope.theta = 100.0;
  if (f == rt::Family::qwen2) {
    s.architecture = "Qwen2ForCausalLM";
    s.qkv_bias = true;
  }
  if (f == rt::Family::qwen3) {
    s.architecture = "Qwen3ForCausalLM";
    s.qk_norm = true;
    s.head_dim = 6;
  }
  if (f == rt::Family::granite) {  // multipliers away from 1 (and from each other)
    s.architecture = "GraniteForCausalLM";
    s.embedding_multiplier = 1.7;
    s.residual_multiplier = 0.6;
    s.logits_scaling = 1.9;
    s.attention_scale = 0.3;
  }
  if (f == rt::Family::smollm3) {  // the one layer without RoPE
    s.architecture = "SmolLM3ForCausalLM";
    s.rope_layers = {0};
  }
  if (f == rt::Family::olmo2) {  // post-branch norms, q/k norms over the whole projection
    s.architecture = "Olmo2ForCausalLM";
    s.qk_norm = s.qk_norm_whole = s.post_norms = true;
  }
  return s;
}

// One block's weights (layer 0 of a HostState), an input x, positions and
// an output gradient r (the loss is sum(y * r)).
struct Case {
  rt::ModelSpec spec;
  std::unique_ptr<rt::HostState> state;
  int64_t B = 2, T = 7;
  std::vector<float> x, r;
  std::vector<int32_t> pos;
  int64_t N() const { return B * T; }
};

Case make_case(rt::Family f) {
  Case c;
  c.spec = tiny_spec(f);
  c.state = std::make_unique<rt::HostState>(c.spec, true);
  c.state->init_random(7, 0.5f);
  std::mt19937_64 g(3);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (auto& unit : c.state->units())  // non-trivial norm weights and biases
    for (size_t k = 0; k < unit.entries.size(); ++k)
      if (unit.entries[k].is_norm_or_bias)
        for (int64_t i = 0; i < unit.entries[k].numel(); ++i) unit.master()[unit.offsets[k] + i] += u(g);
  c.x = rt::test::random_vec(c.N() * c.spec.hidden, 5);
  c.r = rt::test::random_vec(c.N() * c.spec.hidden, 6);
  for (int64_t i = 0; i < c.N(); ++i) c.pos.push_back(static_cast<int32_t>(i % c.T));
  return c;
}

rt::StateUnit& layer_unit(Case& c) { return c.state->units()[1]; }

void poison(rt::CpuOps&, const rt::ModelSpec& s, const rt::BlockDims& dm, Acts& t) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Acts::each_buffer(
      s, dm, [&](auto m, int64_t) { std::fill((t.*m).begin(), (t.*m).end(), nan); },
      [&](auto m, int64_t) { std::fill((t.*m).begin(), (t.*m).end(), nan); });
}
void poison(const rt::ModelSpec& s, const rt::BlockDims& dm, Scratch& d) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Scratch::each_buffer(s, dm, [&](auto m, int64_t) { std::fill((d.*m).begin(), (d.*m).end(), nan); });
}

struct Out {
  std::vector<float> y, dx, grads;  // grads: the layer unit's gradient arena
};

// How the block runs: MLP chunk, whether the backward reads the training
// forward's activations or those of a recompute (y == nullptr) into freshly
// poisoned buffers, and whether dx aliases dy (as in the engines).
struct Mode {
  int64_t chunk = 0;
  bool recompute = false;
  bool alias = false;
};

Out run_block(Case& c, Mode m, bool backward = true) {
  const rt::ModelSpec& s = c.spec;
  const int64_t NC = c.N() * s.hidden;
  rt::CpuOps ops(s);
  const rt::BlockDims dm{c.B, c.T, m.chunk};
  Acts t(ops, s, dm);
  Scratch d(ops, s, dm);
  poison(ops, s, dm, t);
  poison(s, dm, d);
  c.state->zero_grads();
  const auto w = c.state->weights().layers[0];
  Out o;
  o.y.assign(static_cast<size_t>(NC), std::numeric_limits<float>::quiet_NaN());
  rt::block_forward(ops, s, w, dm, c.x.data(), o.y.data(), c.pos.data(), t);
  if (!backward) return o;
  if (m.recompute) {
    poison(ops, s, dm, t);
    rt::block_forward(ops, s, w, dm, c.x.data(), nullptr, c.pos.data(), t);
  }
  o.dx = m.alias ? c.r : std::vector<float>(static_cast<size_t>(NC), std::numeric_limits<float>::quiet_NaN());
  const float* dy = m.alias ? o.dx.data() : c.r.data();
  rt::block_backward(ops, s, w, dm, c.x.data(), dy, o.dx.data(), c.pos.data(), t, d, c.state->grads().layers[0]);
  const rt::StateUnit& u = layer_unit(c);
  o.grads.assign(u.grad.p, u.grad.p + u.numel);
  return o;
}

class BlockChunks : public ::testing::TestWithParam<rt::Family> {};

TEST_P(BlockChunks, WholeBatchChunkAndRecomputeAreBitIdentical) {
  Case c = make_case(GetParam());
  const Out ref = run_block(c, {});
  for (float v : ref.grads) ASSERT_TRUE(std::isfinite(v));
  for (float v : ref.dx) ASSERT_TRUE(std::isfinite(v));
  const int64_t N = c.N();
  const Mode modes[] = {{N, false, false}, {2 * N, false, false}, {0, true, false}, {0, false, true},
                        {N, true, true},   {3, true, false},      {3, true, true}};
  for (size_t i = 0; i < std::size(modes); ++i) {
    const Mode m = modes[i];
    const Out o = run_block(c, m);
    if (m.chunk > 0 && m.chunk < N) {  // chunked: its own reference is the same chunk without recompute/alias
      const Out own = run_block(c, {m.chunk, false, false});
      EXPECT_TRUE(o.y == own.y && o.dx == own.dx && o.grads == own.grads) << "chunk " << m.chunk << " mode " << i;
      continue;
    }
    EXPECT_TRUE(o.y == ref.y) << "mode " << i;
    EXPECT_TRUE(o.dx == ref.dx) << "mode " << i;
    EXPECT_TRUE(o.grads == ref.grads) << "mode " << i;
  }
}

TEST_P(BlockChunks, ChunkedMatchesUnchunkedToFp32Rounding) {
  // Chunks of R < N rows compute the same per-row products; what changes is
  // the grouping of the sums over tokens in the gate/up/down weight gradients
  // (per chunk, then chunk by chunk) and the GEMM row blocking, i.e. fp32
  // re-association only, as in ModelGrad.AccumulatingMicroBatchesEqualsOneBatch.
  // The block is a chain of GEMMs, so the check is norm-wise per tensor
  // (testutil.h, kRegroupRelL2 = 1e-5 and its derivation): the sums here have
  // K <= 24 terms (N = 14 tokens, widths 16..24), ~K u = 1.4e-6 per stage;
  // observed <= 4.3e-7 with OpenBLAS's SkylakeX, Haswell and Zen kernels. An
  // element-wise rtol is no bound here: a small element of a weight gradient
  // is a difference of larger token terms (issue 37: 1e-4 |ref| failed with
  // the Haswell kernels). A dropped or doubled chunk, or a gradient written
  // instead of accumulated, is off by O(1).
  Case c = make_case(GetParam());
  const Out ref = run_block(c, {});
  const rt::StateUnit& u = layer_unit(c);
  for (int64_t chunk : {int64_t{1}, int64_t{3}, int64_t{5}, c.N() - 1}) {
    for (bool recompute : {false, true}) {
      const Out o = run_block(c, {chunk, recompute, false});
      const std::string tag = "chunk " + std::to_string(chunk) + (recompute ? " recompute" : "");
      EXPECT_TRUE(rt::test::expect_regrouped_norm(tag + " y", o.y, ref.y));
      EXPECT_TRUE(rt::test::expect_regrouped_norm(tag + " dx", o.dx, ref.dx));
      for (size_t k = 0; k < u.entries.size(); ++k) {
        const int64_t n = u.entries[k].numel(), off = u.offsets[k];
        EXPECT_TRUE(rt::test::expect_regrouped_norm(tag + " " + u.entries[k].name, o.grads.data() + off,
                                                    ref.grads.data() + off, n));
      }
    }
  }
}

double loss_of(Case& c, int64_t chunk) {
  const Out o = run_block(c, {chunk}, false);
  double l = 0;
  for (size_t i = 0; i < o.y.size(); ++i) l += static_cast<double>(o.y[i]) * c.r[i];
  return l;
}

TEST_P(BlockChunks, ChunkedBackwardMatchesFiniteDifferences) {
  // L = sum(y * r), so dL/dy = r: the chunked backward with dy = r gives
  // dL/dx and dL/dW. Central differences with h = 1e-2 on values of magnitude
  // ~0.5 carry two errors. Truncation, O(h^2 L'''): observed <= 1e-3 of the
  // gradient; bound 2e-2 |analytic|. And the fp32 noise of L: perturbing a
  // value changes the roundings of every y_i r_i, by about an ulp of each, so
  // L moves by ~eps * S with S = sum |y_i r_i| (S ~ 700 here: ~2e-3 on fd,
  // as observed for h from 1e-2 down to 1e-3); bound 4 eps S / 2h.
  Case c = make_case(GetParam());
  const int64_t chunk = 3;  // 14 rows: chunks of 3, 3, 3, 3, 2
  const Out o = run_block(c, {chunk, true, true});
  const float h = 1e-2f;
  double S = 0;
  for (size_t i = 0; i < o.y.size(); ++i) S += std::fabs(static_cast<double>(o.y[i]) * c.r[i]);
  const double noise = 4 * std::numeric_limits<float>::epsilon() * S / (2.0 * h);
  std::mt19937_64 g(11);
  int checked = 0;
  auto check = [&](float* p, float analytic, const std::string& what) {
    const float orig = *p;
    *p = orig + h;
    const double lp = loss_of(c, chunk);
    *p = orig - h;
    const double lm = loss_of(c, chunk);
    *p = orig;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(fd, analytic, noise + 2e-2 * std::fabs(analytic)) << what;
    ++checked;
  };
  for (int rep = 0; rep < 6; ++rep) {
    const int64_t i = static_cast<int64_t>(g() % c.x.size());
    check(&c.x[static_cast<size_t>(i)], o.dx[static_cast<size_t>(i)], "x[" + std::to_string(i) + "]");
  }
  rt::StateUnit& u = layer_unit(c);
  for (size_t k = 0; k < u.entries.size(); ++k)
    for (int rep = 0; rep < 4; ++rep) {
      const int64_t i = u.offsets[k] + static_cast<int64_t>(g() % static_cast<uint64_t>(u.entries[k].numel()));
      check(u.master() + i, o.grads[static_cast<size_t>(i)], u.entries[k].name + "[" + std::to_string(i) + "]");
    }
  EXPECT_GT(checked, 40);
}

TEST_P(BlockChunks, BuffersSizedForOtherDimsAreRefused) {
  Case c = make_case(GetParam());
  rt::CpuOps ops(c.spec);
  const rt::BlockDims sized{c.B, c.T, 4}, other{c.B, c.T, 0};
  Acts t(ops, c.spec, sized);
  Scratch d(ops, c.spec, sized);
  std::vector<float> y(c.x.size());
  const auto w = c.state->weights().layers[0];
  EXPECT_THROW(rt::block_forward(ops, c.spec, w, other, c.x.data(), y.data(), c.pos.data(), t), rt::Error);
  EXPECT_THROW(rt::block_backward(ops, c.spec, w, other, c.x.data(), c.r.data(), y.data(), c.pos.data(), t, d,
                                  c.state->grads().layers[0]),
               rt::Error);
  EXPECT_THROW(Acts(ops, c.spec, rt::BlockDims{c.B, c.T, -1}), rt::Error);
  // a chunk >= N is the whole batch: buffers sized for chunk 0 serve it
  Acts t0(ops, c.spec, other);
  EXPECT_NO_THROW(
      rt::block_forward(ops, c.spec, w, rt::BlockDims{c.B, c.T, c.N()}, c.x.data(), y.data(), c.pos.data(), t0));
}

INSTANTIATE_TEST_SUITE_P(Families, BlockChunks,
                         ::testing::Values(rt::Family::llama, rt::Family::qwen2, rt::Family::qwen3, rt::Family::olmo2,
                                           rt::Family::granite, rt::Family::smollm3),
                         [](const auto& info) { return std::string(rt::family_name(info.param)); });

}  // namespace
