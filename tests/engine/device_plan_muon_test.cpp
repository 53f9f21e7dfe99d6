// The device plan for --optimizer muon (CudaOptions::muon, engine/device_plan.h):
// gradients reach the optimizer whole (auto picks host, or fold with clipping
// off; device and the delayed update are refused naming the fix), and the GPU
// Newton-Schulz workspace is planned for the largest Muon matrix.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda/newton_schulz_workspace.h"
#include "engine/device_plan.h"
#include "model/weight_map.h"
#include "state/host_state.h"
#include "testutil.h"

namespace {

rt::ModelSpec spec() {
  rt::ModelSpec s;
  s.hidden = 64;
  s.intermediate = 176;
  s.n_layers = 3;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 256;
  s.max_positions = 64;
  return s;
}

rt::CudaOptions muon_options() {
  rt::CudaOptions o;
  o.keep_activations = 0;
  o.muon = true;
  return o;
}

const uint64_t kHuge = 1ull << 40;

}  // namespace

TEST(DevicePlanMuon, GradientsReachTheOptimizerWhole) {
  rt::CudaOptions o = muon_options();
  // auto: host gradients even when the device has room for all of them
  rt::DevicePlan p = rt::plan_device(spec(), 2, 32, o, kHuge);
  EXPECT_TRUE(p.place.host_grads);
  EXPECT_FALSE(p.place.fold);
  o.clipping = false;  // as for AdamW, auto folds where host would be picked and nothing clips
  EXPECT_TRUE(rt::plan_device(spec(), 2, 32, o, kHuge).place.fold);
  o = muon_options();
  o.grads = "fold";
  p = rt::plan_device(spec(), 2, 32, o, kHuge);
  EXPECT_TRUE(p.place.host_grads && p.place.fold);
  o.grads = "device";
  rt::test::expect_error([&] { rt::plan_device(spec(), 2, 32, o, kHuge); },
                         {"--optimizer muon orthogonalises whole matrices", "--grads host or --grads fold"});
  o.grads = "auto";
  o.delayed_update = true;
  rt::test::expect_error([&] { rt::plan_device(spec(), 2, 32, o, kHuge); },
                         {"--optimizer muon", "drop --delayed-update"});
  // without Muon the same auto keeps the gradients on the device
  rt::CudaOptions a = muon_options();
  a.muon = false;
  EXPECT_FALSE(rt::plan_device(spec(), 2, 32, a, kHuge).place.host_grads);
}

TEST(DevicePlanMuon, TheWorkspaceIsSizedForTheLargestMatrix) {
  const rt::ModelSpec s = spec();
  // independently: the MLP's [176, 64] and [64, 176] are the largest (11264
  // elements); the smaller side is at most hidden = 64 (q, o: [64, 64])
  int64_t most = 0, small = 0;
  for (const rt::WeightEntry& e : rt::weight_map(s))
    if (rt::muon_matrix(e)) {
      most = std::max(most, e.numel());
      small = std::max(small, std::min(e.shape[0], e.shape[1]));
    }
  ASSERT_EQ(most, 176 * 64);
  ASSERT_EQ(small, 64);
  const rt::MuonMatrixDims d = rt::muon_matrix_dims(s);
  EXPECT_EQ(d.max_numel, most);
  EXPECT_EQ(d.max_small, small);
  // per lane (2, cuda/newton_schulz_workspace.h): U of `most` fp32 (X's copy in its bytes), X of `most` bf16, A and
  // B of small^2 bf16, the norm's sums: one double per 16384 elements + 2 (3 doubles), each rounded to 256 bytes
  const auto r256 = [](uint64_t b) { return (b + 255) / 256 * 256; };
  const uint64_t lane = r256(176 * 64 * 4) + r256(176 * 64 * 2) + 2 * r256(64 * 64 * 2) + r256(3 * 8);
  EXPECT_EQ(rt::muon_workspace_bytes(s), 2 * lane);
  EXPECT_EQ(rt::cuda::newton_schulz_workspace_bytes(most, small), 2 * lane);
  EXPECT_EQ(rt::cuda::newton_schulz_workspace_bytes(most, small, 1), lane);
  // the plan holds it and adds exactly that to the total
  rt::CudaOptions o = muon_options();
  const rt::DevicePlan p = rt::plan_device(s, 2, 32, o, kHuge);
  o.muon = false;
  o.grads = "host";  // the same placement without Muon
  const rt::DevicePlan q = rt::plan_device(s, 2, 32, o, kHuge);
  uint64_t ws = 0;
  for (const rt::DevicePlanItem& it : p.items)
    if (it.what.rfind("Muon Newton-Schulz workspace", 0) == 0) ws += it.bytes;
  EXPECT_EQ(ws, 2 * lane);
  EXPECT_EQ(p.total, q.total + ws);
  for (const rt::DevicePlanItem& it : q.items) EXPECT_EQ(it.what.find("Muon"), std::string::npos) << it.what;
}
