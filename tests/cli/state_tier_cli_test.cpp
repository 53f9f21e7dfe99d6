// --state-dir through the ramtrain binary (state/state_tier.h): a tiered run
// gives the all-in-RAM run's metrics bit for bit (its weights paged too under
// a --max-host-memory below the minimum with them in RAM); kill -9 in the middle of a
// tiered step (half the units of a step written back to the live file) then
// --resume gives the uninterrupted run's losses (the live file is not a
// checkpoint: the resume reads the last checkpoint and rewrites the file); a
// failing state disk (ENOSPC, injected) stops the run naming PATH with the
// checkpoints intact, and the resume is exact; and the options' errors.
// Exactness on the --metrics records (round-trip doubles), no tolerance.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "io/checkpoint.h"
#include "model/spec.h"
#include "state/state_tier.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;
using rt::test::Child;
using rt::test::contains;
using rt::test::run_ramtrain;

constexpr int kSteps = 20;

struct Fixture {
  rt::test::TempDir tmp;
  Fixture() {
    rt::test::make_byte_model_dir(tmp.file("model"), 32);
    rt::test::write_bytes(tmp.file("data.txt"), rt::test::random_words(16000, 1));
  }
  std::vector<std::string> args(const std::string& out, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"train",
                                  "--model",
                                  tmp.file("model"),
                                  "--init",
                                  "random",
                                  "--data",
                                  tmp.file("data.txt"),
                                  "--seq-len",
                                  "16",
                                  "--micro-batch",
                                  "2",
                                  "--grad-accum",
                                  "2",
                                  "--steps",
                                  std::to_string(kSteps),
                                  "--lr",
                                  "3e-3",
                                  "--eval-every",
                                  "10",
                                  "--eval-batches",
                                  "2",
                                  "--save-every",
                                  "5",
                                  "--threads",
                                  "2",
                                  "--device",
                                  "cpu",
                                  "--out",
                                  out,
                                  "--metrics",
                                  out + "/metrics.jsonl"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

std::string join(const std::vector<std::string>& a) {
  std::string s;
  for (auto& x : a) s += (s.empty() ? "'" : " '") + x + "'";
  return s;
}

int run_logged(const std::vector<std::string>& args, const std::string& log, const std::vector<std::string>& env = {}) {
  Child c(args, log, env);
  return c.wait();
}

using Records = std::multimap<std::pair<int64_t, std::string>, nlohmann::json>;
Records metrics_read(const std::string& path) {
  Records r;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    j.erase("time");
    j.erase("elapsed");
    std::string kind = j.contains("loss") ? "loss" : j.contains("final") ? "final" : "val_loss";
    r.insert({{j["step"].get<int64_t>(), kind}, j});
  }
  return r;
}

::testing::AssertionResult same_losses(const Records& got, const Records& ref) {
  for (auto& [k, j] : got) {
    auto it = ref.find(k);
    if (it == ref.end()) return ::testing::AssertionFailure() << "extra record " << j.dump();
    if (it->second != j)
      return ::testing::AssertionFailure() << "step " << k.first << " " << k.second << ": got " << j.dump()
                                           << ", all-in-RAM run " << it->second.dump();
  }
  for (auto& [k, j] : ref)
    if (!got.count(k)) return ::testing::AssertionFailure() << "missing record " << j.dump();
  return ::testing::AssertionSuccess();
}

TEST(StateTierCli, KillNineMidStepAndFullDiskResumeExactly) {
  Fixture fx;
  const std::string ref_out = fx.tmp.file("ref");
  ASSERT_EQ(run_logged(fx.args(ref_out), ref_out + ".log"), 0) << rt::read_text_file(ref_out + ".log");
  const Records ref = metrics_read(ref_out + "/metrics.jsonl");
  ASSERT_EQ(ref.size(), size_t(kSteps + kSteps / 10));  // steps, 2 evaluations, the final one

  // tiered, uninterrupted: the same records
  const std::string sd = fx.tmp.file("sd");
  fs::create_directories(sd);
  const std::string t_out = fx.tmp.file("tier");
  ASSERT_EQ(run_logged(fx.args(t_out, {"--state-dir", sd}), t_out + ".log"), 0) << rt::read_text_file(t_out + ".log");
  EXPECT_TRUE(contains(rt::read_text_file(t_out + ".log"), "state tier: " + sd + "/ramtrain-state.bin"));
  EXPECT_TRUE(same_losses(metrics_read(t_out + "/metrics.jsonl"), ref));
  const uint64_t file = rt::file_size(sd + "/ramtrain-state.bin");  // written once at start, then once a step
  ASSERT_GT(file, 0u);

  // the file is the plan's: every unit's fp32 m, v (CPU backend: fp32 master and gradients stay in RAM)
  const rt::ModelSpec spec = rt::spec_from_config_file(fx.tmp.file("model/config.json"));
  const auto units = rt::tier_unit_bytes_planned(spec, rt::MasterStorage::fp32, 0, true, rt::MomentStorage::fp32,
                                                 rt::UpdateRule::adamw);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(file, rt::tier_place(units, 0).file_bytes);

  // below the minimum with the weights in RAM: the CPU backend pages the fp32 master too (and computes on its
  // own copy), the same records
  {
    const rt::TierPlan wp = rt::tier_place(units, rt::tier_place(units, 0).min_bytes - 1, true);
    ASSERT_TRUE(wp.weights_paged);
    const std::string wsd = fx.tmp.file("wsd"), w_out = fx.tmp.file("weights");
    fs::create_directories(wsd);
    ASSERT_EQ(run_logged(fx.args(w_out, {"--state-dir", wsd, "--max-host-memory", std::to_string(wp.min_bytes)}),
                         w_out + ".log"),
              0)
        << rt::read_text_file(w_out + ".log");
    const std::string log = rt::read_text_file(w_out + ".log");
    EXPECT_TRUE(contains(log, "the weights and optimizer state of 4 of 4 units")) << log;
    EXPECT_TRUE(contains(log, "cpu backend: the weights page")) << log;
    EXPECT_TRUE(same_losses(metrics_read(w_out + "/metrics.jsonl"), ref));
    EXPECT_EQ(rt::file_size(wsd + "/ramtrain-state.bin"), wp.file_bytes);
  }

  // kill -9 in step 13's update, while unit 1 is written back: unit 0 holds step 13's state in the file, units
  // 1..3 step 12's (the main thread cannot have finished the step: unit 3's read waits behind unit 1's write)
  {
    const std::string out = fx.tmp.file("kill"), log = out + ".log";
    fs::create_directories(out);
    const uint64_t at = file * 13 + units[0].paged + units[1].paged / 2;
    ASSERT_EQ(run_logged(fx.args(out, {"--state-dir", sd}), log,
                         {"RAMTRAIN_INJECT_STATE_KILL_AFTER_BYTES=" + std::to_string(at)}),
              128 + SIGKILL)
        << rt::read_text_file(log);
    const Records partial = metrics_read(out + "/metrics.jsonl");
    EXPECT_EQ(partial.count({12, "loss"}), 1u);  // killed in step 13's update, after its loss was computed
    EXPECT_EQ(partial.count({13, "loss"}), 0u);
    auto r = run_ramtrain(join({"train", "--resume", "auto", "--out", out}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resuming from " + out + "/ckpt-00000010")) << r.output;
    EXPECT_TRUE(contains(r.output, "state tier: ")) << r.output;  // the resume pages again (--state-dir kept)
    EXPECT_TRUE(same_losses(metrics_read(out + "/metrics.jsonl"), ref));
  }
  // the state disk fills in step 8: a clear error naming PATH; ckpt 5 intact; the resume is exact
  {
    const std::string out = fx.tmp.file("full"), log = out + ".log";
    fs::create_directories(out);
    const uint64_t at = file * 8 + file / 2;
    const int code = run_logged(fx.args(out, {"--state-dir", sd}), log,
                                {"RAMTRAIN_INJECT_STATE_WRITE_FAIL_AFTER_BYTES=" + std::to_string(at)});
    const std::string text = rt::read_text_file(log);
    ASSERT_NE(code, 0) << text;
    ASSERT_NE(code, 128 + SIGKILL) << text;
    EXPECT_TRUE(contains(text, sd + "/ramtrain-state.bin")) << text;
    EXPECT_TRUE(contains(text, "No space left on device")) << text;
    EXPECT_TRUE(contains(text, "checkpoints are untouched")) << text;
    auto list = rt::checkpoint_list(out);
    ASSERT_FALSE(list.empty()) << text;
    EXPECT_EQ(rt::checkpoint_verify(list.back().path), "");
    auto r = run_ramtrain(join({"train", "--resume", "auto", "--out", out}));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(same_losses(metrics_read(out + "/metrics.jsonl"), ref));
  }
}

TEST(StateTierCli, OptionErrorsNameTheFlagAndTheFix) {
  Fixture fx;
  const std::string out = fx.tmp.file("o");
  auto r = run_ramtrain(join(fx.args(out, {"--max-host-memory", "1G"})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--max-host-memory")) << r.output;
  EXPECT_TRUE(contains(r.output, "give --state-dir PATH")) << r.output;
  r = run_ramtrain(join(fx.args(out, {"--state-dir", fx.tmp.file("missing")})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, fx.tmp.file("missing") + ": no such directory")) << r.output;
  r = run_ramtrain(join(fx.args(out, {"--state-dir", fx.tmp.path(), "--max-host-memory", "64K"})));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--max-host-memory 1 MiB is below the")) << r.output;
  EXPECT_TRUE(contains(r.output, "M or more")) << r.output;
}

}  // namespace
