// The state tier (state/state_tier.h, --state-dir) on the CUDA engine: its
// optimizer phase pages each unit's state (moments or their codes, a split
// master's remainder) through the file -- host, device-chunk and folded
// gradients, the delayed update -- and the run is bit-identical to the same
// engine all in RAM: every step's loss and gradient norm, and the final
// master, moments and remainders byte for byte. Under a budget below the
// minimum with the weights in RAM the weights page too: the engine holds
// every layer on the device (--resident) and uploads each unit right after
// its update (a split or bf16 master; an fp32 master pages while the device
// loads the engine's own shadows), bit-identical as well. Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/trainer.h"
#include "state/state_tier.h"
#include "testutil.h"

namespace {

rt::ModelSpec gpu_spec(int64_t layers) {
  rt::ModelSpec s;
  s.architecture = "LlamaForCausalLM";
  s.hidden = 256;
  s.intermediate = 512;
  s.n_layers = layers;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.vocab = 264;
  s.rms_eps = 1e-5;
  s.max_positions = 512;
  return s;
}

struct Mode {
  const char* name;
  rt::MomentStorage moments;
  rt::MasterStorage master;
  const char* master_flag;
  const char* grads;
  bool delayed;
  bool weights = false;  // page the weights too (every layer resident on the device)
};

struct TierRun {
  std::vector<double> loss, norm;
  std::vector<uint8_t> state;
  int paged = 0;
  bool weights_paged = false;
};

TierRun train(const Mode& m, const std::string& state_dir) {
  const int64_t B = 4, T = 128;
  rt::HostState st(gpu_spec(3), std::string(m.grads) == "host", m.moments, m.master);
  st.init_random(5, 0.05f);
  rt::CudaOptions co;
  co.slots = 2;
  co.master = m.master_flag;
  co.grads = m.grads;
  co.delayed_update = m.delayed;
  co.resident = m.weights;  // in both runs: the same plan
  auto gpu = rt::make_cuda_backend(st, B, T, co);
  std::unique_ptr<rt::StateTier> tier;
  if (!state_dir.empty()) {
    uint64_t budget = 0;  // every unit's optimizer state
    if (m.weights) {      // the smallest budget with the weights paged too
      const std::vector<rt::TierUnitBytes> b = rt::tier_unit_bytes(st);
      budget = rt::tier_place(b, rt::tier_place(b, 0).min_bytes - 1, true).min_bytes;
    }
    tier = rt::make_state_tier(st, *gpu, state_dir, budget);
  }
  EXPECT_TRUE(gpu->pages_state());
  rt::DatasetOptions d;
  d.seq_len = T;
  d.seed = 3;
  rt::Dataset data(rt::load_text_documents({rt::test::shared_data_dir() + "/tinyshakespeare.txt"}), d);
  TierRun r;
  rt::OptimStep o;
  o.lr = 1e-3;
  o.clip = 0;  // fold is exact without clipping (its own rule otherwise): every mode comparable to itself
  for (int i = 0; i < 4; ++i) {
    std::vector<rt::Batch> b;
    int64_t nv = 0;
    b.push_back(data.next_batch(B));
    nv += static_cast<int64_t>(b.back().targets.size());
    o.t = i + 1;
    const rt::StepStats s = gpu->train_step(b, nv, o);
    r.loss.push_back(s.loss_sum);
    r.norm.push_back(s.grad_norm);
  }
  gpu->sync();
  if (tier) {
    r.paged = tier->plan().n_paged();
    r.weights_paged = tier->plan().weights_paged;
    tier->page_in_all();
  }
  r.state = rt::test::state_bytes(st, true);
  return r;
}

TEST(CudaStateTier, PagedRunIsBitIdenticalToAllInRam) {
  if (!rt::cuda_backend_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  using MS = rt::MasterStorage;
  using MO = rt::MomentStorage;
  for (const Mode& m : {Mode{"split, device gradients", MO::fp32, MS::split, "split", "device", false},
                        Mode{"split, delayed update", MO::fp32, MS::split, "split", "device", true},
                        Mode{"split, fold", MO::q8, MS::split, "split", "fold", false},
                        Mode{"fp32 master, host gradients", MO::fp32, MS::fp32, "fp32", "host", false},
                        Mode{"bf16-sr + adamw4bit, device", MO::q4, MS::bf16_sr, "bf16-sr", "device", false},
                        // the weights paged too, the device holding every layer
                        Mode{"weights: split, device gradients", MO::fp32, MS::split, "split", "device", false, true},
                        Mode{"weights: split + adamw8bit, host", MO::q8, MS::split, "split", "host", false, true},
                        // fold with an untied embedding: the host embedding gathers from the engine's copy
                        Mode{"weights: bf16-sr + adamw4bit, fold", MO::q4, MS::bf16_sr, "bf16-sr", "fold", false, true},
                        Mode{"weights: fp32 master, host", MO::fp32, MS::fp32, "fp32", "host", false, true}}) {
    SCOPED_TRACE(m.name);
    rt::test::TempDir tmp;
    const TierRun ram = train(m, ""), tier = train(m, tmp.path());
    EXPECT_EQ(tier.paged, 5);  // every unit (no budget, or the smallest with the weights paged)
    EXPECT_EQ(tier.weights_paged, m.weights);
    EXPECT_EQ(tier.loss, ram.loss);
    EXPECT_EQ(tier.norm, ram.norm);
    EXPECT_TRUE(tier.state == ram.state) << "the final state differs from the all-in-RAM run's";
  }
}

// The weights of a split master page only with every layer on the device: a streaming plan is refused,
// naming --resident and the minimum with the weights in RAM.
TEST(CudaStateTier, StreamingWeightsAreRefused) {
  if (!rt::cuda_backend_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only build)";
  rt::HostState st(gpu_spec(3), false, rt::MomentStorage::q8, rt::MasterStorage::split);
  st.init_random(5, 0.05f);
  rt::CudaOptions co;
  co.slots = 2;
  co.master = "split";
  co.grads = "device";
  auto gpu = rt::make_cuda_backend(st, 4, 128, co);
  const std::vector<rt::TierUnitBytes> b = rt::tier_unit_bytes(st);
  const rt::TierPlan all = rt::tier_place(b, 0);
  rt::test::TempDir tmp;
  rt::test::expect_error(
      [&] { rt::make_state_tier(st, *gpu, tmp.path(), all.min_bytes - 1); },
      {"--max-host-memory", std::to_string((all.min_bytes + (1 << 20) - 1) >> 20) + "M or more", "--resident"});
}

}  // namespace
