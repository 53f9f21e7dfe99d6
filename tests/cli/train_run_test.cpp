// Running `ramtrain train` / `sample` as a user would: the metrics file
// (default OUT/metrics.jsonl, wall-clock time, a failing disk reported once
// while training goes on), signals during generation, sizes that memory cannot
// hold refused up front naming the option, the step line's memory and epoch,
// --epochs and --eval-data.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "core/fs.h"
#include "testutil.h"

namespace {

using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

using rt::test::Child;
using rt::test::contains;

size_t count(const std::string& s, const std::string& sub) {
  size_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + 1)) ++n;
  return n;
}

struct Fixture {
  TempDir tmp;
  Fixture() {
    rt::test::make_byte_model_dir(tmp.file("model"));
    std::string text, other;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
    for (int i = 0; i < 60; ++i)
      other += "a slow green turtle walks under the busy cat " + std::to_string(i % 5) + ". ";
    write_bytes(tmp.file("data.txt"), text);
    write_bytes(tmp.file("other.txt"), other);
  }
  std::string train(const std::string& out, const std::string& extra = "") const {
    return "train --model " + tmp.file("model") + " --init random --data " + tmp.file("data.txt") +
           " --seq-len 16 --micro-batch 2 --threads 1 --eval-batches 2 --out " + tmp.file(out) + " " + extra;
  }
};

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> v;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) v.push_back(nlohmann::json::parse(line));
  return v;
}

// Issue 18 item 5: a --metrics file that cannot be written (a full disk:
// /dev/full) is reported once, and training finishes.
TEST(TrainRun, MetricsWriteFailureIsReportedOnceAndTrainingContinues) {
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--steps 5 --eval-every 2 --metrics /dev/full"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "cannot write to --metrics /dev/full"), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "No space left on device")) << r.output;
  EXPECT_TRUE(contains(r.output, "step     5/5")) << r.output;
  EXPECT_TRUE(rt::file_exists(f.tmp.file("o/final/config.json"))) << r.output;
}

// CLI polish: metrics default to OUT/metrics.jsonl, every record carries the
// wall-clock time and the step records the epoch; the step line shows host
// RSS and the epoch. A fresh run starts the default file over.
TEST(TrainRun, MetricsDefaultToTheOutputDirWithWallClockTime) {
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--steps 4 --eval-every 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> recs = read_jsonl(f.tmp.file("o/metrics.jsonl"));
  ASSERT_EQ(recs.size(), 4u + 1 + 1) << r.output;  // 4 steps, the eval at step 2, the final one
  const double now = static_cast<double>(std::time(nullptr));
  double last_elapsed = -1;
  for (auto& j : recs) {
    ASSERT_TRUE(j.contains("time") && j.contains("elapsed")) << j.dump();
    EXPECT_NEAR(j["time"].get<double>(), now, 600) << j.dump();
    EXPECT_GE(j["elapsed"].get<double>(), last_elapsed) << j.dump();
    last_elapsed = j["elapsed"].get<double>();
  }
  EXPECT_GT(recs[0]["epoch"].get<double>(), 0) << recs[0].dump();
  EXPECT_TRUE(std::regex_search(r.output, std::regex("step +1/4 \\| loss [0-9.]+ .*\\| epoch [0-9.]+ \\| rss [0-9.]+ "
                                                     "[MG]iB")))
      << r.output;
  // A fresh run into the same dir (no checkpoints there) would replace its
  // final model and metrics: refused, naming both; with --overwrite it runs.
  auto refused = run_ramtrain(f.train("o", "--steps 2"));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "already holds a run: a final model (" + f.tmp.file("o/final") +
                                           "), metrics (" + f.tmp.file("o/metrics.jsonl") + ")"))
      << refused.output;
  EXPECT_EQ(read_jsonl(f.tmp.file("o/metrics.jsonl")).size(), 6u);  // untouched
  auto again = run_ramtrain(f.train("o", "--steps 2 --overwrite"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(read_jsonl(f.tmp.file("o/metrics.jsonl")).size(), 3u);
}

// Issue 18 item 9: sizes that cannot fit are refused before anything is
// allocated, naming the option (not "out of host memory", not the OOM killer).
TEST(TrainRun, SizesMemoryCannotHoldAreRefusedUpFront) {
  Fixture f;
  struct Case {
    const char* opts;
    const char* expect;
  };
  for (const Case& c : {Case{"--micro-batch 2000000000", "--micro-batch 2000000000 x --seq-len 16"},
                        Case{"--grad-accum 2000000000", "--grad-accum 2000000000 x --micro-batch 2"},
                        Case{"--seq-len 100000", "--seq-len 100000 exceeds the model's max_position_embeddings"}}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = run_ramtrain(f.train("o", std::string("--steps 1 ") + c.opts));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.exit_code, 1) << c.opts << ": " << r.output;
    EXPECT_TRUE(contains(r.output, c.expect)) << c.opts << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "out of host memory")) << r.output;
    EXPECT_FALSE(contains(r.output, "training ")) << r.output;  // refused before the run starts
    EXPECT_LT(secs, 30) << c.opts;
  }
}

// Issue 18 item 6: SIGTERM / SIGINT stop generation at the next token; what
// was generated is printed and the exit code is 128 + the signal. Greedy
// decoding of this model does not reach EOS before the signal (asserted), so
// without the fix the billion tokens would run for hours: the wait times out.
TEST(TrainRun, SignalsStopGenerationAtTheNextToken) {
  Fixture f;
  auto t = run_ramtrain(f.train("run", "--steps 1"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string model = f.tmp.file("run/final");
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string log = f.tmp.file("sample-" + std::to_string(sig) + ".log");
    Child c({"sample", "--model", model, "--prompt", "the", "--temperature", "0", "--max-tokens", "1000000000",
             "--threads", "1"},
            log);
    ASSERT_GT(c.pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_EQ(c.wait_for(0), -1) << "ended before the signal: " << rt::read_text_file(log);
    ::kill(c.pid, sig);
    const int code = c.wait_for(20);
    const std::string out = rt::read_text_file(log);
    EXPECT_EQ(code, 128 + sig) << out;
    EXPECT_TRUE(contains(out, sig == SIGTERM ? "interrupted by SIGTERM" : "interrupted by SIGINT")) << out;
    EXPECT_TRUE(contains(out, "the")) << out;  // the prompt and what was generated are printed
  }
}

// Issue 18 item 6, the case the fault test found: inside `train
// --sample-prompt` the handler only set the step-boundary flag, so a signal
// during the sample before training was ignored until the sample ended. The
// model's tokenizer has no EOS here, so nothing but the signal ends this
// sample (a billion tokens); the run stops with 143, no step taken.
TEST(TrainRun, SignalDuringTheTrainSampleStopsTheRun) {
  Fixture f;
  const std::string model = f.tmp.file("qwen");
  rt::make_dirs(model);
  write_bytes(model + "/config.json", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 808, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": true})");
  write_bytes(model + "/tokenizer.json",
              rt::read_text_file(rt::test::fixture_dir() + "/tokenizers/qwen2/tokenizer.json"));
  write_bytes(model + "/tokenizer_config.json", R"({"bos_token": null, "eos_token": null})");
  const std::string log = f.tmp.file("train.log");
  Child c({"train",
           "--model",
           model,
           "--init",
           "random",
           "--data",
           f.tmp.file("data.txt"),
           "--seq-len",
           "16",
           "--micro-batch",
           "2",
           "--threads",
           "1",
           "--steps",
           "5",
           "--val-fraction",
           "0",
           "--out",
           f.tmp.file("o"),
           "--sample-prompt",
           "the",
           "--sample-tokens",
           "1000000000"},
          log);
  ASSERT_GT(c.pid, 0);
  // Wait until the run is in the sample (the lines before it are flushed first).
  const auto t0 = std::chrono::steady_clock::now();
  int early = -1;
  while (!contains(rt::file_exists(log) ? rt::read_text_file(log) : "", "training 5 steps") &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30) && (early = c.wait_for(0.05)) == -1) {
  }
  ASSERT_EQ(early, -1) << "ended before the signal: " << rt::read_text_file(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(c.wait_for(0), -1) << "ended before the signal: " << rt::read_text_file(log);
  ::kill(c.pid, SIGTERM);
  const int code = c.wait_for(20);
  const std::string out = rt::read_text_file(log);
  EXPECT_EQ(code, 128 + SIGTERM) << out;
  EXPECT_TRUE(contains(out, "---- sample before training (cut short by a signal) ----")) << out;
  EXPECT_TRUE(contains(out, "interrupted by SIGTERM after step 0: no step was taken")) << out;
  EXPECT_FALSE(contains(out, "step     1/5")) << out;
}

// Issue 19: --epochs E trains ceil(E x sequences / (B x K)) steps and stops
// at epoch E; --steps and --epochs together are refused.
TEST(TrainRun, EpochsSetTheStepCount) {
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--epochs 2 --grad-accum 3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m,
                                std::regex("--epochs 2: ([0-9]+) steps \\(([0-9]+) sequences per epoch, "
                                           "6 per step\\)")))
      << r.output;
  const int64_t steps = std::stoll(m[1]), windows = std::stoll(m[2]);
  EXPECT_EQ(steps, (2 * windows + 5) / 6);
  std::vector<double> epochs;
  for (auto& j : read_jsonl(f.tmp.file("o/metrics.jsonl")))
    if (j.contains("loss")) epochs.push_back(j["epoch"].get<double>());
  ASSERT_EQ(static_cast<int64_t>(epochs.size()), steps);
  EXPECT_GE(epochs.back(), 2.0);              // the last step reaches epoch 2
  EXPECT_LT(epochs[epochs.size() - 2], 2.0);  // the one before does not
  auto both = run_ramtrain(f.train("o2", "--epochs 2 --steps 5"));
  EXPECT_EQ(both.exit_code, 1) << both.output;
  EXPECT_TRUE(contains(both.output, "give one of --steps N or --epochs E")) << both.output;
}

// Issue 19: --eval-data FILE is evaluated beside the validation split (in the
// log and the metrics), and evaluating it does not change the training.
TEST(TrainRun, EvalDataIsEvaluatedWithoutChangingTheTraining) {
  Fixture f;
  auto plain = run_ramtrain(f.train("a", "--steps 4 --eval-every 2"));
  auto with = run_ramtrain(f.train("b", "--steps 4 --eval-every 2 --eval-data " + f.tmp.file("other.txt")));
  auto self = run_ramtrain(f.train("c", "--steps 4 --eval-every 2 --eval-data " + f.tmp.file("data.txt")));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(with.exit_code, 0) << with.output;
  ASSERT_EQ(self.exit_code, 0) << self.output;
  EXPECT_TRUE(contains(with.output, "step     2 | eval-data loss")) << with.output;
  EXPECT_TRUE(contains(with.output, "final eval-data loss")) << with.output;
  auto losses = [](const std::string& path, const char* key) {
    std::vector<double> v;
    for (auto& j : read_jsonl(path))
      if (j.contains(key) && !j[key].is_null()) v.push_back(j[key].get<double>());
    return v;
  };
  // Training and its validation loss are bit-identical with and without --eval-data.
  EXPECT_EQ(losses(f.tmp.file("a/metrics.jsonl"), "loss"), losses(f.tmp.file("b/metrics.jsonl"), "loss"));
  EXPECT_EQ(losses(f.tmp.file("a/metrics.jsonl"), "val_loss"), losses(f.tmp.file("b/metrics.jsonl"), "val_loss"));
  const std::vector<double> other = losses(f.tmp.file("b/metrics.jsonl"), "eval_loss"),
                            same = losses(f.tmp.file("c/metrics.jsonl"), "eval_loss");
  ASSERT_EQ(other.size(), 2u);  // step 2 and the final evaluation
  ASSERT_EQ(same.size(), 2u);
  for (double x : other) EXPECT_TRUE(std::isfinite(x) && x > 0);
  // Another text gives another loss than the training text itself.
  EXPECT_NE(other.back(), same.back());
  auto missing = run_ramtrain(f.train("d", "--steps 1 --eval-data " + f.tmp.file("nope.txt")));
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_TRUE(contains(missing.output, "nope.txt")) << missing.output;
}

}  // namespace
