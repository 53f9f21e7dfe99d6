// The state tier on the CPU backend (state/state_tier.h, --state-dir): a run
// whose units' optimizer state pages through a file gives the all-in-RAM
// run's losses and final state bit for bit -- plain, delayed and folded
// update orders; fp32, 8- and 4-bit moments; bf16-kahan, bf16-sr and Muon --
// under a budget that pages some units and keeps others, under none (every
// unit's optimizer state paged), and under one below the minimum with the
// weights in RAM (every unit's weights and state paged: the backend computes
// on its own fp32 copy, refreshed after each update); at most three units'
// state is in RAM at once; a checkpoint saved from a tiered run is the
// all-in-RAM run's and resumes (tiered) exactly; the weights read for export
// (decode_all) come in clean. Exactness: the losses as
// doubles and the state as bytes, no tolerance (paging moves bytes only).
#include "state/state_tier.h"

#include <gtest/gtest.h>

#include <cstring>

#include "data/dataset.h"
#include "engine/trainer.h"
#include "io/checkpoint.h"
#include "testutil.h"

namespace {

rt::ModelSpec small_byte_spec() {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 64;
  s.intermediate = 172;
  s.n_layers = 3;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 258;
  s.rms_eps = 1e-5;
  s.max_positions = 256;
  s.bos_id = 256;
  s.eos_ids = {257};
  return s;
}

rt::Dataset shakespeare(int64_t T, uint64_t seed) {
  rt::DatasetOptions d;
  d.seq_len = T;
  d.seed = seed;
  return rt::Dataset(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), d);
}

struct Mode {
  const char* name;
  rt::MomentStorage moments = rt::MomentStorage::fp32;
  rt::MasterStorage master = rt::MasterStorage::fp32;
  rt::UpdateRule rule = rt::UpdateRule::adamw;
  bool delayed = false, fold = false;
};

rt::TrainOptions opts(const Mode& m, int64_t steps) {
  rt::TrainOptions o;
  o.steps = steps;
  o.micro_batch = 2;
  o.grad_accum = 1;
  o.clip = 1.0;
  o.weight_decay = 0.1;
  o.lr = rt::make_lr_schedule("cosine", 3e-3, 2, steps, 0.1);
  o.eval_batches = 2;
  o.delayed_update = m.delayed;
  o.fold_grads = m.fold;
  return o;
}

struct TierRun {
  std::vector<double> losses;
  std::vector<uint8_t> state;
  std::vector<float> weights;  // every tensor's fp32 master as an exporter reads it (decode_all, master_view)
  rt::TierPlan plan;
  rt::StateTier::Stats stats;
  std::string ckpt;  // the checkpoint after step kSave
};

constexpr int kSteps = 5, kSave = 3;

// budget: --max-host-memory (0: every unit paged); < 0: all in RAM.
TierRun train(const Mode& m, const std::string& state_dir, int64_t budget, const std::string& out) {
  rt::HostState st(small_byte_spec(), true, m.moments, m.master, m.rule);
  st.init_random(7);
  rt::Dataset data = shakespeare(32, 3);
  rt::TrainOptions o = opts(m, kSteps);
  o.out_dir = out;
  if (budget >= 0) {
    o.state_dir = state_dir;
    o.max_host_memory = static_cast<uint64_t>(budget);
  }
  TierRun r;
  rt::Trainer tr(st, data, o);
  for (int i = 0; i < kSteps; ++i) {
    r.losses.push_back(tr.step().loss);
    if (i + 1 == kSave) r.ckpt = tr.save_checkpoint(false).path;
  }
  tr.save_checkpoint(false);  // a delayed run's last update goes in
  const uint64_t written = tr.state_tier() ? tr.state_tier()->stats().written_bytes : 0;
  st.decode_all();  // as export does: a paged unit's weights read in, clean
  for (const rt::StateUnit& u : st.units())
    for (const rt::WeightEntry& e : u.entries) {
      const float* p = st.master_view(e.name);
      r.weights.insert(r.weights.end(), p, p + e.numel());
    }
  st.release_decoded();
  if (rt::StateTier* t = tr.state_tier()) {
    EXPECT_EQ(t->stats().written_bytes, written) << "decode_all wrote units back";
    r.plan = t->plan();
    r.stats = t->stats();
    t->page_in_all();
  }
  r.state = rt::test::state_bytes(st, false);
  return r;
}

// The smallest budget with the weights paged too (below the one with them in RAM).
int64_t weights_budget(const Mode& m) {
  rt::HostState st(small_byte_spec(), true, m.moments, m.master, m.rule);
  const std::vector<rt::TierUnitBytes> b = rt::tier_unit_bytes(st);
  const rt::TierPlan p = rt::tier_place(b, rt::tier_place(b, 0).min_bytes - 1, true);
  EXPECT_TRUE(p.weights_paged);
  return static_cast<int64_t>(p.min_bytes);
}

// The budget that keeps some units' state in RAM and pages the others.
int64_t mixed_budget(const Mode& m) {
  rt::HostState st(small_byte_spec(), true, m.moments, m.master, m.rule);
  const std::vector<rt::TierUnitBytes> b = rt::tier_unit_bytes(st);
  const rt::TierPlan all = rt::tier_place(b, 0);
  return static_cast<int64_t>(all.min_bytes + b[0].paged);  // room for the embedding's state beside the slots
}

const std::vector<Mode>& modes() {
  static const std::vector<Mode> m = {
      {"adamw"},
      {"adamw-delayed", rt::MomentStorage::fp32, rt::MasterStorage::fp32, rt::UpdateRule::adamw, true, false},
      {"adamw-fold", rt::MomentStorage::fp32, rt::MasterStorage::fp32, rt::UpdateRule::adamw, false, true},
      {"adamw8bit", rt::MomentStorage::q8},
      {"adamw4bit-bf16-kahan", rt::MomentStorage::q4, rt::MasterStorage::bf16_kahan},
      {"adamw8bit-bf16-sr", rt::MomentStorage::q8, rt::MasterStorage::bf16_sr},
      {"adamw4bit-bf16-sr", rt::MomentStorage::q4, rt::MasterStorage::bf16_sr},
      {"muon", rt::MomentStorage::fp32, rt::MasterStorage::fp32, rt::UpdateRule::muon},
  };
  return m;
}

TEST(StateTier, BitIdenticalToAllInRam) {
  for (const Mode& m : modes()) {
    SCOPED_TRACE(m.name);
    rt::test::TempDir tmp;
    const TierRun ram = train(m, "", -1, tmp.file("ram"));
    const int64_t wb = weights_budget(m);
    for (int64_t budget : {mixed_budget(m), int64_t(0), wb}) {
      SCOPED_TRACE(budget == wb ? "weights paged" : budget ? "mixed budget" : "every unit paged");
      const std::string out = tmp.file(budget == wb ? "weights" : budget ? "mixed" : "all");
      const TierRun tier = train(m, tmp.path(), budget, out);
      const int U = static_cast<int>(tier.plan.paged.size());
      ASSERT_EQ(U, small_byte_spec().n_layers + 2);
      EXPECT_EQ(tier.plan.weights_paged, budget == wb);
      if (budget == wb) {  // every unit's weights and state paged: RAM holds the gradients and three units
        EXPECT_EQ(tier.plan.n_paged(), U);
        EXPECT_GT(tier.plan.weight_file_bytes, 0u);
        EXPECT_LE(tier.plan.ram(), static_cast<uint64_t>(budget));
      } else if (budget) {  // the budget chose: some paged, some kept
        EXPECT_GT(tier.plan.n_paged(), 0);
        EXPECT_LT(tier.plan.n_paged(), U);
        EXPECT_LE(tier.plan.ram(), static_cast<uint64_t>(budget));
      } else {
        EXPECT_EQ(tier.plan.n_paged(), U);
      }
      // every step read and wrote every paged unit (the saves read them once more)
      EXPECT_GE(tier.stats.written_bytes, kSteps * tier.plan.file_bytes);
      EXPECT_LE(tier.stats.paged_in_peak, tier.plan.slots);  // three units in flight at most
      EXPECT_EQ(tier.losses, ram.losses);
      EXPECT_TRUE(tier.state == ram.state) << "the final state differs from the all-in-RAM run's";
      EXPECT_TRUE(tier.weights == ram.weights) << "the exported weights differ from the all-in-RAM run's";
      // the tiered run's checkpoint is the all-in-RAM run's
      rt::HostState a(small_byte_spec(), true, m.moments, m.master, m.rule),
          b(small_byte_spec(), true, m.moments, m.master, m.rule);
      rt::checkpoint_load_state(ram.ckpt, a);
      rt::checkpoint_load_state(tier.ckpt, b);
      EXPECT_TRUE(rt::test::state_bytes(a, false) == rt::test::state_bytes(b, false)) << "checkpoints differ";
    }
  }
}

TEST(StateTier, ResumeFromATieredCheckpointIsExact) {
  for (const Mode& m : {modes()[0], modes()[1], modes()[4], modes()[6]}) {
    for (bool weights : {false, true}) {
      SCOPED_TRACE(rt::cat(m.name, weights ? ", weights paged" : ""));
      rt::test::TempDir tmp;
      const int64_t budget = weights ? weights_budget(m) : 0;
      const TierRun ref = train(m, "", -1, tmp.file("ram"));
      const TierRun tier = train(m, tmp.path(), budget, tmp.file("tier"));
      EXPECT_EQ(tier.plan.weights_paged, weights);
      // resume the tiered run's step-kSave checkpoint, tiered again
      rt::HostState st(small_byte_spec(), true, m.moments, m.master, m.rule);
      rt::checkpoint_load_state(tier.ckpt, st);
      rt::Dataset data = shakespeare(32, 3);
      rt::TrainOptions o = opts(m, kSteps);
      o.state_dir = tmp.path();
      o.max_host_memory = static_cast<uint64_t>(budget);
      o.out_dir = tmp.file("resumed");
      rt::Trainer tr(st, data, o);
      EXPECT_EQ(tr.state_tier()->plan().weights_paged, weights);
      tr.restore(rt::checkpoint_read_trainer(tier.ckpt));
      std::vector<double> losses(ref.losses.begin(), ref.losses.begin() + kSave);
      for (int i = kSave; i < kSteps; ++i) losses.push_back(tr.step().loss);
      tr.save_checkpoint(false);
      tr.state_tier()->page_in_all();
      EXPECT_EQ(losses, ref.losses);
      EXPECT_TRUE(rt::test::state_bytes(st, false) == ref.state);
    }
  }
}

TEST(StateTier, ClearErrors) {
  rt::test::TempDir tmp;
  rt::HostState st(small_byte_spec(), true);
  st.init_random(1);
  const std::vector<uint8_t> before = rt::test::state_bytes(st, false);
  const rt::TierPlan p = rt::tier_place(rt::tier_unit_bytes(st), 0);
  // a missing directory, a file instead of one
  rt::test::expect_error(
      [&] {
        rt::StateTier t(st, {tmp.file("nope"), 0});
      },
      {"--state-dir", tmp.file("nope"), "no such directory", "mkdir"});
  rt::test::write_bytes(tmp.file("f"), "x");
  rt::test::expect_error([&] { rt::StateTier t(st, {tmp.file("f"), 0}); }, {"--state-dir", "not a directory"});
  // too small a budget names the minimum in the flag's unit (M, rounded up)
  rt::test::expect_error(
      [&] {
        rt::StateTier t(st, {tmp.path(), p.min_bytes - 1});
      },
      {"--max-host-memory", "three units in flight",
       std::to_string((p.min_bytes + (1 << 20) - 1) >> 20) + "M or more"});
  // an engine that keeps the weights in RAM below that minimum: refused, naming it, the engine's reason and the
  // minimum with the weights paged; below that one too, an engine that pages them is refused
  const rt::TierPlan pw = rt::tier_place(rt::tier_unit_bytes(st), p.min_bytes - 1, true);
  ASSERT_TRUE(pw.weights_paged);
  rt::test::expect_error(
      [&] {
        rt::StateTier t(st, {tmp.path(), p.min_bytes - 1, "[train]", false, "an engine's reason"});
      },
      {"--max-host-memory", std::to_string((p.min_bytes + (1 << 20) - 1) >> 20) + "M or more",
       "the weights stay in RAM: an engine's reason",
       "paging them too, the tier would need " + std::to_string((pw.min_bytes + (1 << 20) - 1) >> 20) + " MiB"});
  rt::test::expect_error(
      [&] {
        rt::StateTier t(st, {tmp.path(), pw.min_bytes - 1, "[train]", true});
      },
      {"--max-host-memory", "with the weights paged too", "weights and optimizer state of the three units in flight",
       std::to_string((pw.min_bytes + (1 << 20) - 1) >> 20) + "M or more"});
  // nothing moved by the refusals
  EXPECT_EQ(st.tier(), nullptr);
  EXPECT_TRUE(rt::test::state_bytes(st, false) == before);
  // at exactly the minimum it runs; a second tier on the same directory is refused while the first holds it
  {
    rt::StateTier t(st, {tmp.path(), p.min_bytes});
    EXPECT_EQ(t.plan().n_paged(), static_cast<int>(st.units().size()));
    rt::HostState other(small_byte_spec(), true);
    rt::test::expect_error([&] { rt::StateTier t2(other, {tmp.path(), 0}); }, {"in use by another"});
    t.page_in_all();
  }
  EXPECT_TRUE(rt::test::state_bytes(st, false) == before);
}

}  // namespace
