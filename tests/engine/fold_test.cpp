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
//  - a non-finite loss (inject_nan) updates nothing; delayed update refused;
//  - a unit landing in pieces (the CUDA engine's LM head, GradientSink::land)
//    and folded piece by piece with the coefficient of its whole sum of
//    squares equals the whole-unit fold bit for bit (split master, fp32 and
//    8/4-bit moments);
//  - fold_defer_plan (the CUDA engine's deferred folds): the first units in
//    fold order within the share and the byte cap, 16-float aligned offsets,
//    never the last unit; RAMTRAIN_FOLD_DEFER parsed and refused when bad.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/device_plan.h"
#include "engine/update_order.h"
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

TEST(FoldClip, OrderIsTheHeadThenTheLayersFromTheLastThenEmbedding) {
  const std::vector<size_t> want{4, 3, 2, 1, 0};
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

TEST(FoldDefer, TakesTheFirstUnitsWithinTheShareAndTheCap) {
  // fold order: head 100, layers 40, 40, 40, embedding 100 (320 elements)
  const std::vector<int64_t> numel{100, 40, 40, 40, 100};
  rt::FoldDefer d = rt::fold_defer_plan(numel, 0.5, 1ull << 30);  // 160 elements: head (112 aligned) + one layer
  EXPECT_EQ(d.at, (std::vector<int64_t>{0, 112}));
  EXPECT_EQ(d.elems, 160);
  d = rt::fold_defer_plan(numel, 0.5, 150 * 4);  // the cap: the head only
  EXPECT_EQ(d.at, (std::vector<int64_t>{0}));
  EXPECT_EQ(d.elems, 112);
  d = rt::fold_defer_plan(numel, 0.99, 1ull << 30);  // everything but the embedding
  EXPECT_EQ(d.at, (std::vector<int64_t>{0, 112, 160, 208}));
  EXPECT_EQ(d.elems, 256);
  EXPECT_TRUE(rt::fold_defer_plan(numel, 0.2, 1ull << 30).at.empty());  // the head alone is past 64 elements
  EXPECT_TRUE(rt::fold_defer_plan(numel, 0.0, 1ull << 30).at.empty());
  EXPECT_THROW(rt::fold_defer_plan(numel, 1.0, 1ull << 30), std::exception);
  EXPECT_THROW(rt::fold_defer_plan(numel, -0.1, 1ull << 30), std::exception);
}

TEST(FoldDefer, TheShareComesFromTheEnvironment) {
  const char* old = std::getenv("RAMTRAIN_FOLD_DEFER");
  const std::string keep = old ? old : "";
  unsetenv("RAMTRAIN_FOLD_DEFER");
  EXPECT_EQ(rt::fold_defer_share(), rt::kFoldDeferShare);
  setenv("RAMTRAIN_FOLD_DEFER", "0.25", 1);
  EXPECT_EQ(rt::fold_defer_share(), 0.25);
  setenv("RAMTRAIN_FOLD_DEFER", "0", 1);
  EXPECT_EQ(rt::fold_defer_share(), 0.0);
  for (const char* bad : {"1", "-0.5", "half", "0.3x"}) {
    setenv("RAMTRAIN_FOLD_DEFER", bad, 1);
    try {
      rt::fold_defer_share();
      ADD_FAILURE() << "accepted RAMTRAIN_FOLD_DEFER=" << bad;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("RAMTRAIN_FOLD_DEFER"), std::string::npos) << e.what();
    }
  }
  if (old)
    setenv("RAMTRAIN_FOLD_DEFER", keep.c_str(), 1);
  else
    unsetenv("RAMTRAIN_FOLD_DEFER");
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
  // (units in the order 4, 3, 2, 1, 0; coefficient from the running sum of
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
    for (size_t u : {4, 3, 2, 1, 0}) {
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

TEST(FoldPieces, APieceByPieceFoldEqualsTheWholeUnitFold) {
  // The CUDA engine's fold of a unit larger than its landing slabs: the
  // coefficient from the whole gradient's sum of squares (FoldClip::next;
  // the device sums in rt::sum_squares's order, so the same double), then
  // update_unit_range piece by piece over the landing's cut (grad_chunks with
  // gradient_landing_slab_elems) with the shadow written in place. It must
  // equal update_unit over the whole unit: master, moments (codes and
  // scales), shadow. The head (a 1024-row LM head + the final norm) lands in
  // 16384-element pieces, the last one short.
  rt::ModelSpec s = small_spec();
  s.vocab = 1024;
  const size_t head = static_cast<size_t>(s.n_layers + 1);
  rt::CudaOptions co;
  co.landing_slab_bytes = 16384 * 4;
  const int64_t slab = rt::gradient_landing_slab_elems(s, co);
  ASSERT_EQ(slab, 16384);
  for (rt::MomentStorage mo : {rt::MomentStorage::fp32, rt::MomentStorage::q8, rt::MomentStorage::q4}) {
    SCOPED_TRACE(rt::moment_storage_name(mo));
    rt::HostState whole(s, false, mo), pieces(s, false, mo);
    for (rt::HostState* st : {&whole, &pieces}) {
      st->init_random(5, 0.05f);
      st->set_master_storage(rt::MasterStorage::split, 1);
    }
    rt::StateUnit& a = whole.units()[head];
    rt::StateUnit& b = pieces.units()[head];
    const std::vector<rt::GradChunk> cut = rt::grad_chunks(rt::unit_numels(s), {head}, slab);
    ASSERT_EQ(static_cast<int64_t>(cut.size()), (a.numel + slab - 1) / slab);
    ASSERT_GE(cut.size(), 2u);
    ASSERT_NE(a.numel % slab, 0);
    rt::OptimStep o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    o.moment_rounding = rt::QuantRounding::stochastic;  // keyed by the element's index: any cut, the same draws
    std::vector<float> g(static_cast<size_t>(a.numel));
    for (int t = 1; t <= 3; ++t) {
      o.t = t;
      for (int64_t i = 0; i < a.numel; ++i) g[static_cast<size_t>(i)] = static_cast<float>(std::sin(0.013 * i + t));
      const double sq = rt::sum_squares(g.data(), a.numel);
      rt::FoldClip ca(0.5), cb(0.5);  // the norm is ~128: every step clips
      const float coef = ca.next(sq);
      ASSERT_LT(coef, 1.0f);
      rt::update_unit(a, g.data(), o, coef, a.shadow(0));
      const float coef_b = cb.next(sq);
      for (const rt::GradChunk& c : cut) rt::update_unit_range(b, c.b, c.e, g.data() + c.b, o, coef_b, b.shadow(0));
    }
    std::vector<float> ma(static_cast<size_t>(a.numel)), mb(ma.size());
    a.read_master(0, a.numel, ma.data());
    b.read_master(0, b.numel, mb.data());
    EXPECT_EQ(0, std::memcmp(ma.data(), mb.data(), ma.size() * 4)) << "master";
    EXPECT_EQ(0, std::memcmp(a.shadow(0), b.shadow(0), static_cast<size_t>(a.numel) * 2)) << "shadow";
    if (mo == rt::MomentStorage::fp32) {
      EXPECT_EQ(0, std::memcmp(a.m(), b.m(), static_cast<size_t>(2 * a.numel) * 4)) << "moments";
    } else {
      EXPECT_EQ(0, std::memcmp(a.qm(), b.qm(), a.qm_buf.n * 4)) << "m codes";
      EXPECT_EQ(0, std::memcmp(a.qv(), b.qv(), a.qv_buf.n * 4)) << "v codes";
      EXPECT_EQ(0, std::memcmp(a.qscale_buf.p, b.qscale_buf.p, a.qscale_buf.n * 4)) << "scales";
    }
  }
}

}  // namespace
