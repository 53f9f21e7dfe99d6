// Batch.positions reaches the model on the CPU backend. References from the
// math of causal attention with RoPE: (1) explicit positions i % T are the
// default, bit for bit; (2) restarting positions mid-row leaves every token
// before the restart unchanged (causal: it sees only earlier tokens, whose
// positions did not change) and changes the tokens after it (their distances
// to the first part change).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "data/dataset.h"
#include "engine/backend.h"
#include "state/host_state.h"

namespace {

rt::ModelSpec small_spec() {
  rt::ModelSpec s;
  s.hidden = 32;
  s.intermediate = 64;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.vocab = 64;
  s.max_positions = 64;
  return s;
}

rt::Batch make_batch(int64_t T, int64_t first_target, int64_t last_target) {
  rt::Batch b;
  b.B = 1;
  b.T = T;
  for (int64_t i = 0; i < T; ++i) {
    b.inputs.push_back(static_cast<int32_t>((i * 7 + 3) % 64));
    b.targets.push_back(i >= first_target && i < last_target ? static_cast<int32_t>((i * 5 + 1) % 64)
                                                             : rt::ignore_target);
  }
  return b;
}

TEST(BatchPositions, ReachTheCpuModel) {
  rt::HostState st(small_spec(), false);
  st.init_random(3);
  // Sharpen attention: at the init scale scores are near 0 and softmax near
  // uniform, which hides positions; q and k scaled by 6 multiply scores by 36.
  const rt::ModelSpec sp = st.spec();
  for (auto& l : st.weights().layers) {
    for (int64_t i = 0; i < sp.q_dim() * sp.hidden; ++i) const_cast<float*>(l.q_proj)[i] *= 6;
    for (int64_t i = 0; i < sp.kv_dim() * sp.hidden; ++i) const_cast<float*>(l.k_proj)[i] *= 6;
  }
  auto be = rt::make_cpu_backend(st);
  const int64_t T = 32, cut = 12;
  int64_t n = 0;
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, cut}, {cut, T}}) {
    rt::Batch def = make_batch(T, lo, hi);
    rt::Batch expl = def;
    rt::Batch packed = def;
    for (int64_t i = 0; i < T; ++i) {
      expl.positions.push_back(static_cast<int32_t>(i));
      packed.positions.push_back(static_cast<int32_t>(i < cut ? i : i - cut));  // a second example starts at cut
    }
    const double l_def = be->loss_sum(def, &n), l_expl = be->loss_sum(expl, &n), l_packed = be->loss_sum(packed, &n);
    EXPECT_EQ(l_def, l_expl);  // same positions, same arithmetic
    if (lo == 0) {
      // before the restart nothing changed; 1e-6 relative allows a GEMM that blocks rows differently
      EXPECT_NEAR(l_packed, l_def, 1e-6 * std::abs(l_def));
    } else {
      // after it the positions differ: the loss must move well beyond fp32 rounding (~1e-7
      // relative); it moves by ~3.7e-4 relative here
      EXPECT_GT(std::abs(l_packed - l_def), 1e-4 * std::abs(l_def)) << l_packed << " vs " << l_def;
    }
  }
  rt::Batch bad = make_batch(T, 0, T);
  bad.positions = {0, 1};
  EXPECT_THROW(be->loss_sum(bad, &n), rt::Error);
}

}  // namespace
