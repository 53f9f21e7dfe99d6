// ramtrain eval on the CUDA engine against the CPU reference: a tiny-byte
// model trained one step on the CPU, evaluated on the same text with
// --device cuda and --device cpu. Tolerance: the CUDA engine runs bf16
// operands (relative rounding 2^-9) through the layers with fp32 sums, so the
// mean loss agrees within 1e-2 relative (the bound tests/gpu/engine_test.cpp
// uses for one batch); the token and row counts must be identical. Skips
// without a CUDA device or in a CPU-only build.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "engine/backend.h"
#include "testutil.h"

namespace {

using rt::test::run_ramtrain;

nlohmann::json last_json(const std::string& out) { return nlohmann::json::parse(out.substr(out.rfind("\n{") + 1)); }

TEST(GpuEval, CudaMatchesCpu) {
  if (!rt::cuda_backend_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  rt::test::TempDir tmp;
  const std::string text = rt::read_text_file(rt::test::shared_data_dir() + "/tinyshakespeare.txt").substr(0, 20000);
  rt::test::write_bytes(tmp.file("t.txt"), text);
  auto tr =
      run_ramtrain("train --preset tiny-byte --data " + tmp.file("t.txt") +
                   " --steps 2 --seq-len 64 --micro-batch 2 --val-fraction 0 --device cpu --out " + tmp.file("run"));
  ASSERT_EQ(tr.exit_code, 0) << tr.output;
  const std::string model = tmp.file("run") + "/final";
  // 20002 tokens at T = 128: 157 windows, the last partial; B = 4 leaves a short last batch.
  const std::string args =
      "eval --model " + model + " --data " + tmp.file("t.txt") + " --seq-len 128 --micro-batch 4 --json";
  auto cpu = run_ramtrain(args + " --device cpu");
  auto gpu = run_ramtrain(args + " --device cuda");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  const auto c = last_json(cpu.output), g = last_json(gpu.output);
  std::printf("[eval] loss cpu %.6f cuda %.6f (%s)\n", c["loss"].get<double>(), g["loss"].get<double>(),
              g["backend"].get<std::string>().c_str());
  EXPECT_NEAR(g["loss"].get<double>(), c["loss"].get<double>(), 1e-2 * c["loss"].get<double>());
  EXPECT_EQ(g["tokens"].get<int64_t>(), c["tokens"].get<int64_t>());
  EXPECT_EQ(g["rows"].get<int64_t>(), c["rows"].get<int64_t>());
  EXPECT_EQ(c["tokens"].get<int64_t>(), static_cast<int64_t>(text.size()) + 1);  // BOS + bytes + EOS, minus one
}

}  // namespace
