// The ramtrain executable end to end: help, the loss command against the HF
// fixtures, train -> export -> sample, TOML configs, and the messages for bad
// input (each must name the file and exit non-zero, leaving no output behind).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "io/safetensors.h"
#include "io/token_file.h"
#include "testutil.h"

namespace {

using rt::test::run_ramtrain;

using rt::test::contains;

std::string hf_fixture(const std::string& name) { return rt::test::fixture_dir() + "/hf/" + name; }

TEST(Cli, HelpForEveryCommand) {
  auto r = run_ramtrain("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "train")) << r.output;
  for (const char* cmd : {"train", "sample", "loss"}) {
    auto h = run_ramtrain(std::string(cmd) + " --help");
    EXPECT_EQ(h.exit_code, 0) << cmd;
    EXPECT_TRUE(contains(h.output, "Examples:")) << cmd << ": " << h.output;
  }
  auto u = run_ramtrain("train --stpes 3");
  EXPECT_NE(u.exit_code, 0);
  EXPECT_TRUE(contains(u.output, "did you mean --steps")) << u.output;
  EXPECT_NE(run_ramtrain("frobnicate").exit_code, 0);
}

TEST(Cli, LossMatchesTransformersAndDumpsGradients) {
  rt::test::TempDir tmp;
  const std::string dir = hf_fixture("qwen2_bias_tied");
  auto r = run_ramtrain("loss --model " + dir + " --tokens " + dir + "/tokens.txt --json --dump-grads " +
                        tmp.file("g.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  auto ref = nlohmann::json::parse(rt::read_text_file(dir + "/reference.json"));
  EXPECT_NEAR(j["loss"].get<double>(), ref["loss"].get<double>(), 1e-5 * ref["loss"].get<double>());
  auto got = rt::SafetensorsFile::open(tmp.file("g.safetensors"));
  auto want = rt::SafetensorsFile::open(dir + "/reference.safetensors");
  int n = 0;
  for (const auto& t : got->tensors()) {
    const rt::TensorInfo* w = want->find("grad." + t.name);
    ASSERT_NE(w, nullptr) << t.name;
    std::vector<float> a(static_cast<size_t>(t.numel())), b(a.size());
    rt::tensor_to_f32(t, a.data());
    rt::tensor_to_f32(*w, b.data());
    EXPECT_LE(rt::test::rel_l2(a.data(), b.data(), t.numel()), rt::test::hf_grad_rel_bound(t.name)) << t.name;
    ++n;
  }
  // tied embeddings: one tensor carries both contributions, no lm_head entry
  EXPECT_EQ(got->find("lm_head.weight"), nullptr);
  EXPECT_GT(n, 10);
}

TEST(Cli, LossRefusesBadTokens) {
  rt::test::TempDir tmp;
  const std::string dir = hf_fixture("mistral");
  rt::test::write_bytes(tmp.file("big.txt"), "1 2 3\n4 99999 5\n");
  auto r = run_ramtrain("loss --model " + dir + " --tokens " + tmp.file("big.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "big.txt")) << r.output;
  EXPECT_TRUE(contains(r.output, "99999")) << r.output;
  rt::test::write_bytes(tmp.file("nan.txt"), "1 2 x3\n");
  r = run_ramtrain("loss --model " + dir + " --tokens " + tmp.file("nan.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "nan.txt")) << r.output;
  rt::test::write_bytes(tmp.file("empty.txt"), "");
  r = run_ramtrain("loss --model " + dir + " --tokens " + tmp.file("empty.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "empty.txt")) << r.output;
  r = run_ramtrain("loss --model " + tmp.file("nope") + " --tokens " + tmp.file("nan.txt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "nope")) << r.output;
  // A config.json whose sizes no host holds: named as the model's, not as training options.
  std::filesystem::copy(dir, tmp.file("huge"));
  auto cfg = nlohmann::json::parse(rt::read_text_file(tmp.file("huge/config.json")));
  cfg["intermediate_size"] = int64_t{1} << 36;
  rt::test::write_bytes(tmp.file("huge/config.json"), cfg.dump());
  rt::test::write_bytes(tmp.file("ok.txt"), "1 2 3\n");
  r = run_ramtrain("loss --model " + tmp.file("huge") + " --tokens " + tmp.file("ok.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[loss] " + tmp.file("huge/config.json") + " describes a model of")) << r.output;
  EXPECT_TRUE(contains(r.output, "intermediate_size 68719476736")) << r.output;
  EXPECT_FALSE(contains(r.output, "--optimizer")) << r.output;
  cfg["hidden_size"] = int64_t{1} << 40;  // beyond any model: refused while reading the config
  rt::test::write_bytes(tmp.file("huge/config.json"), cfg.dump());
  r = run_ramtrain("loss --model " + tmp.file("huge") + " --tokens " + tmp.file("ok.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "parameters (hidden_size 1099511627776")) << r.output;
  EXPECT_TRUE(contains(r.output, "beyond any model")) << r.output;
}

TEST(Cli, TrainExportSampleRoundTrip) {
  rt::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  rt::test::write_bytes(tmp.file("fox.txt"), text);
  rt::test::write_bytes(tmp.file("run.toml"),
                        "preset = \"tiny-byte\"\nseq_len = 32\nmicro_batch = 2\nsteps = 100\nlr = 3e-3\n"
                        "threads = 2\n");
  // flags override the file: 3 steps, not 100
  auto r = run_ramtrain("train --config " + tmp.file("run.toml") + " --steps 3 --data " + tmp.file("fox.txt") +
                        " --out " + tmp.file("out") + " --export-dtype fp32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "step     3/3")) << r.output;
  EXPECT_TRUE(rt::file_exists(tmp.file("out/final/config.json")));
  EXPECT_TRUE(rt::file_exists(tmp.file("out/final/model.safetensors")));
  auto s = run_ramtrain("sample --model " + tmp.file("out/final") + " --prompt 'the ' --max-tokens 10 --seed 3");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  auto s2 = run_ramtrain("sample --model " + tmp.file("out/final") + " --prompt 'the ' --max-tokens 10 --seed 3");
  EXPECT_EQ(s.output, s2.output);  // seeded
  EXPECT_TRUE(contains(s.output, "the ")) << s.output;
}

// export replaces --out as a whole: a directory of other files is refused
// (it used to be deleted), an earlier export is replaced; a checkpoint given
// both as the argument and as --checkpoint must agree; tokenize never writes
// over one of its inputs.
TEST(Cli, OutputsNeverReplaceOtherFiles) {
  rt::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  rt::test::write_bytes(tmp.file("fox.txt"), text);
  auto r = run_ramtrain("train --preset tiny-byte --seq-len 32 --micro-batch 2 --steps 2 --threads 2 --data " +
                        tmp.file("fox.txt") + " --out " + tmp.file("run") + " --save-every 2 --export-dtype none");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = tmp.file("run/ckpt-00000002");
  rt::make_dirs(tmp.file("mine"));
  rt::test::write_bytes(tmp.file("mine/notes.txt"), "precious");
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("mine"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a directory holding other files (notes.txt), which the export would delete"))
      << r.output;
  EXPECT_TRUE(rt::file_exists(tmp.file("mine/notes.txt")));
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ramtrain("export " + ckpt + " --out " + tmp.file("hf") + " --dtype fp32");  // an earlier export: replaced
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ramtrain("export " + ckpt + " --checkpoint " + tmp.file("run") + " --out " + tmp.file("hf2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "both give --checkpoint: give it once")) << r.output;
  EXPECT_FALSE(rt::is_directory(tmp.file("hf2")));
  r = run_ramtrain("tokenize " + tmp.file("fox.txt") + " --tokenizer " + tmp.file("hf") + " --out " +
                   tmp.file("fox.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is also an input: the token file would replace it")) << r.output;
  EXPECT_EQ(rt::read_text_file(tmp.file("fox.txt")), text);
}

TEST(Cli, ExportDtypeNoneWritesNoFinalModelButKeepsCheckpoints) {
  rt::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  rt::test::write_bytes(tmp.file("fox.txt"), text);
  auto r = run_ramtrain("train --preset tiny-byte --seq-len 32 --micro-batch 2 --steps 2 --threads 2 --data " +
                        tmp.file("fox.txt") + " --out " + tmp.file("out") + " --save-every 2 --export-dtype none");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(rt::file_exists(tmp.file("out/final/config.json"))) << r.output;
  EXPECT_FALSE(contains(r.output, "saved " + tmp.file("out/final"))) << r.output;
  EXPECT_TRUE(rt::file_exists(tmp.file("out/metrics.jsonl")));
  EXPECT_TRUE(rt::is_directory(tmp.file("out/ckpt-00000002"))) << r.output;
}

TEST(Cli, TrainRefusesBadData) {
  rt::test::TempDir tmp;
  const std::string common = " --preset tiny-byte --steps 1 --seq-len 64 --out " + tmp.file("out");
  rt::test::write_bytes(tmp.file("empty.txt"), "");
  auto r = run_ramtrain("train --data " + tmp.file("empty.txt") + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "empty.txt")) << r.output;
  rt::test::write_bytes(tmp.file("short.txt"), "too short");
  r = run_ramtrain("train --data " + tmp.file("short.txt") + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "seq")) << r.output;
  std::vector<int32_t> ids(1000, 5);
  ids[500] = 300;  // >= 258
  rt::token_file_write(tmp.file("ids.bin"), ids, 0);
  r = run_ramtrain("train --data " + tmp.file("ids.bin") + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "ids.bin")) << r.output;
  EXPECT_TRUE(contains(r.output, "300")) << r.output;
  r = run_ramtrain("train --data " + tmp.file("missing.txt") + common);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "missing.txt")) << r.output;
  EXPECT_FALSE(rt::is_directory(tmp.file("out/final")));  // nothing half-written
}

TEST(Cli, TrainRefusesContradictoryLowMemoryOptions) {
  // Refused on every machine (the check comes before the device is chosen),
  // before any model state is allocated, naming both options.
  rt::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  rt::test::write_bytes(tmp.file("fox.txt"), text);
  const std::string common = "train --data " + tmp.file("fox.txt") +
                             " --preset tiny-byte --steps 1 --seq-len 64 --out " + tmp.file("out") + " --low-memory ";
  for (const char* extra : {"--grads device", "--checkpoints device", "--slots 4", "--resident", "--delayed-update",
                            "--keep-activations 2"}) {
    auto r = run_ramtrain(common + extra);
    EXPECT_NE(r.exit_code, 0) << extra;
    EXPECT_TRUE(contains(r.output, "--low-memory")) << extra << ": " << r.output;
    const std::string name = std::string(extra).substr(0, std::string(extra).find(' '));
    EXPECT_TRUE(contains(r.output, name)) << extra << ": " << r.output;
  }
  EXPECT_FALSE(rt::is_directory(tmp.file("out/final")));
  // Alone it is accepted (on a CPU-only machine it changes nothing).
  auto ok = run_ramtrain(common + "--device cpu");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "warning: --low-memory only shapes the GPU engine")) << ok.output;
}

TEST(Cli, TrainKeepActivationsTakesAutoOrALayerCount) {
  rt::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  rt::test::write_bytes(tmp.file("fox.txt"), text);
  const std::string common = "train --data " + tmp.file("fox.txt") +
                             " --preset tiny-byte --steps 1 --seq-len 64 --device cpu --eval-batches 1 --out ";
  for (const char* bad : {"-2", "lots", "3x"}) {
    auto r = run_ramtrain(common + tmp.file(std::string("bad") + bad) + " --keep-activations " + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_TRUE(contains(r.output, "--keep-activations must be an integer >= 0 (or auto)")) << bad << ": " << r.output;
  }
  // 0 recomputes every layer; the log says how many are kept (tiny-byte has 6 layers)
  auto none = run_ramtrain(common + tmp.file("none") + " --keep-activations 0");
  EXPECT_EQ(none.exit_code, 0) << none.output;
  EXPECT_TRUE(contains(none.output, "activations of 0 of 6 layers kept")) << none.output;
  auto all = run_ramtrain(common + tmp.file("all") + " --keep-activations 99");
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_TRUE(contains(all.output, "activations of 6 of 6 layers kept")) << all.output;
}

}  // namespace
