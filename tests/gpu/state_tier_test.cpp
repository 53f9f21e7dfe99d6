// The state tier (state/state_tier.h, --state-dir) on the CUDA engine: its
// optimizer phase pages each unit's state (moments or their codes, a split
// master's remainder) through the file -- host, device-chunk and folded
// gradients, the delayed update -- and the run is bit-identical to the same
// engine all in RAM: every step's loss and gradient norm, and the final
// master, moments and remainders byte for byte. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "data/dataset.h"
#include "engine/backend.h"
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
};

struct TierRun {
  std::vector<double> loss, norm;
  std::vector<uint8_t> state;
  int paged = 0;
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
  auto gpu = rt::make_cuda_backend(st, B, T, co);
  std::unique_ptr<rt::StateTier> tier;
  if (!state_dir.empty()) tier = std::make_unique<rt::StateTier>(st, rt::TierOptions{state_dir, 0});
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
                        Mode{"bf16-sr + adamw4bit, device", MO::q4, MS::bf16_sr, "bf16-sr", "device", false}}) {
    SCOPED_TRACE(m.name);
    rt::test::TempDir tmp;
    const TierRun ram = train(m, ""), tier = train(m, tmp.path());
    EXPECT_EQ(tier.paged, 5);  // every unit (no budget)
    EXPECT_EQ(tier.loss, ram.loss);
    EXPECT_EQ(tier.norm, ram.norm);
    EXPECT_TRUE(tier.state == ram.state) << "the final state differs from the all-in-RAM run's";
  }
}

}  // namespace
