// Folded updates (--grads fold, engine/fold_clip.h) on the CPU backend, the
// twin of the CUDA engine's: units update in fold_order, each clipped by the
// norm of the gradients folded up to it.
//  - FoldClip: the order, coefficients equal to clip_coefficient of the
//    partial norm, 1 while the partial norm is within the bound, non-finite
//    units skipped and left out of the sums;
//  - without clipping, or with a bound no step reaches, fold trains bit-
//    identically to global clipping (losses, norms, weights);
//  - on clipped steps fold follows its rule exactly (a reference written out
//    here from compute_grads + update_unit) and differs from global clipping;
//  - a non-finite loss (inject_nan) updates nothing; delayed update refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/fold_clip.h"
#include "optim/adamw.h"
#include "optim/unit_update.h"
#include "testutil.h"

namespace {

rt::ModelSpec small_spec() {
  rt::ModelSpec s = rt::test::llama_spec(32, 64, 3, 4, 2, 8, 258);
  s.rms_eps = 1e-5;
  return s;
}

std::vector<rt::Batch> fixed_batches(int64_t k, int64_t* nv) {
  rt::DatasetOptions o;
  o.seq_len = 32;
  o.seed = 7;
  rt::Dataset d(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), o);
  std::vector<rt::Batch> v;
  *nv = 0;
  for (int64_t i = 0; i < k; ++i) {
    v.push_back(d.next_batch(2));
    for (int32_t t : v.back().targets) *nv += t != rt::ignore_target;
  }
  return v;
}

using rt::test::all_masters;

struct FoldRun {
  std::vector<double> loss, norm;
  std::vector<bool> applied;
  std::vector<float> w;
};

// 3 steps of 2 micro-batches on the same batches, lr 1e-2 (clipped updates differ visibly).
FoldRun train(bool fold, double clip, bool nan_on_step2 = false) {
  rt::HostState st(small_spec(), true);
  st.init_random(4, 0.05f);
  auto be = rt::make_cpu_backend(st, false, 0, false, 0, fold);
  int64_t nv = 0;
  const auto batches = fixed_batches(2, &nv);
  FoldRun r;
  rt::OptimStep o;
  o.lr = 1e-2;
  o.clip = clip;
  for (int i = 0; i < 3; ++i) {
    o.t = i + 1;
    o.inject_nan = nan_on_step2 && i == 1;
    const rt::StepStats s = be->train_step(batches, nv, o);
    r.loss.push_back(s.loss_sum);
    r.norm.push_back(s.grad_norm);
    r.applied.push_back(s.applied);
  }
  be->sync();
  r.w = all_masters(st);
  return r;
}

TEST(FoldClip, OrderIsTheLayersFromTheLastThenEmbeddingThenHead) {
  const std::vector<size_t> want{3, 2, 1, 0, 4};
  EXPECT_EQ(rt::fold_order(3), want);
}

TEST(FoldClip, CoefficientsFollowThePartialNorm) {
  const double sq[] = {0.25, 0.5, 1.0, 4.0};  // partial norms 0.5, 0.866, 1.323, 2.398
  rt::FoldClip within(10.0), off(0.0), tight(1.0);
  double part = 0;
  for (double q : sq) {
    part += q;
    EXPECT_EQ(within.next(q), 1.0f);  // every partial norm is within 10
    EXPECT_EQ(off.next(q), 1.0f);     // no clipping
    const float c = tight.next(q);
    EXPECT_EQ(c, rt::clip_coefficient(std::sqrt(part), 1.0));
  }
  EXPECT_DOUBLE_EQ(tight.sumsq(), 5.75);
  EXPECT_TRUE(tight.all_finite());
  // the first two stay within 1 (coef 1), the last two are clipped, the last one hardest
  rt::FoldClip again(1.0);
  EXPECT_EQ(again.next(0.25), 1.0f);
  EXPECT_EQ(again.next(0.5), 1.0f);
  const float c3 = again.next(1.0), c4 = again.next(4.0);
  EXPECT_LT(c3, 1.0f);
  EXPECT_LT(c4, c3);
}

TEST(FoldClip, NonFiniteUnitsAreSkippedAndLeftOutOfTheSums) {
  rt::FoldClip c(1.0);
  EXPECT_EQ(c.next(0.25), 1.0f);
  EXPECT_EQ(c.next(std::numeric_limits<double>::quiet_NaN()), 0.0f);
  EXPECT_EQ(c.next(std::numeric_limits<double>::infinity()), 0.0f);
  EXPECT_EQ(c.next(0.5), 1.0f);  // 0.75 so far: the skipped ones did not count
  EXPECT_FALSE(c.all_finite());
  EXPECT_DOUBLE_EQ(c.sumsq(), 0.75);
}

TEST(FoldCpu, WithoutClippingItIsBitIdenticalToTheGlobalUpdate) {
  for (double clip : {0.0, 1e9}) {
    const FoldRun g = train(false, clip), f = train(true, clip);
    EXPECT_EQ(g.loss, f.loss) << "clip " << clip;
    EXPECT_EQ(g.norm, f.norm) << "clip " << clip;
    EXPECT_TRUE(g.w == f.w) << "clip " << clip;
  }
}

TEST(FoldCpu, ClippedStepsFollowThePartialNormRule) {
  // A bound below every step's norm: the reference applies the rule by hand
  // (units in the order 3, 2, 1, 0, 4; coefficient from the running sum of
  // their squares) on gradients from compute_grads.
  const double clip = 0.05;
  const FoldRun f = train(true, clip), g = train(false, clip);
  ASSERT_GT(g.norm[0], clip);
  rt::HostState st(small_spec(), true);
  st.init_random(4, 0.05f);
  auto be = rt::make_cpu_backend(st, false, 0);
  int64_t nv = 0;
  const auto batches = fixed_batches(2, &nv);
  rt::OptimStep o;
  o.lr = 1e-2;
  o.clip = clip;
  auto& units = st.units();
  for (int i = 0; i < 3; ++i) {
    o.t = i + 1;
    be->compute_grads(batches, nv);
    double run = 0;
    for (size_t u : {3, 2, 1, 0, 4}) {
      run += rt::sum_squares(units[u].grad.p, units[u].numel);
      const float c = rt::clip_coefficient(std::sqrt(run), clip);
      rt::update_unit(units[u], units[u].grad.p, o, c, nullptr);
    }
  }
  EXPECT_TRUE(all_masters(st) == f.w);
  EXPECT_FALSE(g.w == f.w) << "fold clipped exactly like global clipping: the test would not see the rule";
  EXPECT_EQ(f.loss[0], g.loss[0]);  // the first step's forward is on the same weights
}

TEST(FoldCpu, ANonFiniteLossUpdatesNothing) {
  const FoldRun f = train(true, 1.0, /*nan_on_step2=*/true);
  EXPECT_TRUE(f.applied[0]);
  EXPECT_FALSE(f.applied[1]);
  EXPECT_TRUE(f.applied[2]);
  // skipping step 2 leaves the weights after step 1: step 3 sees step 1's loss landscape again,
  // so its loss equals the loss of the run's step 2 without the injection
  const FoldRun clean = train(true, 1.0);
  EXPECT_EQ(f.loss[2], clean.loss[1]);
}

TEST(FoldCpu, DelayedUpdateIsRefused) {
  rt::HostState st(small_spec(), true);
  EXPECT_THROW(rt::make_cpu_backend(st, true, 0, false, 0, true), rt::Error);
}

}  // namespace
