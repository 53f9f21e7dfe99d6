// Data parallelism with the optimizer state sharded over ranks, on the CPU
// twin (engine/sharded_optimizer.h, engine/data_parallel_cpu.h):
//  - the shard layout: 4096-aligned contiguous slices in rank order that
//    partition every unit;
//  - the sharded step alone is bit-identical to the serial one it stands for
//    (gradients summed in rank order, update_unit over the whole unit);
//  - N = 2 and 4 ranks with micro-batch B each against one process with
//    micro-batch N*B (rows in rank order): equal up to fp32 summation order
//    (bounds below), and bit-identical run to run;
//  - host bytes: the slices hold 12 B per element once over all ranks;
//  - a non-finite loss skips the update on every rank; bad splits refused;
//  - a GPU rank's pieces (CudaOptions::dp): its weights-only state, its
//    chunked slice updates and its step totals, against the same references.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "dist/loopback.h"
#include "engine/backend.h"
#include "engine/data_parallel_cpu.h"
#include "engine/sharded_optimizer.h"
#include "model/spec.h"
#include "optim/adamw.h"
#include "testutil.h"

namespace {

rt::ModelSpec small_spec() {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 32;
  s.intermediate = 64;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  s.vocab = 258;
  s.rms_eps = 1e-5;
  s.max_positions = 64;
  return s;
}

// `steps` global batches of `rows` rows of 16 tokens each.
std::vector<rt::Batch> global_batches(int steps, int64_t rows) {
  rt::DatasetOptions o;
  o.seq_len = 16;
  o.seed = 11;
  rt::Dataset d(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), o);
  std::vector<rt::Batch> v;
  for (int i = 0; i < steps; ++i) v.push_back(d.next_batch(rows));
  return v;
}

// Rows [r*n, (r+1)*n) of b.
rt::Batch rows_of(const rt::Batch& b, int64_t r, int64_t n) {
  rt::Batch x;
  x.B = n;
  x.T = b.T;
  x.inputs.assign(b.inputs.begin() + r * n * b.T, b.inputs.begin() + (r + 1) * n * b.T);
  x.targets.assign(b.targets.begin() + r * n * b.T, b.targets.begin() + (r + 1) * n * b.T);
  return x;
}

int64_t valid(const rt::Batch& b) {
  int64_t n = 0;
  for (int32_t t : b.targets) n += t != rt::ignore_target;
  return n;
}

std::vector<float> all_masters(const rt::HostState& st) {
  std::vector<float> w;
  for (auto& u : st.units()) {
    std::vector<float> x(static_cast<size_t>(u.numel));
    u.read_master(0, u.numel, x.data());
    w.insert(w.end(), x.begin(), x.end());
  }
  return w;
}

struct TrainRun {
  std::vector<double> loss, norm;
  std::vector<float> w, w0, mv;  // mv: every unit's m then v
};

rt::OptimStep step_opts(int t, double clip) {
  rt::OptimStep o;
  o.lr = 1e-3;
  o.t = t;
  o.weight_decay = 0.1;
  o.clip = clip;
  return o;
}

// world == 0: one process (the CPU backend) with one micro-batch of every row
// (accum > 0: `accum` micro-batches of rows/accum rows instead);
// world >= 1: DataParallelCpu, rank r with one micro-batch of rows [r*B, (r+1)*B).
TrainRun train(int world, int64_t rows, double clip, int steps = 3, int accum = 0) {
  rt::HostState st(small_spec(), true);
  st.init_random(5, 0.05f);
  TrainRun r;
  r.w0 = all_masters(st);
  std::unique_ptr<rt::Backend> be =
      world == 0 ? rt::make_cpu_backend(st, false, 0) : std::make_unique<rt::DataParallelCpu>(st, world, 0);
  const auto gb = global_batches(steps, rows);
  for (int i = 0; i < steps; ++i) {
    std::vector<rt::Batch> mb;
    if (world == 0 && accum == 0) mb.push_back(gb[i]);
    for (int k = 0; k < accum; ++k) mb.push_back(rows_of(gb[i], k, rows / accum));
    for (int k = 0; k < world; ++k) mb.push_back(rows_of(gb[i], k, rows / world));
    const rt::StepStats s = be->train_step(mb, valid(gb[i]), step_opts(i + 1, clip));
    EXPECT_TRUE(s.applied);
    EXPECT_EQ(s.n_valid, valid(gb[i]));
    r.loss.push_back(s.loss_sum);
    r.norm.push_back(s.grad_norm);
  }
  be->sync();
  r.w = all_masters(st);
  for (auto& u : st.units()) r.mv.insert(r.mv.end(), u.m(), u.m() + 2 * u.numel);
  return r;
}

TEST(ShardLayout, AlignedContiguousSlicesPartitionEachUnit) {
  for (int64_t numel : {0L, 1L, 4095L, 4096L, 8256L, 100000L, 1L << 22})
    for (int world : {1, 2, 3, 4, 8}) {
      const int64_t S = rt::shard_stride(numel, world);
      EXPECT_EQ(S % rt::kShardAlign, 0);
      EXPECT_GE(S * world, numel);
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const rt::ShardRange x = rt::shard_range(numel, world, r);
        EXPECT_EQ(x.b, next) << numel << " / " << world << " rank " << r;
        EXPECT_LE(x.e - x.b, S);
        if (x.e > x.b) {
          EXPECT_EQ(x.b % rt::kShardAlign, 0);
        }
        next = x.e;
      }
      EXPECT_EQ(next, numel);
      // a slice is 1/world of the unit rounded up to the alignment, never more
      EXPECT_LT(S, (numel + world - 1) / world + rt::kShardAlign + 1);
    }
  EXPECT_THROW(rt::shard_range(10, 2, 2), rt::Error);
}

// Qwen2.5-7B: per rank, 12/N B/param of state + 4/N of reduced gradient
// slices + the full weights (2 B/param as bf16), to within the slices'
// rounding to 16384 elements (30 units x 16384 x 16 B = 7.9 MB, 0.1%).
TEST(ShardedOptimizer, HostBytesPerRankShrinkWithTheRankCount) {
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  const double P = static_cast<double>(rt::HostState::planned_bytes(s, rt::MasterStorage::fp32, 0, false)) / 12;
  for (int world : {1, 2, 4, 8}) {
    uint64_t state_sum = 0;
    for (int r = 0; r < world; ++r) {
      const double got = static_cast<double>(rt::dp_rank_host_bytes(s, world, r, 2));
      const double want = P * (16.0 / world + 2);
      EXPECT_LE(got, want * 1.001) << "world " << world << " rank " << r;
      if (r == 0) {
        EXPECT_GE(got, want) << "rank 0's slices are full ones";
      }
      state_sum += rt::dp_rank_host_bytes(s, world, r, 0);
    }
    // the state over all ranks: 12 B per element once, plus the padded gradient slices
    EXPECT_GE(static_cast<double>(state_sum), 16 * P);
    EXPECT_LE(static_cast<double>(state_sum), 16 * P * 1.001 + world * 30.0 * 16384 * 4);
  }
}

// Every rank's replica gets its own random gradients; the sharded step must
// equal summing them in rank order and updating every whole unit serially.
TEST(ShardedOptimizer, StepIsBitIdenticalToTheSerialUpdate) {
  for (int world : {2, 3, 4})
    for (double clip : {0.0, 0.05}) {
      rt::HostState ref(small_spec(), true);
      ref.init_random(3, 0.05f);
      for (auto& u : ref.units()) {  // nonzero moments: a resumed state
        const auto m = rt::test::random_vec(u.numel, 7, 0.f, 1e-3f), v = rt::test::random_vec(u.numel, 8, 0.f, 1e-6f);
        std::memcpy(u.m(), m.data(), m.size() * 4);
        std::memcpy(u.v(), v.data(), v.size() * 4);
      }
      std::vector<std::unique_ptr<rt::HostState>> reps;
      std::vector<std::unique_ptr<rt::ShardedOptimizer>> shards;
      for (int r = 0; r < world; ++r) {
        reps.push_back(std::make_unique<rt::HostState>(small_spec(), true));
        shards.push_back(std::make_unique<rt::ShardedOptimizer>(ref, world, r));
        for (size_t k = 0; k < ref.units().size(); ++k) {
          auto& u = reps[r]->units()[k];
          std::memcpy(u.master(), ref.units()[k].master(), u.numel * 4);
          const auto g = rt::test::random_vec(u.numel, 100 * r + k, -1e-2f, 1e-2f);
          std::memcpy(u.grad.p, g.data(), g.size() * 4);
        }
      }
      const rt::OptimStep o = step_opts(4, clip);
      std::mutex mu;
      std::vector<rt::ShardedStepResult> res(world);
      rt::LoopbackWorld lw(world);
      lw.run([&](rt::Collective& c) {
        res[c.rank()] = shards[c.rank()]->step(c, *reps[c.rank()], 1.0 + c.rank(), o, mu);
      });
      // the serial reference
      double sq = 0;
      std::vector<std::vector<float>> g(ref.units().size());
      for (size_t k = 0; k < ref.units().size(); ++k) {
        g[k].assign(ref.units()[k].numel, 0.0f);
        for (int r = 0; r < world; ++r)
          for (int64_t i = 0; i < ref.units()[k].numel; ++i) g[k][i] += reps[r]->units()[k].grad.p[i];
        sq += rt::sum_squares(g[k].data(), ref.units()[k].numel);
      }
      EXPECT_EQ(res[0].grad_norm, std::sqrt(sq));  // one process's norm, bit for bit
      EXPECT_EQ(res[0].loss_sum, world * (world + 1) / 2.0);
      const float coef = rt::clip_coefficient(res[0].grad_norm, clip);
      if (clip > 0) {
        EXPECT_LT(coef, 1.0f) << "the clipped case must clip";
      }
      for (size_t k = 0; k < ref.units().size(); ++k) rt::update_unit(ref.units()[k], g[k].data(), o, coef, nullptr);
      const std::vector<float> want = all_masters(ref);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(std::memcmp(&res[r].grad_norm, &res[0].grad_norm, 8), 0);
        EXPECT_TRUE(all_masters(*reps[r]) == want) << "world " << world << " rank " << r << " clip " << clip;
      }
      rt::HostState back(small_spec(), false);
      for (auto& s : shards) s->write_into(back);
      EXPECT_TRUE(all_masters(back) == want);
      for (size_t k = 0; k < ref.units().size(); ++k) {
        const auto& a = back.units()[k];
        const auto& b = ref.units()[k];
        EXPECT_EQ(std::memcmp(a.m(), b.m(), b.numel * 4), 0) << "m of " << b.name;
        EXPECT_EQ(std::memcmp(a.v(), b.v(), b.numel * 4), 0) << "v of " << b.name;
      }
    }
}

TEST(ShardedOptimizer, SlicesHoldTwelveBytesPerElementOnceOverTheRanks) {
  rt::HostState st(small_spec(), false);
  uint64_t numel = 0;
  for (auto& u : st.units()) numel += u.numel;
  for (int world : {1, 2, 4}) {
    uint64_t total = 0;
    for (int r = 0; r < world; ++r) {
      const rt::ShardedOptimizer s(st, world, r);
      total += s.state_bytes();
      // at most a 1/world share of each unit rounded up to the alignment
      uint64_t cap = 0;
      for (auto& u : st.units()) cap += 12 * rt::shard_stride(u.numel, world);
      EXPECT_LE(s.state_bytes(), cap);
    }
    EXPECT_EQ(total, 12 * numel) << "world " << world;
  }
}

// One process accumulating N micro-batches of B rows adds each micro-batch's
// gradient, computed whole, to the arena in micro-batch order (every CPU op's
// backward adds its micro-batch's sum in one +=: cpu/ops.cpp); the loopback
// reduce-scatter adds the ranks' gradients in rank order: the same sums in
// the same order, so gradients, norms (engine/sharded_optimizer.h), losses,
// weights and moments are bit-identical, clipped or not.
TEST(DataParallelCpu, MatchesGradientAccumulationBitForBit) {
  for (int world : {2, 4})
    for (double clip : {0.0, 1.0}) {
      const TrainRun one = train(0, 4, clip, 3, world), dp = train(world, 4, clip);
      if (clip > 0) {
        EXPECT_GT(one.norm[0], clip) << "the clipped case must clip";
      }
      EXPECT_EQ(dp.loss, one.loss) << "world " << world << " clip " << clip;
      EXPECT_EQ(dp.norm, one.norm) << "world " << world << " clip " << clip;
      EXPECT_TRUE(dp.w == one.w) << "world " << world << " clip " << clip;
      EXPECT_TRUE(dp.mv == one.mv) << "moments, world " << world << " clip " << clip;
      EXPECT_FALSE(dp.w == dp.w0) << "the run must train";
    }
}

// Against one micro-batch of N*B rows: the GEMMs' weight gradients sum over
// N*B*T rows in one blocking instead of N partials of B*T rows, and the loss
// sums its tokens in another grouping: equal up to fp32 summation order, not
// bit for bit. Bounds: losses and norms relative 1e-6 (the rounding of sums
// of <= 64 fp32 terms, ~64 * 6e-8 = 4e-6 at worst, observed ~3e-9); weights:
// the L2 norm of the difference at most 1e-4 of the L2 norm of the update
// (Adam divides by sqrt(v), so a per-element bound would not be principled;
// observed ~4e-7). A run that saw only rank 0's rows is far outside them.
TEST(DataParallelCpu, MatchesOneLargeMicroBatchUpToSummationOrder) {
  auto update_rel = [](const TrainRun& a, const TrainRun& ref) {
    double d = 0, u = 0;
    for (size_t i = 0; i < ref.w.size(); ++i) {
      d += std::pow(double(a.w[i]) - ref.w[i], 2);
      u += std::pow(double(ref.w[i]) - ref.w0[i], 2);
    }
    return std::sqrt(d / u);
  };
  const TrainRun one = train(0, 4, 1.0);
  for (int world : {2, 4}) {
    const TrainRun dp = train(world, 4, 1.0);
    for (size_t i = 0; i < one.loss.size(); ++i) {
      EXPECT_NEAR(dp.loss[i], one.loss[i], 1e-6 * std::fabs(one.loss[i])) << "world " << world << " step " << i;
      EXPECT_NEAR(dp.norm[i], one.norm[i], 1e-6 * one.norm[i]) << "world " << world << " step " << i;
    }
    EXPECT_LT(update_rel(dp, one), 1e-4) << "world " << world;
  }
  const TrainRun half = train(0, 2, 1.0);  // the first two rows of each batch only
  EXPECT_GT(update_rel(half, one), 1e-2) << "the bound would not see a rank's gradient missing";
}

TEST(DataParallelCpu, TiedEmbeddingsAgreeUpToSummationOrder) {
  // Tied: one process adds micro-batch k's LM-head and embedding terms to the
  // shared table one after the other; ranks add (head + embedding) per rank:
  // another order, so the accumulation bound above applies, not bit-identity.
  auto run = [](int world) {
    rt::ModelSpec s = small_spec();
    s.tie_embeddings = true;
    rt::HostState st(s, true);
    st.init_random(5, 0.05f);
    std::unique_ptr<rt::Backend> be =
        world == 0 ? rt::make_cpu_backend(st, false, 0) : std::make_unique<rt::DataParallelCpu>(st, world, 0);
    const auto gb = global_batches(2, 4);
    std::vector<double> loss;
    for (int i = 0; i < 2; ++i) {
      std::vector<rt::Batch> mb;
      for (int k = 0; k < 4; ++k) mb.push_back(rows_of(gb[i], k, 1));
      loss.push_back(be->train_step(mb, valid(gb[i]), step_opts(i + 1, 1.0)).loss_sum);
    }
    be->sync();
    return std::make_pair(loss, all_masters(st));
  };
  const auto one = run(0), dp = run(4);
  EXPECT_EQ(dp.first[0], one.first[0]);  // the first forward: the same weights, the same loss order
  EXPECT_NEAR(dp.first[1], one.first[1], 1e-6 * one.first[1]);
  // 1e-6: a thousandth of lr, the size of one Adam step per element (observed:
  // ~800 of 35k elements differ, by at most 1.5e-8)
  EXPECT_TRUE(rt::test::expect_near("tied weights", dp.second, one.second, 1e-6, 0));
  EXPECT_FALSE(dp.second == one.second) << "tied embeddings agree bit for bit: update the comment above";
}

TEST(DataParallelCpu, ANonFiniteLossSkipsTheStepOnEveryRank) {
  rt::HostState st(small_spec(), true);
  st.init_random(5, 0.05f);
  const std::vector<float> w0 = all_masters(st);
  rt::DataParallelCpu dp(st, 2, 0);
  const auto gb = global_batches(1, 2);
  rt::OptimStep o = step_opts(1, 1.0);
  o.inject_nan = true;
  const rt::StepStats s = dp.train_step({rows_of(gb[0], 0, 1), rows_of(gb[0], 1, 1)}, valid(gb[0]), o);
  EXPECT_FALSE(s.applied);
  dp.sync();
  EXPECT_TRUE(all_masters(st) == w0);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(all_masters(dp.replica(r)) == w0) << "rank " << r;
}

TEST(DataParallelCpu, RefusesSplitsAndModelsItCannotRun) {
  rt::HostState st(small_spec(), true);
  st.init_random(5, 0.05f);
  rt::DataParallelCpu dp(st, 2, 0);
  const auto gb = global_batches(1, 3);
  rt::test::expect_error(
      [&] {
        dp.train_step({rows_of(gb[0], 0, 1), rows_of(gb[0], 1, 1), rows_of(gb[0], 2, 1)}, valid(gb[0]),
                      step_opts(1, 1.0));
      },
      {"3 micro-batches", "2 ranks", "multiple of the rank count"});
  rt::ModelSpec moe = small_spec();
  moe.architecture = "MixtralForCausalLM";
  moe.moe.n_experts = 4;
  moe.moe.top_k = 2;
  moe.moe.expert_intermediate = 16;
  rt::HostState ms(moe, true);
  rt::test::expect_error([&] { rt::DataParallelCpu(ms, 2, 0); }, {"mixture-of-experts", "one process"});
}

}  // namespace

namespace {

// Units of ~100k elements: several kShardAlign blocks per rank's slice.
rt::ModelSpec mid_spec() {
  rt::ModelSpec s = small_spec();
  s.hidden = 128;
  s.intermediate = 256;
  s.n_heads = 8;
  s.n_kv_heads = 4;
  s.head_dim = 16;
  return s;
}

void random_moments(rt::HostState& st) {
  for (auto& u : st.units()) {
    const auto m = rt::test::random_vec(u.numel, 7 + u.index, 0.f, 1e-3f),
               v = rt::test::random_vec(u.numel, 8 + u.index, 0.f, 1e-6f);
    std::memcpy(u.m(), m.data(), m.size() * 4);
    std::memcpy(u.v(), v.data(), v.size() * 4);
  }
}

}  // namespace

// A GPU rank (CudaOptions::dp) takes its slices and leaves its state weights
// only, unit by unit: the slices are those the CPU twin takes, the state keeps
// the master's bf16 (rounded to nearest) in one shadow per unit, ~2 B/param,
// and refuses to hand out moments.
TEST(ShardedOptimizer, AGpuRankKeepsItsSlicesAndBf16WeightsOnly) {
  for (rt::MasterStorage ms : {rt::MasterStorage::fp32, rt::MasterStorage::split})
    for (int world : {2, 3}) {
      rt::HostState ref(mid_spec(), false);
      ref.init_random(4, 0.05f);
      random_moments(ref);
      ref.set_master_storage(ms);
      for (int r = 0; r < world; ++r) {
        rt::HostState st(mid_spec(), false);
        st.init_random(4, 0.05f);
        random_moments(st);
        st.set_master_storage(ms);
        const rt::ShardedOptimizer want(ref, world, r);
        rt::ShardedOptimizer got(st, world, r, rt::ShardedOptimizer::WeightsOnly{});
        ASSERT_TRUE(st.weights_only());
        uint64_t shadow_bytes = 0;
        for (size_t k = 0; k < st.units().size(); ++k) {
          const auto& a = got.shards()[k];
          const auto& b = want.shards()[k];
          ASSERT_EQ(a.numel, b.numel);
          EXPECT_EQ(std::memcmp(a.arena.p, b.arena.p, static_cast<size_t>(3 * a.numel) * 4), 0) << b.name;
          const auto& u = st.units()[k];
          std::vector<float> x(u.numel), y(u.numel);
          u.read_master(0, u.numel, x.data());
          ref.units()[k].read_master(0, u.numel, y.data());
          for (int64_t i = 0; i < u.numel; ++i)
            ASSERT_EQ(x[i], rt::bf16_to_f32(rt::f32_to_bf16(y[i]))) << u.name << " element " << i;
          EXPECT_THROW(u.m(), rt::Error);
          shadow_bytes += (static_cast<uint64_t>(u.numel) * 2 + 4095) / 4096 * 4096;
        }
        EXPECT_LE(st.bytes_total(), shadow_bytes) << "only the bf16 weights remain";
        EXPECT_GE(st.bytes_total(), 2 * static_cast<uint64_t>(st.n_params()));
      }
    }
}

// The GPU rank's update (engine/cuda/optimizer_phase.cpp): each unit's slice
// in the engine's chunks, each chunk's reduced gradient from a ring buffer,
// through update_piece. Against update_unit over whole units with the sum of
// the ranks' gradients: the same masters, moments and bf16 weights, bit for bit.
TEST(ShardedOptimizer, GpuRankPiecesEqualTheWholeUnitUpdate) {
  const int world = 3;
  rt::HostState ref(mid_spec(), false);
  ref.init_random(6, 0.05f);
  random_moments(ref);
  std::vector<std::vector<float>> g;
  for (auto& u : ref.units()) g.push_back(rt::test::random_vec(u.numel, 50 + u.index, -1e-2f, 1e-2f));
  const rt::OptimStep o = step_opts(3, 0.0);
  const float coef = 0.75f;  // a clipped step
  std::vector<std::unique_ptr<rt::ShardedOptimizer>> shards;
  std::vector<std::vector<uint16_t>> shadow;
  for (int r = 0; r < world; ++r) shards.push_back(std::make_unique<rt::ShardedOptimizer>(ref, world, r));
  for (auto& u : ref.units()) shadow.emplace_back(static_cast<size_t>(u.numel), uint16_t{0});
  const int64_t chunk = 4096 * 3;  // the engine's chunks: 4096-aligned, smaller than a slice
  for (int r = 0; r < world; ++r)
    for (size_t k = 0; k < ref.units().size(); ++k) {
      const rt::ShardRange sr = shards[r]->range(k);
      for (int64_t b = sr.b; b < sr.e; b += chunk) {
        const int64_t e = std::min(sr.e, b + chunk);
        const std::vector<float> ring(g[k].begin() + b, g[k].begin() + e);  // the landed chunk
        shards[r]->update_piece(k, b, e, ring.data(), o, coef, shadow[k].data());
      }
      EXPECT_THROW(shards[r]->update_piece(k, sr.b, sr.e + 1, g[k].data(), o, coef, nullptr), rt::Error);
    }
  std::vector<std::vector<uint16_t>> want_shadow;
  for (size_t k = 0; k < ref.units().size(); ++k) {
    want_shadow.emplace_back(static_cast<size_t>(ref.units()[k].numel), uint16_t{0});
    rt::update_unit(ref.units()[k], g[k].data(), o, coef, want_shadow[k].data());
  }
  rt::HostState back(mid_spec(), false);
  for (auto& s : shards) s->write_into(back);
  EXPECT_TRUE(all_masters(back) == all_masters(ref));
  for (size_t k = 0; k < ref.units().size(); ++k) {
    const auto& a = back.units()[k];
    const auto& b = ref.units()[k];
    EXPECT_EQ(std::memcmp(a.m(), b.m(), b.numel * 4), 0) << "m of " << b.name;
    EXPECT_EQ(std::memcmp(a.v(), b.v(), b.numel * 4), 0) << "v of " << b.name;
    EXPECT_TRUE(shadow[k] == want_shadow[k]) << "bf16 weights of " << b.name;
  }
}

// The GPU ranks' norm, loss and token totals (dp_all_reduce_totals): every
// rank gets the same doubles, each unit's sum of its slices in rank order,
// and a stop asked by one rank reaches all.
TEST(ShardedOptimizer, GpuRankTotalsAreTheSameDoublesOnEveryRank) {
  const int world = 3;
  const size_t U = 5;
  std::vector<std::vector<double>> sq(world, std::vector<double>(U));
  for (int r = 0; r < world; ++r)
    for (size_t u = 0; u < U; ++u) sq[r][u] = 0.1 * (u + 1) + 1e-3 * r + 1.0 / (7.0 + r * U + u);
  double want_sq = 0;
  for (size_t u = 0; u < U; ++u) {
    double unit = 0;
    for (int r = 0; r < world; ++r) unit += sq[r][u];
    want_sq += unit;
  }
  for (int stopper : {-1, 1}) {
    std::vector<rt::DpTotals> t(world);
    rt::LoopbackWorld lw(world);
    lw.run([&](rt::Collective& c) {
      const int r = c.rank();
      t[r] = rt::dp_all_reduce_totals(c, sq[r], 2.5 * (r + 1), 100 + r, r == stopper);
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(t[r].sq, want_sq);
      EXPECT_EQ(t[r].loss_sum, 2.5 + 5.0 + 7.5);
      EXPECT_EQ(t[r].n_valid, 303);
      EXPECT_EQ(t[r].stop, stopper >= 0);
    }
  }
}

// A fresh GPU rank (not a resume) starts from a state with a split master and
// 4-bit moments it never reads (cli/train.cpp): its slices hold the fp32
// init exactly and zero moments, as a full fp32 state's would.
TEST(ShardedOptimizer, AFreshGpuRankStartsFromTheSplitInitWithZeroMoments) {
  rt::HostState ref(mid_spec(), false);
  ref.init_random(9, 0.05f);
  for (int r = 0; r < 2; ++r) {
    rt::HostState lean(mid_spec(), false, rt::MomentStorage::q4, rt::MasterStorage::split);
    lean.init_random(9, 0.05f);
    const rt::ShardedOptimizer want(ref, 2, r);
    rt::ShardedOptimizer got(lean, 2, r, rt::ShardedOptimizer::WeightsOnly{true});
    EXPECT_TRUE(lean.weights_only());
    EXPECT_EQ(lean.moment_storage(), rt::MomentStorage::fp32) << "the 4-bit start-up moments are gone";
    EXPECT_EQ(lean.bytes_total(), [&] {
      uint64_t b = 0;
      for (auto& u : lean.units()) b += (static_cast<uint64_t>(u.numel) + 1) / 2 * 4;  // bf16 pairs, as counted
      return b;
    }()) << "only the bf16 weights remain";
    for (size_t k = 0; k < ref.units().size(); ++k) {
      const auto& a = got.shards()[k];
      const auto& b = want.shards()[k];
      ASSERT_EQ(a.numel, b.numel);
      EXPECT_EQ(std::memcmp(a.arena.p, b.arena.p, static_cast<size_t>(3 * a.numel) * 4), 0) << b.name;
    }
  }
}

// Units of ~1M elements on a pool of 4 threads: a rank's start-up copies run
// on the pool, and a split or bf16 master's decode runs on the pool itself
// (it is not reentrant): taking the slices must not nest the two (it hung
// the first time: a 7B rank never started).
TEST(ShardedOptimizer, LargeUnitsOfEveryMasterStorageTakeTheirSlicesOnThePool) {
  rt::set_global_threads(4);
  rt::ModelSpec s = mid_spec();
  s.hidden = 256;
  s.intermediate = 1024;
  s.head_dim = 32;
  for (rt::MasterStorage ms : {rt::MasterStorage::fp32, rt::MasterStorage::split, rt::MasterStorage::bf16_sr,
                               rt::MasterStorage::bf16_kahan}) {
    rt::HostState ref(s, false, rt::MomentStorage::fp32, ms);
    ref.init_random(2, 0.05f);
    rt::HostState st(s, false, rt::MomentStorage::fp32, ms);
    st.init_random(2, 0.05f);
    ASSERT_GT(st.units()[1].numel, int64_t{1} << 19);
    const rt::ShardedOptimizer want(ref, 2, 0);
    rt::ShardedOptimizer got(st, 2, 0, rt::ShardedOptimizer::WeightsOnly{});
    for (size_t k = 0; k < st.units().size(); ++k)
      EXPECT_EQ(std::memcmp(got.shards()[k].arena.p, want.shards()[k].arena.p,
                            static_cast<size_t>(3 * want.shards()[k].numel) * 4),
                0)
          << rt::master_storage_name(ms) << " " << want.shards()[k].name;
  }
}
