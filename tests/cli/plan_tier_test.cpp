// `ramtrain plan --state-dir/--max-host-memory --ssd-gbs` (engine/tier_plan.h):
// the tier bytes it prints are what a state of the same storages allocates
// when a StateTier pages it under the same budget (the RAM it keeps, the
// file it writes, which units page); a 70B that does not fit in 128 GB of RAM
// fits with the tier on a 4090, weights paged, and the SSD traffic and step
// time add up; a slow SSD binds the step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/fs.h"
#include "model/spec.h"
#include "state/state_tier.h"
#include "testutil.h"

namespace {

using rt::test::contains;
using rt::test::run_ramtrain;

double num(const std::string& json, const std::string& key, size_t from) {
  const size_t k = json.find("\"" + key + "\":", from);
  EXPECT_NE(k, std::string::npos) << key;
  if (k == std::string::npos) return 0;
  return std::strtod(json.c_str() + k + key.size() + 3, nullptr);
}
bool flag(const std::string& json, const std::string& key, size_t from) {
  const size_t k = json.find("\"" + key + "\":", from);
  EXPECT_NE(k, std::string::npos) << key;
  return k != std::string::npos && json.compare(k + key.size() + 3, 4, "true") == 0;
}
uint64_t u64(const std::string& json, const std::string& key, size_t from) {
  const size_t k = json.find("\"" + key + "\":", from);
  EXPECT_NE(k, std::string::npos) << key;
  return k == std::string::npos ? 0 : std::strtoull(json.c_str() + k + key.size() + 3, nullptr, 10);
}

TEST(PlanTier, PrintedLayoutIsWhatTheEngineAllocates) {
  rt::test::TempDir tmp;
  const std::string model = tmp.file("model");
  rt::test::make_byte_model_dir(model, 64);
  const rt::ModelSpec spec = rt::spec_from_config_file(model + "/config.json");
  struct Case {
    const char* master;
    rt::MasterStorage ms;
    const char* opt;
    rt::MomentStorage mo;
  };
  for (const Case& c : {Case{"split", rt::MasterStorage::split, "adamw", rt::MomentStorage::fp32},
                        Case{"split", rt::MasterStorage::split, "adamw4bit", rt::MomentStorage::q4},
                        Case{"bf16-kahan", rt::MasterStorage::bf16_kahan, "adamw8bit", rt::MomentStorage::q8}}) {
    SCOPED_TRACE(std::string(c.master) + " " + c.opt);
    // the engine's state: device gradients, one shadow (no delayed update)
    rt::HostState probe(spec, false, c.mo, c.ms);
    const std::vector<rt::TierUnitBytes> live = rt::tier_unit_bytes(probe);
    const rt::TierPlan all = rt::tier_place(live, 0);
    for (uint64_t budget : {all.min_bytes, all.min_bytes + live[0].paged + live.back().paged}) {
      auto r = run_ramtrain(rt::cat("plan --model ", model, " --gpu h100 --seq-len 64 --micro-batch 2 --grads device ",
                                    "--master ", c.master, " --optimizer ", c.opt, " --state-dir ", tmp.path(),
                                    " --max-host-memory ", budget, " --json"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::string& j = r.output;
      const size_t t = j.find("\"tier\":{");
      ASSERT_NE(t, std::string::npos) << j;
      ASSERT_FALSE(flag(j, "weights_paged", t)) << j;
      rt::HostState st(spec, false, c.mo, c.ms);
      const std::string dir = tmp.file(rt::cat("sd", budget));
      rt::make_dirs(dir);
      rt::StateTier tier(st, {dir, budget});
      const rt::TierPlan& p = tier.plan();
      EXPECT_EQ(u64(j, "resident_bytes", t), p.resident);
      EXPECT_EQ(u64(j, "kept_bytes", t), p.kept);
      EXPECT_EQ(u64(j, "slot_bytes", t), p.slots);
      EXPECT_EQ(u64(j, "ram_bytes", t), p.ram());
      EXPECT_EQ(u64(j, "min_bytes", t), p.min_bytes);
      EXPECT_EQ(u64(j, "ssd_bytes", t), p.file_bytes);
      EXPECT_EQ(u64(j, "ssd_bytes", t), rt::file_size(tier.path()));  // the file the engine wrote
      EXPECT_EQ(static_cast<int>(num(j, "units_paged", t)), p.n_paged());
      EXPECT_LE(p.ram(), budget);
      // traffic: every paged unit's state read and written once a step
      EXPECT_EQ(u64(j, "read_bytes_per_step", t), p.file_bytes);
      EXPECT_EQ(u64(j, "write_bytes_per_step", t), p.file_bytes);
      tier.page_in_all();
    }
    // below the minimum with the weights in RAM: the weights page too, the device holding every layer
    // (--resident, the CUDA engine's way): the same placement as the engine's tier, and the weights are read
    // and written once a step with the state
    const rt::TierPlan wp = rt::tier_place(live, all.min_bytes - 1, true);
    ASSERT_TRUE(wp.weights_paged);
    for (uint64_t budget : {wp.min_bytes, wp.min_bytes + live[0].paged + live[0].weights_paged}) {
      if (budget >= all.min_bytes) continue;  // a whole unit kept: only where it stays below that minimum
      auto r = run_ramtrain(rt::cat("plan --model ", model, " --gpu h100 --seq-len 64 --micro-batch 2 --grads device ",
                                    "--master ", c.master, " --optimizer ", c.opt, " --resident --state-dir ",
                                    tmp.path(), " --max-host-memory ", budget, " --json"));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const std::string& j = r.output;
      const size_t t = j.find("\"tier\":{");
      ASSERT_NE(t, std::string::npos) << j;
      rt::HostState st(spec, false, c.mo, c.ms);
      const std::string dir = tmp.file(rt::cat("sw", budget));
      rt::make_dirs(dir);
      rt::StateTier tier(st, {dir, budget, "[train]", true});
      const rt::TierPlan& p = tier.plan();
      ASSERT_TRUE(p.weights_paged);
      EXPECT_TRUE(flag(j, "weights_paged", t)) << j;
      EXPECT_TRUE(flag(j, "device_resident", t)) << j;
      EXPECT_EQ(u64(j, "resident_bytes", t), p.resident);  // no gradients on the host: 0
      EXPECT_EQ(u64(j, "kept_bytes", t), p.kept);
      EXPECT_EQ(u64(j, "slot_bytes", t), p.slots);
      EXPECT_EQ(u64(j, "min_bytes", t), p.min_bytes);
      EXPECT_EQ(u64(j, "min_bytes_resident_weights", t), p.min_bytes_resident_weights);
      EXPECT_EQ(u64(j, "ssd_bytes", t), rt::file_size(tier.path()));
      EXPECT_EQ(u64(j, "ssd_weight_bytes", t), p.weight_file_bytes);
      EXPECT_EQ(static_cast<int>(num(j, "units_paged", t)), p.n_paged());
      EXPECT_LE(p.ram(), budget);
      EXPECT_EQ(u64(j, "read_bytes_per_step", t), p.file_bytes);
      EXPECT_EQ(u64(j, "write_bytes_per_step", t), p.file_bytes);
      tier.page_in_all();
    }
  }
}

// Every layer on the device and --grads fold (the 14B acceptance run's flags): the SSD reads and writes while
// the update runs, in the backward; the forward has no I/O, so the step is max(GPU step, forward + SSD).
TEST(PlanTier, FoldOverlapsTheSsdWithTheBackwardOnly) {
  for (const char* gbs : {"0.5", "2.2", "50"}) {
    SCOPED_TRACE(gbs);
    auto r = run_ramtrain(rt::cat(
        "plan --preset qwen2.5-14b --gpu h100 --host-ram 128G --seq-len 2048 --micro-batch 16 --grad-accum 4 "
        "--optimizer adamw4bit --master bf16-sr --resident --layer-major on --grads fold --state-dir /x "
        "--max-host-memory 24G --json --ssd-gbs ",
        gbs));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string& j = r.output;
    const size_t t = j.find("\"tier\":{");
    ASSERT_NE(t, std::string::npos);
    EXPECT_TRUE(flag(j, "fold", t));
    EXPECT_TRUE(flag(j, "weights_paged", t));
    EXPECT_TRUE(flag(j, "device_resident", t));
    const double gpu_step = num(j, "step_s", j.find("\"step\":{"));
    const double fwd = num(j, "forward_s", t), ssd = num(j, "ssd_s", t);
    EXPECT_GT(fwd, 0.0);
    EXPECT_LT(fwd, gpu_step / 2);  // 2 of the >= 6 model FLOPs per parameter and token
    const double want = std::max(gpu_step, fwd + ssd);
    EXPECT_NEAR(num(j, "step_s", t), want, 1e-5 * want);  // printed with 6 significant digits
    EXPECT_EQ(flag(j, "ssd_binds", t), fwd + ssd > gpu_step);
  }
}

TEST(PlanTier, SeventyBOnA4090With128GBFitsWithTheTier) {
  for (const char* preset : {"llama-3.1-70b", "qwen2.5-72b"}) {
    SCOPED_TRACE(preset);
    const std::string base =
        rt::cat("plan --preset ", preset,
                " --gpu rtx4090 --host-ram 128G --optimizer adamw4bit --master bf16-sr --grads fold "
                "--micro-batch 2 --grad-accum 16 --layer-major on --seq-len 2048");
    auto ram_only = run_ramtrain(base + " --json");
    EXPECT_EQ(ram_only.exit_code, 1) << ram_only.output;  // refused: the host RAM does not hold it
    auto r = run_ramtrain(base + " --state-dir /nonexistent/ssd --ssd-gbs 7 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string& j = r.output;
    const size_t t = j.find("\"tier\":{");
    ASSERT_NE(t, std::string::npos);
    EXPECT_TRUE(flag(j, "fits", 0));
    EXPECT_TRUE(flag(j, "weights_paged", t));
    EXPECT_LE(num(j, "needed_bytes", 0), num(j, "usable_bytes", 0));
    // the traffic at 7 GB/s; the weights read ahead of the forward and the backward (not held on the card): the
    // SSD works all step, which takes the longer of the GPU's and the SSD's time
    const double traffic = num(j, "read_bytes_per_step", t) + num(j, "write_bytes_per_step", t);
    EXPECT_NEAR(num(j, "ssd_s", t), traffic / 7e9, 1e-5 * traffic / 7e9);
    const double gpu_step = num(j, "step_s", j.find("\"step\":{"));
    EXPECT_NEAR(num(j, "step_s", t), std::max(gpu_step, num(j, "ssd_s", t)), 1e-5 * gpu_step);
    EXPECT_EQ(flag(j, "ssd_binds", t), num(j, "ssd_s", t) > gpu_step);
    // reads: the state once, the weights three times; writes: each once
    EXPECT_EQ(num(j, "read_bytes_per_step", t), num(j, "ssd_state_bytes", t) + 3 * num(j, "ssd_weight_bytes", t));
    EXPECT_EQ(num(j, "write_bytes_per_step", t), num(j, "ssd_bytes", t));
    // --layer-major auto (the default) stays layer-major: the tier pages the state, so the K sets of pinned block
    // inputs fit beside it (the fallback check counts the tier's RAM, not the whole state)
    std::string auto_lm = base;
    auto_lm.replace(auto_lm.find(" --layer-major on"), 17, "");
    auto a = run_ramtrain(auto_lm + " --state-dir /nonexistent/ssd --ssd-gbs 7 --json");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_TRUE(flag(a.output, "layer_major", 0)) << a.output;
    // a slow SSD binds the same step
    auto slow = run_ramtrain(base + " --state-dir /x --ssd-gbs 0.5 --json");
    ASSERT_EQ(slow.exit_code, 0) << slow.output;
    EXPECT_TRUE(flag(slow.output, "ssd_binds", slow.output.find("\"tier\":{")));
  }
}

}  // namespace
