// The lean-state options through the binary (--optimizer, --moment-rounding,
// --master bf16-*: docs/lean_state.md): bad values and combinations refused
// naming the flag (and file: key in TOML), nothing written; the host bytes per
// parameter `train` prints at start equal HostState::planned_bytes for the
// CPU backend's state, and `ramtrain plan` builds its state items from the same
// function (so the two agree for every mode).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/fs.h"
#include "engine/device_plan.h"
#include "model/spec.h"
#include "optim/muon.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

namespace fs = std::filesystem;
using rt::test::run_ramtrain;
using rt::test::TempDir;
using rt::test::write_bytes;

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

struct Fixture {
  TempDir tmp;
  Fixture() {
    rt::make_dirs(tmp.file("model"));
    write_bytes(tmp.file("model/config.json"),
                "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 32, "
                "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                "\"num_key_value_heads\": 2, \"vocab_size\": 258, \"rms_norm_eps\": 1e-5, "
                "\"max_position_embeddings\": 64, \"bos_token_id\": 256, \"eos_token_id\": 257}");
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i % 7) + ". ";
    write_bytes(tmp.file("data.txt"), text);
  }
  std::string train(const std::string& out, const std::string& extra = "") const {
    return "train --model " + tmp.file("model") + " --init random --data " + tmp.file("data.txt") +
           " --seq-len 16 --micro-batch 2 --steps 2 --threads 1 --eval-batches 1 --device cpu --out " + tmp.file(out) +
           " " + extra;
  }
};

TEST(TrainLeanOptions, BadValuesAndCombinationsAreRefusedNamingTheFlag) {
  Fixture f;
  struct Case {
    const char* extra;
    const char* expect;
  };
  for (const Case& c : {Case{"--optimizer muon2bit", "--optimizer"}, Case{"--optimizer adamw3bit", "--optimizer"},
                        Case{"--master bf16", "--master"}, Case{"--moment-rounding up", "--moment-rounding"},
                        Case{"--moment-rounding nearest",
                             "--moment-rounding applies to quantized moments only; add --optimizer adamw8bit"}}) {
    auto r = run_ramtrain(f.train("o", c.extra));
    EXPECT_EQ(r.exit_code, 1) << c.extra << ": " << r.output;
    EXPECT_TRUE(contains(r.output, c.expect)) << c.extra << ": " << r.output;
  }
  const std::string toml = f.tmp.file("run.toml");
  write_bytes(toml, "optimizer = \"adamw2bit\"\n");
  auto r = run_ramtrain(f.train("o", "--config " + toml));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, toml + ": key 'optimizer' must be one of adamw, adamw8bit, adamw4bit")) << r.output;
  write_bytes(toml, "moment_rounding = \"nearest\"\n");
  r = run_ramtrain(f.train("o", "--config " + toml));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--moment-rounding applies to quantized moments only")) << r.output;
  EXPECT_FALSE(fs::exists(f.tmp.file("o/final")));
  // and good values train, in TOML too
  write_bytes(toml, "optimizer = \"adamw4bit\"\nmoment_rounding = \"nearest\"\nmaster = \"bf16-sr\"\n");
  r = run_ramtrain(f.train("ok", "--config " + toml));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(bf16-sr master, adamw4bit moments, nearest rounding)")) << r.output;
  EXPECT_FALSE(contains(r.output, "--master")) << "a bf16 master is no GPU-only option: " << r.output;
}

TEST(TrainLeanOptions, StartLineAndPlanGiveThePlannedHostBytes) {
  Fixture f;
  const rt::ModelSpec spec = rt::spec_from_config_file(f.tmp.file("model/config.json"));
  struct Mode {
    const char* flags;
    rt::MasterStorage master;
    rt::MomentStorage moments;
    rt::UpdateRule rule = rt::UpdateRule::adamw;
  };
  int i = 0;
  for (const Mode& m :
       {Mode{"", rt::MasterStorage::fp32, rt::MomentStorage::fp32},
        Mode{"--optimizer adamw8bit", rt::MasterStorage::fp32, rt::MomentStorage::q8},
        Mode{"--optimizer adamw4bit --master bf16-kahan", rt::MasterStorage::bf16_kahan, rt::MomentStorage::q4},
        Mode{"--master bf16-sr", rt::MasterStorage::bf16_sr, rt::MomentStorage::fp32},
        Mode{"--optimizer muon", rt::MasterStorage::fp32, rt::MomentStorage::fp32, rt::UpdateRule::muon},
        Mode{"--optimizer muon8bit", rt::MasterStorage::fp32, rt::MomentStorage::q8, rt::UpdateRule::muon},
        Mode{"--optimizer muon4bit", rt::MasterStorage::fp32, rt::MomentStorage::q4, rt::UpdateRule::muon},
        Mode{"--optimizer muon4bit --master bf16-sr", rt::MasterStorage::bf16_sr, rt::MomentStorage::q4,
             rt::UpdateRule::muon}}) {
    SCOPED_TRACE(m.flags);
    auto r = run_ramtrain(f.train(std::string("m").append(std::to_string(i++)), m.flags));  // "m" + s: GCC 12's false -Wrestrict
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // the CPU backend: host gradients, no pinned shadow of an fp32 master; a bf16 master is its one shadow
    const int shadows = m.master == rt::MasterStorage::fp32 ? 0 : 1;
    const double bpp = static_cast<double>(rt::HostState::planned_bytes(spec, m.master, shadows, true, m.moments, m.rule)) /
                       static_cast<double>(spec.params_total());
    char want[64];
    std::snprintf(want, sizeof want, "%.2f B/param host state", bpp);
    EXPECT_TRUE(contains(r.output, want)) << want << "\n" << r.output;
    // plan (the CUDA engine's layout): its state items are planned_bytes with one pinned shadow
    auto p = run_ramtrain("plan --model " + f.tmp.file("model") + " --seq-len 16 --micro-batch 2 --json " + m.flags +
                          (m.master == rt::MasterStorage::fp32 ? " --master fp32" : ""));
    ASSERT_EQ(p.exit_code, 0) << p.output;
    const bool host_grads = contains(p.output, "\"host_grads\":true");
    const uint64_t state = rt::HostState::planned_bytes(spec, m.master, 1, host_grads, m.moments, m.rule);
    const size_t at = p.output.find("\"needed_bytes\":");
    ASSERT_NE(at, std::string::npos) << p.output;
    const double needed = std::strtod(p.output.c_str() + at + 15, nullptr);
    double extra = 24.0 * 2 * 16;  // the token batches and staging (no host checkpoints at this size)
    rt::DevicePlacement place;     // the pinned gradient landing: slabs with host gradients, else the ring
    place.host_grads = host_grads;
    rt::CudaOptions co;            // as plan sets them: Muon lands whole units
    co.muon = m.rule == rt::UpdateRule::muon;
    extra += static_cast<double>(rt::gradient_landing_bytes(spec, place, co));
    if (m.rule == rt::UpdateRule::muon) {  // the pinned staging of the GPU Newton-Schulz lanes, the fp32 scratch
      const int64_t mx = rt::muon_matrix_dims(spec).max_numel;
      extra += 2.0 * (6.0 * static_cast<double>(mx) + 8.0) +  // 2 lanes: fp32 U, bf16 O, the norm's double
               static_cast<double>(
                   rt::muon_scratch_bytes(spec, m.master, m.moments != rt::MomentStorage::fp32, /*pipelined=*/true));
    }
    EXPECT_EQ(needed, static_cast<double>(state) + extra) << p.output;
  }
}

}  // namespace
