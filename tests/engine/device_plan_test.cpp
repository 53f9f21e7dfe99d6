// The device plan (engine/device_plan.h) without a GPU: its unit layout is
// HostState's, its byte counts add up item by item, and fitting shrinks the
// plan in the documented order (host gradients + checkpoints, 2 slots,
// 256-row LM-head chunks), one step at a time, only as far as needed.
#include "engine/device_plan.h"

#include <gtest/gtest.h>

#include <numeric>

#include "state/host_state.h"

namespace {

rt::ModelSpec spec(bool tied) {
  rt::ModelSpec s;
  s.hidden = 64;
  s.intermediate = 128;
  s.n_layers = 4;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.vocab = 256;
  s.max_positions = 64;
  s.tie_embeddings = tied;
  return s;
}

uint64_t r256(uint64_t b) { return (b + 255) / 256 * 256; }

uint64_t item(const rt::DevicePlan& p, const std::string& what) {
  for (auto& i : p.items)
    if (i.what == what) return i.bytes;
  ADD_FAILURE() << "no plan item '" << what << "'";
  return 0;
}

rt::CudaOptions fixed_keep() {
  rt::CudaOptions o;
  o.keep_activations = 0;  // a total that does not depend on the budget
  return o;
}

const uint64_t kHuge = 1ull << 40;

}  // namespace

TEST(DevicePlan, UnitLayoutIsHostStates) {
  for (bool tied : {false, true}) {
    rt::HostState st(spec(tied), false);
    std::vector<int64_t> n = rt::unit_numels(spec(tied));
    ASSERT_EQ(n.size(), st.units().size());
    for (size_t u = 0; u < n.size(); ++u) EXPECT_EQ(n[u], st.units()[u].numel) << "unit " << u << " tied " << tied;
  }
}

TEST(DevicePlan, ByteCountsAddUp) {
  const rt::ModelSpec s = spec(false);
  const int64_t B = 2, T = 32, N = B * T, L = s.n_layers;
  const std::vector<int64_t> n = rt::unit_numels(s);
  for (const char* where : {"device", "host"}) {
    rt::CudaOptions o = fixed_keep();
    o.grads = o.checkpoints = where;
    o.keep_activations = 1;
    rt::DevicePlan p = rt::plan_device(s, B, T, o, kHuge);
    uint64_t sum = 0;
    for (auto& i : p.items) sum += i.bytes;
    EXPECT_EQ(sum, p.total);
    EXPECT_TRUE(p.fits());
    const bool host = std::string(where) == "host";
    EXPECT_EQ(p.place.host_grads, host);
    EXPECT_EQ(p.place.host_ckpt, host);
    EXPECT_EQ(p.place.host_embed, host);  // untied
    EXPECT_EQ(p.place.slots, 3);
    EXPECT_EQ(item(p, "layer weight slots"), 3 * r256(static_cast<uint64_t>(n[1]) * 2));
    EXPECT_EQ(item(p, "the final norm and LM head"), r256(static_cast<uint64_t>(n[L + 1]) * 2));
    uint64_t grads = 0;
    for (auto& i : p.items)
      if (i.what.rfind("gradients of ", 0) == 0 || i.what == "layer gradient buffers") grads += i.bytes;
    const uint64_t layer_grad = r256(static_cast<uint64_t>(n[1]) * 4);
    EXPECT_EQ(grads, host ? r256(static_cast<uint64_t>(n[L + 1]) * 4) + 2 * layer_grad
                          : r256(static_cast<uint64_t>(n[0]) * 4) + L * layer_grad +
                                r256(static_cast<uint64_t>(n[L + 1]) * 4));
    EXPECT_EQ(item(p, host ? "block input buffers" : "block checkpoints"),
              host ? 2 * r256(N * s.hidden * 2) : r256((L + 1) * N * s.hidden * 2));
    EXPECT_EQ(p.kept_layers, 1);
    // the activations: one shared set + one kept layer, at least what BlockActs::bytes says each
    EXPECT_GE(item(p, "block activations (shared + kept layers)"), 2 * p.layer_act_bytes);
  }
}

TEST(DevicePlan, AutoKeepsWhatFitsInTheRest) {
  const rt::ModelSpec s = spec(true);
  rt::CudaOptions o;  // keep_activations auto
  o.grads = o.checkpoints = "device";
  const uint64_t base = rt::plan_device(s, 2, 32, fixed_keep(), kHuge).total;
  const rt::DevicePlan small = rt::plan_device(s, 2, 32, o, base + base / 8);
  const rt::DevicePlan big = rt::plan_device(s, 2, 32, o, kHuge);
  EXPECT_EQ(big.kept_layers, s.n_layers);  // all fit
  EXPECT_LT(small.kept_layers, s.n_layers);
  EXPECT_TRUE(small.fits());
  // one more kept layer would not have fit with 1/64 of the budget held back
  EXPECT_GT(small.total + small.budget / 64 + small.layer_act_bytes, small.budget);
}

TEST(DevicePlan, FitShrinksInTheDocumentedOrder) {
  const rt::ModelSpec s = spec(false);
  const int64_t B = 4, T = 64;
  // the plans fitting walks through, built by hand
  rt::CudaOptions o0 = fixed_keep();
  rt::CudaOptions o1 = o0;
  o1.grads = o1.checkpoints = "host";
  rt::CudaOptions o2 = o1;
  o2.slots = 2;
  rt::CudaOptions o3 = o2;
  o3.ce_chunk_rows = 256;
  const uint64_t t0 = rt::plan_device(s, B, T, o0, kHuge).total, t1 = rt::plan_device(s, B, T, o1, kHuge).total,
                 t2 = rt::plan_device(s, B, T, o2, kHuge).total, t3 = rt::plan_device(s, B, T, o3, kHuge).total;
  ASSERT_GT(t0, t1);
  ASSERT_GT(t1, t2);
  ASSERT_GT(t2, t3);
  const std::vector<std::string> steps = {"gradients and block checkpoints in host RAM", "2 weight slots",
                                          "LM-head chunks of 256 rows"};
  // a budget just under each plan's total takes exactly the steps needed
  // (the auto rules of place_on_device see a budget this large as "fits on the device")
  struct Case {
    uint64_t budget;
    size_t n_steps;
    bool fits;
  };
  for (const Case& c : {Case{t0, 0, true}, Case{t0 - 1, 1, true}, Case{t1 - 1, 2, true}, Case{t2 - 1, 3, true},
                        Case{t3, 3, true}, Case{t3 - 1, 3, false}}) {
    rt::DevicePlan p = rt::fit_device_plan(s, B, T, o0, c.budget);
    EXPECT_EQ(p.fits(), c.fits) << "budget " << c.budget;
    EXPECT_EQ(p.changes, std::vector<std::string>(steps.begin(), steps.begin() + static_cast<long>(c.n_steps)))
        << "budget " << c.budget;
  }
  // --slots given (fit_slots off): the slot step is skipped
  rt::CudaOptions keep_slots = o0;
  keep_slots.fit_slots = false;
  rt::DevicePlan p = rt::fit_device_plan(s, B, T, keep_slots, t2 - 1);
  EXPECT_EQ(p.options.slots, 3);
  EXPECT_EQ(p.changes, (std::vector<std::string>{steps[0], steps[2]}));
  // fit off: the plan as asked, not fitting
  rt::CudaOptions no_fit = o0;
  no_fit.fit = false;
  EXPECT_FALSE(rt::fit_device_plan(s, B, T, no_fit, t0 - 1).fits());
  EXPECT_TRUE(rt::fit_device_plan(s, B, T, no_fit, t0 - 1).changes.empty());
}

TEST(DevicePlan, DelayedUpdateRefusesHostGradients) {
  rt::CudaOptions o = fixed_keep();
  o.delayed_update = true;
  o.grads = "host";
  EXPECT_THROW(rt::plan_device(spec(false), 2, 32, o, kHuge), rt::Error);
  o.grads = "auto";  // auto stays on the device with delayed update, whatever the budget
  EXPECT_FALSE(rt::plan_device(spec(false), 2, 32, o, 1).place.host_grads);
}
