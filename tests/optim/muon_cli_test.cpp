// --optimizer muon | muon8bit | muon4bit through the binary (CPU backend): a run resumed
// from a mid-run checkpoint ends with the uninterrupted run's state files byte
// for byte (masters, Muon momentum, Adam moments; fp32, bf16-sr and bf16-kahan
// masters); bad combinations refused
// naming the flag, nothing written; the start line names Muon and its momentum.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/fs.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;
using rt::test::contains;
using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

struct Fixture {
  TempDir tmp;
  Fixture() {
    std::string text;
    for (int i = 0; i < 300; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
    write_bytes(tmp.file("data.txt"), text);
  }
  std::string train(const std::string& out, const std::string& extra) const {
    return "train --preset tiny-byte --data " + tmp.file("data.txt") +
           " --seq-len 16 --micro-batch 2 --threads 1 --eval-batches 1 --device cpu --lr 3e-3 --out " +
           tmp.file(out) + " " + extra;
  }
};

std::string state_file(const std::string& ckpt, const std::string& unit) {
  return ckpt + "/state-" + unit + ".safetensors";
}

TEST(MuonCli, ResumeEqualsTheUninterruptedRunBitForBit) {
  Fixture f;
  const std::vector<std::string> units = {"embed", "layer.0", "layer.5", "head"};
  struct Mode {
    const char* opt;
    const char* master;
  };
  for (const Mode& m : {Mode{"muon", ""}, Mode{"muon8bit", ""}, Mode{"muon4bit", ""}, Mode{"muon4bit", "bf16-sr"},
                        Mode{"muon", "bf16-kahan"}}) {
    const std::string opt = m.opt, name = opt + (*m.master ? std::string("-") + m.master : "");
    SCOPED_TRACE(name);
    const std::string mode =
        "--optimizer " + opt + " --steps 6 --save-every 3" + (*m.master ? std::string(" --master ") + m.master : "");
    auto r = run_ramtrain(f.train("a-" + name, mode));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "optimizer " + opt + ": Muon (momentum 0.9")) << r.output;
    if (*m.master) EXPECT_TRUE(contains(r.output, std::string("(") + m.master + " master, " + opt)) << r.output;
    const std::string a = f.tmp.file("a-" + name);
    r = run_ramtrain("train --resume " + a + "/ckpt-00000003 --out " + f.tmp.file("b-" + name));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string b = f.tmp.file("b-" + name);
    for (const std::string& u : units) {
      const std::string want = rt::read_text_file(state_file(a + "/ckpt-00000006", u));
      EXPECT_TRUE(rt::read_text_file(state_file(b + "/ckpt-00000006", u)) == want) << u << " differs";
      EXPECT_TRUE(contains(want, "\"update_rule\":\"muon\"")) << u;
      // and the state moved from step 3 (so equal files are no accident)
      EXPECT_FALSE(rt::read_text_file(state_file(a + "/ckpt-00000003", u)) == want) << u;
    }
  }
}

TEST(MuonCli, BadCombinationsAreRefusedNamingTheFlag) {
  Fixture f;
  struct Case {
    std::string extra;
    std::string expect;
  };
  for (const Case& c :
       {Case{"--optimizer muon --grads device", "--optimizer muon orthogonalises whole matrices"},
        Case{"--muon-momentum 0.9", "--muon-momentum applies to --optimizer muon | muon8bit | muon4bit only"},
        Case{"--optimizer muon --muon-momentum 1.5", "--muon-momentum"},
        Case{"--optimizer muon --nproc-per-node 2 --grad-accum 2",
             "--nproc-per-node or a launcher) shards AdamW state only"}}) {
    SCOPED_TRACE(c.extra);
    auto r = run_ramtrain(f.train("bad", c.extra + " --steps 2"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, c.expect)) << r.output;
    EXPECT_FALSE(fs::exists(f.tmp.file("bad/final")));
  }
  // a checkpoint's Muon momentum does not turn into Adam moments, nor back
  auto r = run_ramtrain(f.train("mu", "--optimizer muon --steps 2 --save-every 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ramtrain(f.train("ad", "--steps 2 --save-every 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_ramtrain("train --resume " + f.tmp.file("mu/ckpt-00000002") + " --optimizer adamw --steps 4 --out " +
                   f.tmp.file("mu2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "--optimizer adamw (the checkpoint ran with muon): Muon momentum and Adam moments do "
                       "not convert; resume with --optimizer muon, muon8bit or muon4bit"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "allowed")) << r.output;  // refused before any "allowed" warning
  r = run_ramtrain("train --resume " + f.tmp.file("ad/ckpt-00000002") + " --optimizer muon8bit --steps 4 --out " +
                   f.tmp.file("ad2"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--optimizer muon8bit (the checkpoint ran with adamw): Muon momentum and Adam moments "
                                 "do not convert; resume with --optimizer adamw, adamw8bit or adamw4bit"))
      << r.output;
  EXPECT_FALSE(fs::exists(f.tmp.file("mu2/final")));
  EXPECT_FALSE(fs::exists(f.tmp.file("ad2/final")));
  // but muon -> muon8bit converts the momentum (like adamw -> adamw8bit)
  r = run_ramtrain("train --resume " + f.tmp.file("mu/ckpt-00000002") + " --optimizer muon8bit --steps 3 --out " +
                   f.tmp.file("mu3"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // and muon -> muon4bit
  r = run_ramtrain("train --resume " + f.tmp.file("mu/ckpt-00000002") + " --optimizer muon4bit --steps 3 --out " +
                   f.tmp.file("mu4"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "muon4bit moments")) << r.output;
  // plan refuses what train refuses
  r = run_ramtrain("plan --preset tiny-byte --seq-len 16 --micro-batch 2 --optimizer muon --grads device");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--optimizer muon orthogonalises whole matrices")) << r.output;
  // the plan counts the GPU Newton-Schulz workspace and the pinned staging
  r = run_ramtrain("plan --preset tiny-byte --seq-len 16 --micro-batch 2 --optimizer muon");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Muon Newton-Schulz workspace")) << r.output;
  EXPECT_TRUE(contains(r.output, "pinned Muon Newton-Schulz staging")) << r.output;
}

// --muon-momentum reaches the update (a different run from the default), and
// the CPU twins of --delayed-update and --grads fold, which update whole
// units, run with Muon.
TEST(MuonCli, MomentumFlagAndWholeUnitModesRun) {
  Fixture f;
  auto a = run_ramtrain(f.train("d", "--optimizer muon --steps 3"));
  auto b = run_ramtrain(f.train("m", "--optimizer muon --steps 3 --muon-momentum 0.5"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "Muon (momentum 0.5")) << b.output;
  EXPECT_FALSE(rt::read_text_file(f.tmp.file("d/final/model.safetensors")) ==
               rt::read_text_file(f.tmp.file("m/final/model.safetensors")));
  for (const char* extra : {"--delayed-update", "--grads fold"}) {
    auto r = run_ramtrain(f.train(std::string("w") + extra[2], std::string("--optimizer muon --steps 3 ") + extra));
    EXPECT_EQ(r.exit_code, 0) << extra << ": " << r.output;
  }
}

}  // namespace
