// `ramtrain train --nproc-per-node N`: the data-parallel CPU twin through the
// binary (engine/data_parallel_cpu.h). N ranks share each step's --grad-accum
// micro-batches. With one micro-batch per rank (--grad-accum N) a run gives
// the same losses and exported weights, bit for bit, as one process with the
// same --grad-accum (untied model; docs/multi_gpu.md says why); with several
// per rank, each rank sums its own first, so they agree up to fp32 summation
// order. Bad combinations are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "testutil.h"

namespace {

using rt::test::contains;
using rt::test::run_ramtrain;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The training losses of metrics.jsonl (timings and rates left out).
std::vector<double> losses(const std::string& metrics) {
  std::stringstream in(slurp(metrics));
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find("\"loss\":");
    if (p != std::string::npos) out.push_back(std::stod(line.substr(p + 7)));
  }
  return out;
}

struct Fixture {
  rt::test::TempDir tmp;
  Fixture() {
    rt::test::make_byte_model_dir(tmp.file("model"));
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
    rt::test::write_bytes(tmp.file("data.txt"), text);
  }
  std::string train(const std::string& out, const std::string& extra) const {
    return "train --model " + tmp.file("model") + " --init random --data " + tmp.file("data.txt") +
           " --seq-len 16 --micro-batch 1 --steps 3 --lr 1e-2 --threads 1 --eval-batches 1 --device cpu --out " +
           tmp.file(out) + " " + extra;
  }
};

TEST(NprocPerNode, TrainsLikeOneProcess) {
  Fixture f;
  const auto one = run_ramtrain(f.train("one", "--grad-accum 4"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> l1 = losses(f.tmp.file("one/metrics.jsonl"));
  ASSERT_EQ(l1.size(), 3u);
  // two micro-batches per rank: (g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3,
  // fp32 order only: relative 1e-6 (DataParallelCpu's test states the bound)
  const auto two = run_ramtrain(f.train("dp2", "--grad-accum 4 --nproc-per-node 2"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(contains(two.output, "2 loopback ranks")) << two.output;
  const std::vector<double> l2 = losses(f.tmp.file("dp2/metrics.jsonl"));
  ASSERT_EQ(l2.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(l2[i], l1[i], 1e-6 * l1[i]) << "step " << i + 1;
  EXPECT_EQ(l2[0], l1[0]);  // the first forward: the same weights and the same sums
  {
    const int n = 4;
    const std::string out = "dp4";
    const auto dp = run_ramtrain(f.train(out, "--grad-accum 4 --nproc-per-node 4"));
    ASSERT_EQ(dp.exit_code, 0) << dp.output;
    EXPECT_TRUE(contains(dp.output, "4 loopback ranks")) << dp.output;
    EXPECT_EQ(losses(f.tmp.file(out + "/metrics.jsonl")), l1);  // one micro-batch per rank: bit for bit
    int compared = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(f.tmp.file("one"))) {
      if (e.path().extension() != ".safetensors") continue;
      const std::string rel = std::filesystem::relative(e.path(), f.tmp.file("one")).string();
      EXPECT_TRUE(slurp(e.path().string()) == slurp(f.tmp.file(out + "/" + rel))) << rel << ", N = " << n;
      ++compared;
    }
    EXPECT_GT(compared, 0) << "no safetensors written: nothing was compared";
  }
}

// The checkpoint holds the whole state (every rank's slices of master, m and
// v, gathered by sync()), so a run resumes exactly with the same N or with one
// process: steps 3 and 4 give the uninterrupted run's losses (bit for bit: one
// micro-batch per rank). Moments missing from the checkpoint would change them.
TEST(NprocPerNode, ResumesExactlyWithTheSameOrAnotherRankCount) {
  Fixture f;
  const std::string a = f.train("full", "--grad-accum 4 --nproc-per-node 4 --save-every 2");
  const auto full = run_ramtrain(a.substr(0, a.find("--steps 3")) + "--steps 4" + a.substr(a.find("--steps 3") + 9));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::vector<double> want = losses(f.tmp.file("full/metrics.jsonl"));
  ASSERT_EQ(want.size(), 4u);
  for (const std::string n : {"4", "1"}) {
    const std::string out = f.tmp.file("resumed" + n);
    const auto r =
        run_ramtrain("train --resume " + f.tmp.file("full/ckpt-00000002") + " --out " + out + " --nproc-per-node " + n);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(losses(out + "/metrics.jsonl"), std::vector<double>(want.begin() + 2, want.end())) << "N = " << n;
  }
}

TEST(NprocPerNode, BadCombinationsAreRefusedByName) {
  Fixture f;
  auto r = run_ramtrain(f.train("a", "--grad-accum 3 --nproc-per-node 2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--grad-accum 3 is not a multiple")) << r.output;
  EXPECT_TRUE(contains(r.output, "use --grad-accum 4")) << r.output;
  r = run_ramtrain(f.train("b", "--grad-accum 2 --nproc-per-node 2 --delayed-update"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "cannot be combined with --delayed-update")) << r.output;
  r = run_ramtrain(f.train("c", "--nproc-per-node 0"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--nproc-per-node")) << r.output;
}

}  // namespace

namespace {

// The launcher's variables for rank 0 of 2 (torchrun's), set while this lives.
struct LauncherEnv {
  LauncherEnv() {
    ::setenv("RANK", "0", 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_RANK", "0", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", "29533", 1);
  }
  ~LauncherEnv() {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(k);
  }
};

}  // namespace

// Data parallel over GPUs (docs/multi_gpu.md) where this machine cannot run
// it: every refusal names the cause and the fix, before any state is made.
TEST(NprocPerNode, GpuRanksAreRefusedWhereTheyCannotRun) {
  Fixture f;
  // asking for more GPUs than there are (none here, or fewer)
  auto r = run_ramtrain(f.train("a", "--grad-accum 2 --nproc-per-node 2 --device cuda"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--nproc-per-node 2 --device cuda needs 2 GPUs")) << r.output;
  {
    const LauncherEnv launched;  // under torchrun: one rank of two
    r = run_ramtrain(f.train("b", "--grad-accum 2"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "started 2 processes, but --device cpu")) << r.output;
    EXPECT_TRUE(contains(r.output, "ramtrain train (rank 0 of 2): error:")) << r.output;
    r = run_ramtrain(f.train("c", "--grad-accum 4 --nproc-per-node 4 --device auto"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "--nproc-per-node 4 but the launcher (torchrun) started 2 ranks")) << r.output;
    r = run_ramtrain(f.train("d", "--grad-accum 3 --device auto"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "use --grad-accum 4")) << r.output;
    r = run_ramtrain(f.train("e", "--grad-accum 2 --device auto --export-dtype fp32"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "use --export-dtype bf16")) << r.output;
    r = run_ramtrain(f.train("g", "--grad-accum 2 --device auto"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_TRUE(contains(r.output, "rank 0 of 2 found no GPU")) << r.output;
  }
}
