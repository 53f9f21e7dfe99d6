// The options of the ramtrain commands through the binary: one typed path for
// flags and TOML (a value refused on the command line is refused in the file,
// naming file and key), messages that name the flag (not an internal), help
// that fits 100 columns and is grouped, `ramtrain help CMD`, positional
// arguments anywhere, GPU-only options warned about on a CPU run, model
// directories with unreadable weights named before any data is read, and HF
// model ids found in the local HF cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/fs.h"
#include "engine/backend.h"
#include "io/token_file.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;
using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

using rt::test::contains;

// A tiny byte-vocab Llama (2 layers, width 32) with random init, and a text file.
struct Fixture {
  TempDir tmp;
  Fixture() {
    rt::test::make_byte_model_dir(tmp.file("model"));
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
    write_bytes(tmp.file("data.txt"), text);
  }
  // A complete, valid train command line into OUT (then extra options).
  std::string train(const std::string& out, const std::string& extra = "") const {
    return "train --model " + tmp.file("model") + " --init random --data " + tmp.file("data.txt") +
           " --seq-len 16 --micro-batch 2 --steps 2 --threads 1 --eval-batches 1 --out " + tmp.file(out) + " " + extra;
  }
};

TEST(TrainOptions, EveryHelpFitsHundredColumns) {
  std::vector<std::string> cmds = {"--help"};
  for (const char* c : {"train", "sample", "tokenize", "export", "loss", "plan"})
    cmds.push_back(std::string(c) + " --help");
  for (const std::string& c : cmds) {
    auto r = run_ramtrain(c);
    EXPECT_EQ(r.exit_code, 0) << c;
    std::istringstream in(r.output);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      EXPECT_LE(line.size(), 100u) << c << ", line " << n << ": " << line;
    }
    EXPECT_GT(n, 5) << c;
  }
  const std::string train = run_ramtrain("train --help").output;
  for (const char* g : {"\nModel:\n", "\nData:\n", "\nSchedule:\n", "\nOptimizer:\n", "\nGPU memory",
                        "\nCheckpoints and output:\n", "\nLogging and evaluation:\n"})
    EXPECT_TRUE(contains(train, g)) << g;
  // The metrics policy is stated.
  EXPECT_TRUE(contains(train, "reported once; training continues")) << train;
}

TEST(TrainOptions, HelpCommandIsTheCommandsHelp) {
  for (const char* c : {"train", "sample", "export"}) {
    auto a = run_ramtrain(std::string("help ") + c), b = run_ramtrain(std::string(c) + " --help");
    EXPECT_EQ(a.exit_code, 0) << a.output;
    EXPECT_EQ(a.output, b.output) << c;
  }
  auto u = run_ramtrain("help frobnicate");
  EXPECT_NE(u.exit_code, 0);
  EXPECT_TRUE(contains(u.output, "unknown command 'frobnicate'")) << u.output;
}

// Issue 18 item 12: the message names the flag, not the schedule's internals.
TEST(TrainOptions, BadValuesNameTheFlag) {
  Fixture f;
  auto steps = run_ramtrain(f.train("o1", "--steps 0"));
  EXPECT_EQ(steps.exit_code, 1) << steps.output;
  EXPECT_TRUE(contains(steps.output, "--steps must be an integer >= 1, got '0'")) << steps.output;
  EXPECT_FALSE(contains(steps.output, "total_steps")) << steps.output;
  auto lr = run_ramtrain(f.train("o2", "--lr -1"));
  EXPECT_EQ(lr.exit_code, 1) << lr.output;
  EXPECT_TRUE(contains(lr.output, "--lr must be a number > 0, got '-1'")) << lr.output;
  EXPECT_FALSE(contains(lr.output, "optimizer config")) << lr.output;
  auto warm = run_ramtrain(f.train("o3", "--warmup 5"));  // --steps 2
  EXPECT_EQ(warm.exit_code, 1) << warm.output;
  EXPECT_TRUE(contains(warm.output, "--warmup 5 is longer than the run")) << warm.output;
  EXPECT_FALSE(rt::is_directory(f.tmp.file("o1/final")));
}

// Issue 18 item 10: values accepted silently before are refused, naming the flag.
TEST(TrainOptions, NegativeCountsAreRefused) {
  Fixture f;
  for (const char* bad :
       {"--save-every -1", "--keep-checkpoints -1", "--clip -1", "--eval-every -3", "--max-bad-steps -1",
        "--micro-batch 0", "--schedule cosin", "--device gpu", "--mlp-chunk-tokens -1", "--mlp-chunk-tokens some"}) {
    auto r = run_ramtrain(f.train("o", bad));
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.output;
    const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_TRUE(contains(r.output, flag + " must be")) << bad << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(f.tmp.file("o/final")));
}

// Issue 18 item 10: --config DIR and TOML values of the wrong type are refused
// with the file and key; the same bounds hold in the file as on the command line.
TEST(TrainOptions, ConfigFileValuesTakeTheSamePath) {
  Fixture f;
  auto dir = run_ramtrain(f.train("o", "--config " + f.tmp.path()));
  EXPECT_EQ(dir.exit_code, 1) << dir.output;
  EXPECT_TRUE(contains(dir.output, f.tmp.path() + ": is a directory")) << dir.output;

  const std::string toml = f.tmp.file("run.toml");
  struct Case {
    const char* line;
    const char* expect;
  };
  for (const Case& c :
       {Case{"delayed_update = \"yes\"", "key 'delayed_update' must be true or false"},
        Case{"steps = \"ten\"", "key 'steps' must be an integer"},
        Case{"steps = 0", "key 'steps' must be an integer >= 1, got '0'"},
        Case{"lr = -1.0", "key 'lr' must be a number > 0"}, Case{"clip = -1", "key 'clip' must be a number >= 0"},
        Case{"save-every = -1", "key 'save-every' must be an integer >= 0"},
        Case{"keep_checkpoints = -1", "key 'keep_checkpoints' must be an integer >= 0"},
        Case{"seq_len = 1.5", "key 'seq_len' must be an integer, got a float"},
        Case{"schedule = \"cosin\"", "key 'schedule' must be one of cosine, constant, linear"},
        Case{"data = [1, 2]", "key 'data' must be an array of strings"}}) {
    write_bytes(toml, std::string(c.line) + "\n");
    auto r = run_ramtrain(f.train("o", "--config " + toml));
    EXPECT_EQ(r.exit_code, 1) << c.line << ": " << r.output;
    EXPECT_TRUE(contains(r.output, toml + ": " + c.expect)) << c.line << ": " << r.output;
  }
  EXPECT_FALSE(fs::exists(f.tmp.file("o/final")));
  // Good values of every TOML type are taken; the command line wins.
  write_bytes(toml, "delayed_update = true\nlr = 2e-3\nsteps = 50\nschedule = \"linear\"\ndata = [\"" +
                        f.tmp.file("data.txt") + "\"]\nmax_gpu_memory = \"1G\"\n");
  auto ok = run_ramtrain("train --model " + f.tmp.file("model") +
                         " --init random --seq-len 16 --micro-batch 2 "
                         "--threads 1 --eval-batches 1 --device cpu --steps 2 --out " +
                         f.tmp.file("ok") + " --config " + toml);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "training 2 steps")) << ok.output;
  EXPECT_TRUE(contains(ok.output, "delayed update:")) << ok.output;
}

// CLI polish: a positional argument may come anywhere.
TEST(TrainOptions, ExportTakesTheCheckpointAnywhere) {
  Fixture f;
  auto t = run_ramtrain(f.train("run", "--save-every 1"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto e = run_ramtrain("export --out " + f.tmp.file("hf") + " " + f.tmp.file("run"));
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_TRUE(rt::file_exists(f.tmp.file("hf/config.json"))) << e.output;
  auto two = run_ramtrain("export --out " + f.tmp.file("hf2") + " " + f.tmp.file("run") + " extra");
  EXPECT_NE(two.exit_code, 0);
  EXPECT_TRUE(contains(two.output, "unexpected argument 'extra'")) << two.output;
}

TEST(TrainOptions, GpuOnlyOptionsWarnOnACpuRun) {
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--device cpu --slots 2 --grads host"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: --slots, --grads only shape the GPU engine")) << r.output;
  auto quiet = run_ramtrain(f.train("o2", "--device cpu"));
  EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
  EXPECT_FALSE(contains(quiet.output, "only shape")) << quiet.output;
}

// Values of options the data at hand does not use are checked all the same
// (a typo in a script must not wait for the day it meets .jsonl data), and an
// explicit --device cuda without a usable GPU is refused, not run on the CPU.
TEST(TrainOptions, UnusedOptionValuesAreCheckedAndCudaIsNotFakedOnTheCpu) {
  Fixture f;
  for (const char* bad : {"--truncate foo", "--bad-lines foo", "--pack foo", "--pack-attention foo",
                          "--chat-format foo", "--text-split foo", "--data-format foo"}) {
    auto r = run_ramtrain(f.train("o", bad));
    EXPECT_EQ(r.exit_code, 1) << bad << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "must be one of")) << bad << "\n" << r.output;
  }
  if (rt::cuda_backend_available()) GTEST_SKIP() << "a GPU is usable here";
  auto r = run_ramtrain(f.train("o", "--device cuda"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--device cuda: no CUDA GPU can be used here")) << r.output;
  EXPECT_FALSE(contains(r.output, "step ")) << r.output;
}

// A token file whose ids exceed its own header's vocabulary is damaged: refused.
TEST(TrainOptions, TokenFileIdsBeyondItsHeaderAreRefused) {
  Fixture f;
  std::vector<int32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 200);
  rt::token_file_write(f.tmp.file("t.tok"), ids, 258);
  std::string bytes = rt::read_text_file(f.tmp.file("t.tok"));
  const uint64_t v = 100;  // the header's vocab (offset 24), now below ids up to 199
  std::memcpy(bytes.data() + 24, &v, 8);
  write_bytes(f.tmp.file("bad.tok"), bytes);
  auto r = run_ramtrain("train --model " + f.tmp.file("model") + " --init random --data " + f.tmp.file("bad.tok") +
                        " --seq-len 16 --micro-batch 2 --steps 1 --threads 1 --out " + f.tmp.file("o"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "token id 100 at position 100 (0-based, of 400 tokens) is >= the vocab size 100 its "
                                 "own header gives: the file is damaged"))
      << r.output;
  // A damaged magic is not read as text (it was: "invalid UTF-8 ... pass --bad-lines skip").
  bytes[7] = 'Z';
  write_bytes(f.tmp.file("magic.tok"), bytes);
  r = run_ramtrain("train --model " + f.tmp.file("model") + " --init random --data " + f.tmp.file("magic.tok") +
                   " --seq-len 16 --micro-batch 2 --steps 1 --threads 1 --out " + f.tmp.file("o2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "magic.tok: is named or begins like a ramtrain token file but has no valid RTTOKENS "
                                 "header"))
      << r.output;
}

TEST(TrainOptions, DataParallelRefusesQuantizedMomentsByName) {
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--device cpu --grad-accum 2 --nproc-per-node 2 --optimizer adamw8bit"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--nproc-per-node")) << r.output;
  EXPECT_TRUE(contains(r.output, "--optimizer adamw8bit")) << r.output;
}

TEST(TrainOptions, GradsFoldRunsOnTheCpuAndRefusesDelayedUpdate) {
  // --grads fold has a CPU twin (engine/fold_clip.h): no GPU-only warning
  Fixture f;
  auto r = run_ramtrain(f.train("o", "--device cpu --grads fold"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "only shape")) << r.output;
  auto bad = run_ramtrain(f.train("o2", "--device cpu --grads fold --delayed-update"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--grads fold")) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--delayed-update")) << bad.output;
  EXPECT_FALSE(fs::exists(f.tmp.file("o2") + "/final")) << "a refused run wrote its output";
}

// CLI polish: a model dir with weights in another format is named with what it
// holds and what to do, before the data is read (here the data does not exist).
TEST(TrainOptions, ModelDirWithOtherWeightFormatsIsNamedFirst) {
  Fixture f;
  for (const char* file : {"pytorch_model.bin", "model-q4_k_m.gguf"}) {
    const std::string dir = f.tmp.file(std::string("m-") + file);
    rt::make_dirs(dir);
    write_bytes(dir + "/config.json", rt::read_text_file(f.tmp.file("model/config.json")));
    write_bytes(dir + "/" + file, "not really weights");
    auto r =
        run_ramtrain("train --model " + dir + " --data " + f.tmp.file("missing.txt") + " --out " + f.tmp.file("o"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, std::string("holds ") + file + " but no *.safetensors")) << r.output;
    EXPECT_TRUE(contains(r.output, "save_pretrained")) << r.output;
    EXPECT_FALSE(contains(r.output, "missing.txt")) << r.output;
  }
}

// CLI polish: ORG/NAME is found in $HF_HOME/hub/models--ORG--NAME/snapshots/<refs/main>/
// (or $HF_HUB_CACHE/models--...), by every command that takes --model.
TEST(TrainOptions, ModelIdIsFoundInTheLocalHfCache) {
  Fixture f;
  auto t = run_ramtrain(f.train("run"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string repo = f.tmp.file("hf/hub/models--acme--tiny-byte");
  rt::make_dirs(repo + "/snapshots/0123abc");
  rt::make_dirs(repo + "/snapshots/fedcba9");  // an older revision refs/main does not name
  rt::make_dirs(repo + "/refs");
  write_bytes(repo + "/refs/main", "0123abc");
  for (auto& e : fs::directory_iterator(f.tmp.file("run/final")))
    fs::copy_file(e.path(), repo + "/snapshots/0123abc/" + e.path().filename().string());
  ::setenv("HF_HOME", f.tmp.file("hf").c_str(), 1);
  auto s = run_ramtrain("sample --model acme/tiny-byte --prompt the --max-tokens 4 --temperature 0");
  auto tr =
      run_ramtrain("train --model acme/tiny-byte --data " + f.tmp.file("data.txt") +
                   " --seq-len 16 --micro-batch 2 --steps 1 --threads 1 --eval-batches 1 --out " + f.tmp.file("ft"));
  auto missing = run_ramtrain("sample --model acme/absent --prompt the");
  ::unsetenv("HF_HOME");
  // eval takes model ids too, and HF_HUB_CACHE names the hub directory itself
  ::setenv("HF_HUB_CACHE", f.tmp.file("hf/hub").c_str(), 1);
  auto ev = run_ramtrain("eval --model acme/tiny-byte --data " + f.tmp.file("data.txt") + " --seq-len 16 --device cpu");
  ::unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_EQ(s.exit_code, 0) << s.output;
  EXPECT_EQ(tr.exit_code, 0) << tr.output;
  EXPECT_TRUE(contains(tr.output, "snapshots/0123abc")) << tr.output;
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(contains(missing.output, "acme/absent")) << missing.output;
  EXPECT_TRUE(contains(missing.output, "HF cache")) << missing.output;
}

}  // namespace
