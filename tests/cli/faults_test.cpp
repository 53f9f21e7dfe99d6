// Regressions of the outside fault test (issue 18), through the ramtrain
// binary: one run per --out (a second is refused naming the first; a lock left
// by a killed run does not block), a refused resume changes nothing on disk,
// an --out that cannot be written is refused before step 1, a checkpoint
// directory whose name disagrees with its content is skipped alone, a JSON
// number too large for a double is a bad record with its file:line (skipped
// under --bad-lines skip), a 10 MB bad line is quoted in ~200 bytes, and a
// FIFO or a device given as data is named for what it is. The model is the
// 2-layer, width-32 byte model of resume_test.cpp: a run takes well under a second.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "core/fs.h"
#include "io/checkpoint.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;
using rt::test::run_ramtrain;

using rt::test::Child;
using rt::test::contains;

struct Fixture {
  rt::test::TempDir tmp;
  Fixture() {
    rt::test::make_byte_model_dir(tmp.file("model"));
    const std::string text = rt::test::random_words(16000, 1);
    rt::test::write_bytes(tmp.file("data.txt"), text);
    rt::test::write_bytes(tmp.file("other.txt"), text.substr(0, 12000));
  }
  // A shell-quoted `train` command line into out.
  std::string train(const std::string& out, const std::string& extra = "", const std::string& data = "",
                    int steps = 10) const {
    return "train --model " + tmp.file("model") + " --init random --data " +
           (data.empty() ? tmp.file("data.txt") : data) + " --seq-len 16 --micro-batch 2 --steps " +
           std::to_string(steps) + " --lr 3e-3 --threads 2 --out " + out + " " + extra;
  }
};

std::string read_or_empty(const std::string& p) {
  try {
    return rt::read_text_file(p);
  } catch (const rt::Error&) {
    return "";
  }
}

bool superseded_any(const std::string& out) {
  for (auto& e : fs::directory_iterator(out))
    if (contains(e.path().filename().string(), ".superseded-")) return true;
  return false;
}

// Defect 1: two trainers on one --out both ran and interleaved checkpoints and final/.
TEST(Faults, ASecondRunIntoTheSameOutIsRefusedNamingTheFirst) {
  Fixture fx;
  const std::string out = fx.tmp.file("run"), lock = out + "/.ramtrain.lock";
  // A run that trains until it is killed (no checkpoints: nothing but the lock marks it).
  Child a({"train", "--model", fx.tmp.file("model"), "--init", "random", "--data", fx.tmp.file("data.txt"), "--seq-len",
           "16", "--micro-batch", "2", "--steps", "100000000", "--threads", "1", "--out", out},
          fx.tmp.file("a.log"));
  ASSERT_GT(a.pid, 0);
  const std::string mark = "pid " + std::to_string(a.pid) + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  while (!contains(read_or_empty(lock), mark) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(contains(read_or_empty(lock), mark)) << read_or_empty(fx.tmp.file("a.log"));

  auto r = run_ramtrain(fx.train(out));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(
      r.output, "--out " + out + " is in use by another ramtrain process (pid " + std::to_string(a.pid) + ", host "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "command " RAMTRAIN_BINARY " train")) << r.output;
  EXPECT_FALSE(contains(r.output, "step ")) << r.output;
  // --resume auto into it, and an export into it or into its final/, are refused too.
  r = run_ramtrain(fx.train(out, "--resume auto"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is in use by another ramtrain process (pid " + std::to_string(a.pid))) << r.output;
  ASSERT_EQ(run_ramtrain(fx.train(fx.tmp.file("done"), "--save-every 10")).exit_code, 0);
  const std::string ckpt = fx.tmp.file("done") + "/" + rt::checkpoint_dir_name(10);
  r = run_ramtrain("export " + ckpt + " --out " + out + "/final");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is in use by another ramtrain process (pid " + std::to_string(a.pid))) << r.output;
  EXPECT_FALSE(fs::exists(out + "/final"));
  r = run_ramtrain("export " + ckpt + " --out " + out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is in use by another ramtrain process")) << r.output;

  // Killed, the first run leaves its lock file behind, naming a dead process: it does not block.
  EXPECT_EQ(a.kill_and_wait(SIGKILL), 128 + SIGKILL);
  ASSERT_TRUE(contains(read_or_empty(lock), mark));
  r = run_ramtrain(fx.train(out));  // its metrics are there: a fresh run needs --overwrite
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, out + " already holds a run: metrics (" + out + "/metrics.jsonl)")) << r.output;
  r = run_ramtrain(fx.train(out, "--overwrite"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out + "/final/config.json")) << r.output;
  EXPECT_FALSE(fs::exists(lock));  // let go when the run ended
}

// Defect 2: a refused resume had already renamed the newer checkpoints aside.
TEST(Faults, ARefusedResumeChangesNothingOnDisk) {
  Fixture fx;
  const std::string out = fx.tmp.file("run");
  ASSERT_EQ(run_ramtrain(fx.train(out, "--save-every 5 --keep-checkpoints 0")).exit_code, 0);
  const std::string c5 = out + "/" + rt::checkpoint_dir_name(5), c10 = out + "/" + rt::checkpoint_dir_name(10);
  ASSERT_TRUE(fs::exists(c10));
  // Other data: refused after the checkpoint was chosen, when the data is compared.
  auto r = run_ramtrain("train --resume " + c5 + " --out " + out + " --data " + fx.tmp.file("other.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "the data differs")) << r.output;
  EXPECT_TRUE(fs::exists(c10)) << r.output;
  EXPECT_FALSE(superseded_any(out)) << r.output;
  EXPECT_FALSE(contains(r.output, "moved aside")) << r.output;
  EXPECT_EQ(rt::checkpoint_list(out).size(), 2u);
  // --resume auto still finds step 10.
  r = run_ramtrain("train --resume auto --out " + out + " --steps 12");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resuming from " + c10)) << r.output;
  // A resume that goes on from step 5 moves the newer ones aside, and says so.
  r = run_ramtrain("train --resume " + c5 + " --out " + out + " --steps 6");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, c10 + " is newer than the step this run continues from (5); moved aside")) << r.output;
  EXPECT_TRUE(superseded_any(out));
  // --resume auto with no valid checkpoint, refused later (no such data): the invalid ones stay where they are.
  const std::string out2 = fx.tmp.file("run2");
  ASSERT_EQ(run_ramtrain(fx.train(out2, "--save-every 5 --keep-checkpoints 0")).exit_code, 0);
  for (const auto& c : rt::checkpoint_list(out2)) fs::remove(c.path + "/manifest.json");
  r = run_ramtrain(fx.train(out2, "--resume auto", fx.tmp.file("missing.txt")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no valid checkpoint")) << r.output;
  EXPECT_EQ(rt::checkpoint_list(out2).size(), 2u) << r.output;
  EXPECT_FALSE(superseded_any(out2)) << r.output;
}

// Defect 3: an --out that cannot be written was found when final/ was written, after the training.
TEST(Faults, AnOutThatCannotBeWrittenIsRefusedBeforeStepOne) {
  Fixture fx;
  rt::test::write_bytes(fx.tmp.file("file"), "x");
  auto r = run_ramtrain(fx.train(fx.tmp.file("file")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--out " + fx.tmp.file("file") + " is a regular file, not a directory")) << r.output;
  EXPECT_FALSE(contains(r.output, "step ")) << r.output;
  EXPECT_EQ(rt::read_text_file(fx.tmp.file("file")), "x");
  r = run_ramtrain(fx.train(fx.tmp.file("file/sub")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--out " + fx.tmp.file("file/sub") + " cannot be created")) << r.output;
  EXPECT_FALSE(contains(r.output, "step ")) << r.output;
  // A run refused for another reason (bad data) leaves no --out behind.
  r = run_ramtrain(fx.train(fx.tmp.file("new"), "", fx.tmp.file("missing.txt")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(fs::exists(fx.tmp.file("new"))) << r.output;
}

// Defect 3 on real file systems, where this host lets us mount them (root): a
// read-only tmpfs is refused before step 1; a 64 KiB one gets the free-space
// warning (one checkpoint of this model is about 420 KB) before step 1.
TEST(Faults, AReadOnlyOrSmallFileSystemIsFoundBeforeStepOne) {
  Fixture fx;
  const std::string ro = fx.tmp.file("ro"), small = fx.tmp.file("small");
  fs::create_directories(ro);
  fs::create_directories(small);
  if (::geteuid() != 0 || ::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=65536") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto r = run_ramtrain(fx.train(ro + "/run"));
  ::umount(ro.c_str());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--out " + ro + "/run cannot be created")) << r.output;
  EXPECT_TRUE(contains(r.output, "Read-only file system")) << r.output;
  EXPECT_FALSE(contains(r.output, "step ")) << r.output;
  ASSERT_EQ(::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=65536"), 0);
  r = run_ramtrain(fx.train(small + "/run", "", "", 1));
  ::umount(small.c_str());
  const size_t warn = r.output.find("warning: --out " + small + "/run has ");
  EXPECT_NE(warn, std::string::npos) << r.output;
  EXPECT_TRUE(contains(r.output, "less than one checkpoint")) << r.output;
  EXPECT_LT(warn, r.output.find("step ")) << r.output;
}

// Defect 4: a copy of another step's checkpoint under a newer name made
// --resume auto move the good checkpoints aside and then fail.
TEST(Faults, ACheckpointWhoseNameDisagreesWithItsContentIsSkippedAlone) {
  Fixture fx;
  const std::string out = fx.tmp.file("run");
  ASSERT_EQ(run_ramtrain(fx.train(out, "--save-every 5 --keep-checkpoints 0")).exit_code, 0);
  const std::string c5 = out + "/" + rt::checkpoint_dir_name(5), c10 = out + "/" + rt::checkpoint_dir_name(10),
                    c15 = out + "/" + rt::checkpoint_dir_name(15);
  fs::copy(c5, c15, fs::copy_options::recursive);
  auto r = run_ramtrain("train --resume auto --out " + out + " --steps 12");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "skipping " + c15 + ": its name says step 15 but it holds step 5")) << r.output;
  EXPECT_TRUE(contains(r.output, "resuming from " + c10)) << r.output;
  EXPECT_TRUE(fs::exists(c5));
  EXPECT_EQ(rt::checkpoint_verify(c10), "");
  EXPECT_EQ(rt::checkpoint_read_trainer(out + "/" + rt::checkpoint_dir_name(12)).step, 12);
}

// Defect 7: a JSON number too large for a double escaped as "internal error: number overflow".
TEST(Faults, AnOverflowingJsonNumberIsABadRecordWithItsLine) {
  Fixture fx;
  const std::string tok = rt::test::fixture_dir() + "/tokenizers/qwen2";
  rt::test::write_bytes(
      fx.tmp.file("d.jsonl"),
      "{\"text\": \"hello there\"}\n{\"text\": \"x\", \"weight\": 1e99999}\n{\"text\": \"bye now\"}\n");
  auto r =
      run_ramtrain("tokenize " + fx.tmp.file("d.jsonl") + " --tokenizer " + tok + " --out " + fx.tmp.file("d.bin"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, fx.tmp.file("d.jsonl") + ":2: a number is out of range")) << r.output;
  EXPECT_TRUE(contains(r.output, "--bad-lines skip")) << r.output;
  EXPECT_FALSE(contains(r.output, "internal error")) << r.output;
  EXPECT_FALSE(fs::exists(fx.tmp.file("d.bin")));
  r = run_ramtrain("tokenize " + fx.tmp.file("d.jsonl") + " --tokenizer " + tok + " --out " + fx.tmp.file("d.bin") +
                   " --bad-lines skip");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2 records")) << r.output;
  EXPECT_TRUE(contains(r.output, "skipped 1 bad records (1 number out of range)")) << r.output;
}

// Defect 8: error messages quoted whole input lines.
TEST(Faults, ATenMegabyteBadLineIsQuotedShort) {
  Fixture fx;
  const std::string tok = rt::test::fixture_dir() + "/tokenizers/qwen2";
  const std::string line = "{\"text\": \"" + std::string(10 << 20, 'a') + "\n";  // no closing quote
  rt::test::write_bytes(fx.tmp.file("long.jsonl"), "{\"text\": \"fine\"}\n" + line);
  auto r =
      run_ramtrain("tokenize " + fx.tmp.file("long.jsonl") + " --tokenizer " + tok + " --out " + fx.tmp.file("l.bin"));
  EXPECT_EQ(r.exit_code, 1) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, fx.tmp.file("long.jsonl") + ":2:")) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "bytes in all)")) << r.output.substr(0, 2000);
  // The quote is cut to 200 bytes; the rest of the message is the path and the hint.
  EXPECT_LT(r.output.size(), 800u) << r.output.substr(0, 2000);
  // A 1 MB number in config.json: the file named, the token cut.
  fs::create_directories(fx.tmp.file("m"));
  rt::test::write_bytes(fx.tmp.file("m/config.json"), "{\"hidden_size\": 1" + std::string(1 << 20, '0') + "e99999}");
  r = run_ramtrain("train --model " + fx.tmp.file("m") + " --init random --data " + fx.tmp.file("data.txt") +
                   " --out " + fx.tmp.file("o"));
  EXPECT_EQ(r.exit_code, 1) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "[config] " + fx.tmp.file("m/config.json") + ": not valid JSON"))
      << r.output.substr(0, 2000);
  EXPECT_LT(r.output.size(), 800u) << r.output.substr(0, 2000);
  // A 1 MB value in a TOML file, quoted by a message that does not cut it itself: main's backstop cuts it.
  rt::test::write_bytes(fx.tmp.file("c.toml"), "export-dtype = \"" + std::string(1 << 20, 'x') + "\"\n");
  r = run_ramtrain(fx.train(fx.tmp.file("o"), "--config " + fx.tmp.file("c.toml")));
  EXPECT_EQ(r.exit_code, 1) << r.output.substr(0, 2000);
  EXPECT_TRUE(contains(r.output, "export-dtype")) << r.output.substr(0, 2000);
  EXPECT_LT(r.output.size(), 4200u) << r.output.substr(0, 2000);
}

// Defect 11: a FIFO, /dev/null or /dev/zero as data got "no such file or directory".
TEST(Faults, AFifoOrADeviceAsDataIsNamedForWhatItIs) {
  Fixture fx;
  ASSERT_EQ(::mkfifo(fx.tmp.file("pipe").c_str(), 0644), 0);
  struct Case {
    std::string path, kind;
  };
  for (const Case& c : {Case{fx.tmp.file("pipe"), "is a FIFO (named pipe), not a regular file or directory"},
                        Case{"/dev/null", "is a character device, not a regular file or directory"},
                        Case{"/dev/zero", "is a character device, not a regular file or directory"}}) {
    auto r = run_ramtrain(fx.train(fx.tmp.file("o"), "", c.path));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, c.path + ": " + c.kind)) << r.output;
    EXPECT_FALSE(contains(r.output, "no such file")) << r.output;
    r = run_ramtrain("tokenize " + c.path + " --tokenizer " + rt::test::fixture_dir() + "/tokenizers/qwen2 --out " +
                     fx.tmp.file("t.bin"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, c.path + ": " + c.kind)) << r.output;
  }
  // A directory of data files still trains (the FIFO beside them is not a data file).
  fs::create_directories(fx.tmp.file("dir"));
  fs::copy_file(fx.tmp.file("data.txt"), fx.tmp.file("dir/a.txt"));
  ASSERT_EQ(::mkfifo(fx.tmp.file("dir/pipe.txt").c_str(), 0644), 0);
  auto r = run_ramtrain(fx.train(fx.tmp.file("o"), "", fx.tmp.file("dir"), 2));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "step     2/2")) << r.output;
}

}  // namespace
