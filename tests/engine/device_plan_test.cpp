// The device plan (engine/device_plan.h) without a GPU: its unit layout is
// HostState's, its byte counts add up item by item, and fitting shrinks the
// plan in the documented order (host gradients + checkpoints, 2 slots,
// 256-row LM-head chunks), one step at a time, only as far as needed.
#include "engine/device_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cuda/lm_head_rows.h"
#include "cuda/moe_scratch.h"
#include "engine/update_order.h"
#include "model/block_memory.h"
#include "model/spec.h"
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
  o.keep_attention = 0;
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

TEST(DevicePlan, TheLmHeadGetsPaddingRowsOnTheDeviceOnly) {
  // cuda::lm_head_rows rounds the vocabulary up to 8; the unit whose last
  // tensor is the LM head (the head, or the embedding when tied) grows by
  // the padding rows on the device, every other unit keeps HostState's size.
  EXPECT_EQ(rt::cuda::lm_head_rows(256), 256);
  EXPECT_EQ(rt::cuda::lm_head_rows(257), 264);
  EXPECT_EQ(rt::cuda::lm_head_rows(262), 264);
  EXPECT_EQ(rt::cuda::lm_head_rows(32002), 32008);
  EXPECT_EQ(rt::cuda::lm_head_rows(1), 8);
  for (bool tied : {false, true})
    for (int64_t V : {int64_t{256}, int64_t{262}, int64_t{257}}) {
      rt::ModelSpec s = spec(tied);
      s.vocab = V;
      rt::HostState st(s, false);
      const std::vector<int64_t> host = rt::unit_numels(s), dev = rt::device_unit_numels(s);
      ASSERT_EQ(dev.size(), host.size());
      const size_t lm = tied ? 0 : host.size() - 1;
      for (size_t u = 0; u < host.size(); ++u) {
        const rt::StateUnit& un = st.units()[u];
        if (u != lm) {
          EXPECT_EQ(dev[u], host[u]) << "unit " << u << " tied " << tied << " V " << V;
          continue;
        }
        // the LM head is the unit's last tensor, and its padded rows end the device buffer (or fit in the
        // host layout's 16-float alignment)
        EXPECT_EQ(un.entries.back().name, tied ? "model.embed_tokens.weight" : "lm_head.weight");
        EXPECT_EQ(dev[u], std::max(host[u], un.offsets.back() + rt::cuda::lm_head_rows(V) * s.hidden))
            << "tied " << tied << " V " << V;
      }
      // the plan counts the padded buffers: head weights and its gradients (embedding's when tied)
      rt::CudaOptions o = fixed_keep();
      o.grads = o.checkpoints = "device";
      const rt::DevicePlan p = rt::plan_device(s, 2, 32, o, kHuge);
      EXPECT_EQ(item(p, "the final norm and LM head"), r256(static_cast<uint64_t>(dev.back()) * 2));
      EXPECT_EQ(item(p, "the embedding"), r256(static_cast<uint64_t>(dev[0]) * 2));
      EXPECT_EQ(item(p, "gradients of head"), r256(static_cast<uint64_t>(dev.back()) * 4));
      EXPECT_EQ(item(p, "gradients of embed"), r256(static_cast<uint64_t>(dev[0]) * 4));
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
  rt::CudaOptions o;  // keep_activations auto, whole layers only
  o.keep_attention = 0;
  o.grads = o.checkpoints = "device";
  const uint64_t base = rt::plan_device(s, 2, 32, fixed_keep(), kHuge).total;
  const rt::DevicePlan small = rt::plan_device(s, 2, 32, o, base + base / 8);
  const rt::DevicePlan big = rt::plan_device(s, 2, 32, o, kHuge);
  EXPECT_EQ(big.kept_layers, s.n_layers);  // all fit
  EXPECT_LT(small.kept_layers, s.n_layers);
  EXPECT_TRUE(small.fits());
  // one more kept layer would not have fit with 1/64 of the budget held back
  EXPECT_GT(small.total + small.budget / 64 + small.layer_act_bytes, small.budget);
  // with attention halves on auto too (selective recompute): the halves are
  // in the plan, and neither one more half nor one more whole layer fits
  o.keep_attention = -1;
  const rt::DevicePlan mixed = rt::plan_device(s, 2, 32, o, base + base / 8);
  EXPECT_TRUE(mixed.fits());
  EXPECT_GT(mixed.attn_kept_layers, 0);
  EXPECT_LE(mixed.kept_layers + mixed.attn_kept_layers, s.n_layers);
  EXPECT_GT(mixed.total + mixed.budget / 64 + mixed.layer_attn_bytes, mixed.budget);
  EXPECT_GT(item(mixed, "kept attention halves (selective recompute)"),
            static_cast<uint64_t>(mixed.attn_kept_layers) * mixed.layer_attn_bytes - 1);
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
                                          "LM-head chunks of 256 rows", "MLP in token chunks"};
  // a budget just under each plan's total takes exactly the steps needed
  // (the auto rules of place_on_device see a budget this large as "fits on the device")
  struct Case {
    uint64_t budget;
    size_t n_steps;
    bool fits;
  };
  // (the last step, MLP token chunks, is tried when nothing else is left; at
  // N = 256 tokens there is no chunk below N, so it changes nothing)
  for (const Case& c : {Case{t0, 0, true}, Case{t0 - 1, 1, true}, Case{t1 - 1, 2, true}, Case{t2 - 1, 3, true},
                        Case{t3, 3, true}, Case{t3 - 1, 4, false}}) {
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

TEST(DevicePlan, LayerMajorPlansKSetsOfInputsAndResidualGradients) {
  const int64_t B = 2, T = 32, N = B * T, K = 3;
  for (bool tied : {false, true}) {
    const rt::ModelSpec s = spec(tied);
    const int64_t L = s.n_layers, C = s.hidden;
    auto plan = [&](const char* lm, const char* ckpt, int64_t k, bool resident = false) {
      rt::CudaOptions o = fixed_keep();
      o.layer_major = lm;
      o.micro_batches = k;
      o.checkpoints = ckpt;
      o.grads = "device";
      o.resident = resident;
      return rt::plan_device(s, B, T, o, kHuge);
    };
    // auto: on for K > 1 with streamed weights and an untied embedding
    EXPECT_EQ(plan("auto", "device", K).place.layer_major, !tied);
    EXPECT_FALSE(plan("auto", "device", 1).place.layer_major);
    EXPECT_FALSE(plan("auto", "device", K, /*resident=*/true).place.layer_major);
    EXPECT_FALSE(plan("off", "device", K).place.layer_major);
    EXPECT_TRUE(plan("on", "device", K).place.layer_major);
    EXPECT_FALSE(plan("on", "device", 1).place.layer_major);  // one micro-batch: nothing to reorder

    const rt::DevicePlan mb = plan("off", "device", K), dev = plan("on", "device", K), host = plan("on", "host", K);
    for (const rt::DevicePlan* p : {&mb, &dev, &host}) {
      uint64_t sum = 0;
      for (auto& i : p->items) sum += i.bytes;
      EXPECT_EQ(sum, p->total);
    }
    EXPECT_EQ(item(mb, "block checkpoints"), r256((L + 1) * N * C * 2));
    EXPECT_EQ(item(mb, "residual gradient"), r256(N * C * 2));
    EXPECT_EQ(item(mb, "token ids, targets, positions"), 3 * r256(N * 4));
    EXPECT_EQ(item(dev, "block checkpoints"), r256(K * (L + 1) * N * C * 2));
    EXPECT_EQ(item(dev, "residual gradients (one per micro-batch)"), r256(K * N * C * 2));
    EXPECT_EQ(item(dev, "token ids, targets, positions"), 3 * r256(K * N * 4));
    EXPECT_EQ(item(host, "block input buffers"), 2 * r256(N * C * 2));
    EXPECT_EQ(item(host, "layer-major block input ring"), rt::kCheckpointRing * r256(N * C * 2));
    EXPECT_EQ(item(host, "residual gradients (one per micro-batch)"), r256(K * N * C * 2));
    // pinned host RAM: all K x (L+1) inputs when on the host, none on the device
    EXPECT_EQ(rt::host_checkpoint_bytes(s, B, T, host.place), static_cast<uint64_t>(K * (L + 1) * N * C * 2));
    EXPECT_EQ(rt::host_checkpoint_bytes(s, B, T, plan("off", "host", K).place),
              static_cast<uint64_t>((L + 1) * N * C * 2));
    EXPECT_EQ(rt::host_checkpoint_bytes(s, B, T, dev.place), 0u);
    // layer-major recomputes every block: no kept layers even when asked
    rt::CudaOptions keep = fixed_keep();
    keep.layer_major = "on";
    keep.micro_batches = K;
    keep.keep_activations = 2;
    EXPECT_EQ(rt::plan_device(s, B, T, keep, kHuge).kept_layers, 0);
  }
}

TEST(DevicePlan, LayerMajorCheckpointsGoToTheHostWhenKSetsAreTooBig) {
  // auto checkpoints: on the device unless they take more than a quarter of
  // the budget, counted with all K sets under layer-major.
  const rt::ModelSpec s = spec(false);
  const int64_t B = 2, T = 32, N = B * T, K = 4;
  const uint64_t one_set = static_cast<uint64_t>((s.n_layers + 1) * N * s.hidden * 2);
  rt::CudaOptions o = fixed_keep();
  o.micro_batches = K;
  o.grads = "device";
  const uint64_t budget = 4 * one_set * 2;  // one set fits the quarter, K = 4 sets do not
  EXPECT_TRUE(rt::place_on_device(s, B, T, o, budget).host_ckpt);
  o.layer_major = "off";
  EXPECT_FALSE(rt::place_on_device(s, B, T, o, budget).host_ckpt);
}

TEST(DevicePlan, LayerMajorRefusesABadValue) {
  rt::CudaOptions o = fixed_keep();
  o.layer_major = "yes";
  EXPECT_THROW(rt::plan_device(spec(false), 2, 32, o, kHuge), rt::Error);
  o.layer_major = "on";
  o.micro_batches = 0;
  EXPECT_THROW(rt::plan_device(spec(false), 2, 32, o, kHuge), rt::Error);
}

TEST(DevicePlan, FitTurnsAutoLayerMajorOffLast) {
  // a budget the K = 8 sets cannot fit even in the smallest layer-major plan
  const rt::ModelSpec s = spec(false);
  const int64_t B = 2, T = 32;
  rt::CudaOptions o = fixed_keep();
  o.micro_batches = 8;
  o.slots = 3;
  const rt::DevicePlan lm_small = [&] {
    rt::CudaOptions x = o;
    rt::set_low_memory(x);
    x.layer_major = "on";
    return rt::plan_device(s, B, T, x, kHuge);
  }();
  const rt::DevicePlan mb_small = [&] {
    rt::CudaOptions x = o;
    rt::set_low_memory(x);
    x.layer_major = "off";
    return rt::plan_device(s, B, T, x, kHuge);
  }();
  ASSERT_LT(mb_small.total, lm_small.total);
  const rt::DevicePlan p = rt::fit_device_plan(s, B, T, o, mb_small.total);
  EXPECT_TRUE(p.fits());
  EXPECT_FALSE(p.place.layer_major);
  ASSERT_FALSE(p.changes.empty());
  EXPECT_NE(p.changes.back().find("micro-batch-major"), std::string::npos);
  // an explicit "on" is never turned off
  o.layer_major = "on";
  EXPECT_TRUE(rt::fit_device_plan(s, B, T, o, mb_small.total).place.layer_major);
  // and a budget the layer-major plan fits keeps it
  o.layer_major = "auto";
  EXPECT_TRUE(rt::fit_device_plan(s, B, T, o, kHuge).place.layer_major);
}

namespace {

// Qwen2.5-7B at 16k tokens (docs/long_sequences.md: under 10 GiB only with
// MLP token chunks).
const int64_t kLongT = 16384;
const uint64_t k10GiB = 10ull << 30;

}  // namespace

TEST(DevicePlan, SevenBAt16kTokensFitsTenGiBOnlyWithMlpChunks) {
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  rt::CudaOptions off;
  off.mlp_chunk_tokens = 0;
  const rt::DevicePlan refused = rt::fit_device_plan(s, 1, kLongT, off, k10GiB);
  EXPECT_FALSE(refused.fits());
  EXPECT_EQ(refused.mlp_chunk_tokens, 0);
  rt::CudaOptions automatic;  // the default: auto
  ASSERT_EQ(automatic.mlp_chunk_tokens, -1);
  const rt::DevicePlan p = rt::fit_device_plan(s, 1, kLongT, automatic, k10GiB);
  EXPECT_TRUE(p.fits()) << p.total << " > " << p.budget;
  ASSERT_FALSE(p.changes.empty());
  EXPECT_EQ(p.changes.back(), "MLP in token chunks");
  // the same shrink steps as the refused plan, and chunking after all of them
  EXPECT_EQ(std::vector<std::string>(p.changes.begin(), p.changes.end() - 1), refused.changes);
  // the largest candidate that fits: the next larger one (if any) does not
  const std::vector<int64_t> cand = rt::mlp_chunk_candidates(kLongT);
  const auto at = std::find(cand.begin(), cand.end(), p.mlp_chunk_tokens);
  ASSERT_NE(at, cand.end()) << p.mlp_chunk_tokens;
  if (at != cand.begin()) {
    rt::CudaOptions bigger = p.options;
    bigger.mlp_chunk_tokens = *(at - 1);
    EXPECT_FALSE(rt::plan_device(s, 1, kLongT, bigger, k10GiB).fits());
  }
  // and 32k tokens in 24 GiB (issue 16's acceptance; with the LM-head
  // scratch estimate it fits even unchunked, so auto leaves it unchunked)
  const rt::DevicePlan p32 = rt::fit_device_plan(s, 1, 2 * kLongT, automatic, 24ull << 30);
  EXPECT_TRUE(p32.fits()) << p32.total << " > " << p32.budget;
  // a fixed chunk is taken as given
  rt::CudaOptions fixed = p.options;
  fixed.mlp_chunk_tokens = 1024;
  EXPECT_EQ(rt::plan_device(s, 1, kLongT, fixed, k10GiB).mlp_chunk_tokens, 1024);
}

TEST(DevicePlan, TheChunkedBlockCostsWhatBlockMemorySays) {
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  for (int64_t chunk : {int64_t{0}, int64_t{1024}, int64_t{4096}}) {
    rt::CudaOptions o;
    rt::set_low_memory(o);
    o.keep_activations = 2;
    o.mlp_chunk_tokens = chunk;
    const rt::DevicePlan p = rt::plan_device(s, 1, kLongT, o, kHuge);
    EXPECT_EQ(p.mlp_chunk_tokens, chunk);
    const rt::BlockDims dm{1, kLongT, chunk};
    EXPECT_EQ(item(p, "backward scratch"), rt::block_scratch_bytes(s, dm, 2, 256)) << chunk;
    EXPECT_EQ(item(p, "block activations (shared + kept layers)"), 3 * rt::block_acts_bytes(s, dm, 2, 256)) << chunk;
    EXPECT_EQ(p.layer_act_bytes, rt::block_acts_bytes(s, dm, 2)) << chunk;
    uint64_t sum = 0;
    for (auto& i : p.items) sum += i.bytes;
    EXPECT_EQ(sum, p.total);
  }
  // chunking shrinks the block (the N x F tensors are per chunk)
  rt::CudaOptions o;
  rt::set_low_memory(o);
  o.mlp_chunk_tokens = 0;
  const uint64_t whole = rt::plan_device(s, 1, kLongT, o, kHuge).total;
  o.mlp_chunk_tokens = 1024;
  EXPECT_LT(rt::plan_device(s, 1, kLongT, o, kHuge).total, whole);
}

TEST(DevicePlan, PlansThatFitUnchunkedStayUnchunked) {
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-7b");
  // budgets the unchunked plan fits as asked, after the host-RAM step, and at its smallest
  rt::CudaOptions off;
  off.mlp_chunk_tokens = 0;
  rt::CudaOptions smallest = off;
  rt::set_low_memory(smallest);
  smallest.keep_activations = -1;
  const uint64_t t_small = rt::plan_device(s, 1, 4096, smallest, kHuge).total;
  for (uint64_t budget : {uint64_t{80} << 30, uint64_t{24} << 30, t_small + (t_small >> 5)}) {
    const rt::DevicePlan unchunked = rt::fit_device_plan(s, 1, 4096, off, budget);
    ASSERT_TRUE(unchunked.fits()) << budget;
    const rt::DevicePlan p = rt::fit_device_plan(s, 1, 4096, rt::CudaOptions{}, budget);
    EXPECT_EQ(p.mlp_chunk_tokens, 0) << budget;
    EXPECT_EQ(p.changes, unchunked.changes) << budget;
    EXPECT_EQ(p.total, unchunked.total) << budget;
    EXPECT_EQ(p.kept_layers, unchunked.kept_layers) << budget;
  }
  // a budget just under the plan as asked: the host-RAM step, not chunking
  // (which would make the plan as asked fit too: the tiny model's block is mostly N x F)
  const rt::ModelSpec tiny = spec(false);
  rt::CudaOptions as_asked = fixed_keep();
  as_asked.mlp_chunk_tokens = 0;
  const uint64_t t0 = rt::plan_device(tiny, 1, 1024, as_asked, kHuge).total;
  as_asked.mlp_chunk_tokens = 512;
  ASSERT_LT(rt::plan_device(tiny, 1, 1024, as_asked, t0 - 1).total, t0 - 1);
  const rt::DevicePlan q = rt::fit_device_plan(tiny, 1, 1024, fixed_keep(), t0 - 1);
  EXPECT_TRUE(q.fits());
  EXPECT_EQ(q.mlp_chunk_tokens, 0);
  EXPECT_EQ(q.changes, std::vector<std::string>{"gradients and block checkpoints in host RAM"});
  // without fit, auto picks on the budget at once: unchunked where the block fits
  rt::CudaOptions no_fit;
  no_fit.fit = false;
  EXPECT_EQ(rt::fit_device_plan(s, 1, 4096, no_fit, uint64_t{80} << 30).mlp_chunk_tokens, 0);
  EXPECT_GT(rt::fit_device_plan(s, 1, kLongT, no_fit, k10GiB).mlp_chunk_tokens, 0);
}

TEST(DevicePlan, MlpChunkRefusesABadValue) {
  rt::CudaOptions o;
  o.mlp_chunk_tokens = -2;
  EXPECT_THROW(rt::plan_device(spec(false), 2, 32, o, kHuge), std::exception);
}

// MoE models: the op scratch holds every expert's rows of a micro-batch
// (cuda/moe_scratch.h, what the CUDA MoE ops carve), and layer-major is
// never planned for them (the engine runs them micro-batch-major).
TEST(DevicePlan, MoeCountsTheExpertScratchAndGoesLayerMajor) {
  const rt::ModelSpec s = rt::spec_from_config_text(
      R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 128, "intermediate_size": 64,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256,
          "num_experts": 16, "num_experts_per_tok": 4, "norm_topk_prob": false, "max_position_embeddings": 64,
          "eos_token_id": null, "pad_token_id": null})",
      "olmoe");
  ASSERT_TRUE(s.is_moe());
  const int64_t B = 4, T = 64;
  rt::CudaOptions o = fixed_keep();
  o.micro_batches = 4;
  o.slots = 2;  // streaming, untied: layer-major on auto, MoE models as dense ones
  o.ce_chunk_rows = 256;
  const rt::DevicePlan p = rt::plan_device(s, B, T, o, kHuge);
  const uint64_t moe = rt::cuda::moe_scratch_bytes(rt::cuda::MoeDims{B * T, 128, 16, 4, 64, false});
  EXPECT_GT(moe, rt::lm_head_scratch_estimate(spec(false), B, T, o)) << "the test needs the MoE term to dominate";
  EXPECT_EQ(item(p, "op scratch"), r256(moe));
  EXPECT_TRUE(p.place.layer_major);
  o.layer_major = "off";
  EXPECT_FALSE(rt::plan_device(s, B, T, o, kHuge).place.layer_major);
}

// ---- the pinned gradient landing (engine/cuda/gradient_sink.h) ----
namespace {

// x rounded up to the landing's 16384-element blocks (rt::sum_squares's, kOptimBlock)
int64_t up16k(int64_t x) { return (x + 16383) / 16384 * 16384; }

}  // namespace

TEST(GradientLanding, HostSlabsHoldTheLargestLayerNotTheLmHead) {
  // Qwen2.5-14B: the LM head unit (152064 x 5120 + the final norm) is ~2.8x
  // a layer. Host and fold gradients land through 3 slabs of the largest
  // layer (rounded up to 16384 elements); the head lands in pieces; fold
  // adds a pinned double per slab for a split unit's device sum of squares.
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-14b");
  const std::vector<int64_t> n = rt::unit_numels(s);
  const int64_t L = s.n_layers, head = n[static_cast<size_t>(L + 1)];
  const int64_t layer = *std::max_element(n.begin() + 1, n.end() - 1);
  ASSERT_GT(head, 2 * layer);
  rt::CudaOptions o;
  const int64_t slab = rt::gradient_landing_slab_elems(s, o);
  EXPECT_EQ(slab, up16k(layer));
  EXPECT_EQ(slab % rt::kGradChunkAlign, 0);
  EXPECT_EQ(slab % 256, 0);  // quantized moments' blocks (state/moment_quant.h)
  for (bool fold : {false, true}) {
    rt::DevicePlacement p;
    p.host_grads = p.host_embed = true;  // untied: the embedding's rows scatter into its host arena
    p.fold = fold;
    EXPECT_EQ(rt::gradient_landing_split_units(s, p, o), std::vector<size_t>{static_cast<size_t>(L + 1)});
    const uint64_t sums = rt::gradient_landing_sum_doubles(s, p, o);
    EXPECT_EQ(sums, fold ? static_cast<uint64_t>((head + 16383) / 16384 + 2) : 0u);
    EXPECT_EQ(rt::gradient_landing_bytes(s, p, o), 3 * static_cast<uint64_t>(slab) * 4 + (fold ? 3 * 8 : 0));
    // the device side: fold's block sums are a plan item, after the backward scratch (the engine's order)
    rt::CudaOptions po = fixed_keep();
    po.grads = fold ? "fold" : "host";
    const rt::DevicePlan d = rt::plan_device(s, 1, 1024, po, kHuge);
    bool found = false;
    for (size_t i = 0; i < d.items.size(); ++i)
      if (d.items[i].what == "gradient landing sums of squares (units landing in pieces)") {
        found = true;
        EXPECT_EQ(d.items[i].bytes, r256(sums * 8));
        EXPECT_EQ(d.items[i - 1].what, "backward scratch");
      }
    EXPECT_EQ(found, fold);
  }
  // the 14B's head at 8.7 GiB of slabs is what issue 31 removes: 3 layers now
  rt::DevicePlacement host;
  host.host_grads = true;
  EXPECT_LT(rt::gradient_landing_bytes(s, host, o), 3ull * static_cast<uint64_t>(head) * 4 / 2);
  // device gradients: the ring, as before
  rt::DevicePlacement dev;
  EXPECT_EQ(rt::gradient_landing_bytes(s, dev, o),
            4ull * static_cast<uint64_t>(rt::gradient_landing_chunk_elems(s, o.landing_chunk_bytes)) * 4);
}

TEST(GradientLanding, MuonLandsWholeUnitsAndTiedEmbeddingsLandInPieces) {
  // Muon updates whole units (optim/unit_update.h): its slabs stay the largest unit
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-14b");
  const std::vector<int64_t> n = rt::unit_numels(s);
  rt::CudaOptions o;
  o.muon = true;
  rt::DevicePlacement p;
  p.host_grads = p.fold = true;
  EXPECT_EQ(rt::gradient_landing_slab_elems(s, o), *std::max_element(n.begin(), n.end()));
  EXPECT_TRUE(rt::gradient_landing_split_units(s, p, o).empty());
  EXPECT_EQ(rt::gradient_landing_bytes(s, p, o), 3 * static_cast<uint64_t>(*std::max_element(n.begin(), n.end())) * 4);
  // a tied embedding stays on the device and lands through the slabs: it is the split unit
  rt::ModelSpec t = spec(true);
  t.vocab = 4096;  // 4096 x 64: larger than a 16384-element slab
  rt::CudaOptions small;
  small.landing_slab_bytes = 4;  // the test option: rounds up to one 16384-element block
  EXPECT_EQ(rt::gradient_landing_slab_elems(t, small), 16384);
  rt::DevicePlacement tp;
  tp.host_grads = tp.fold = true;  // host_embed stays false: tied
  const std::vector<int64_t> tn = rt::unit_numels(t);
  std::vector<size_t> want;
  for (size_t u = 0; u < tn.size(); ++u)
    if (tn[u] > 16384) want.push_back(u);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(want[0], 0u);
  EXPECT_EQ(rt::gradient_landing_split_units(t, tp, small), want);
  // never larger than the largest unit
  small.landing_slab_bytes = 1ull << 40;
  EXPECT_EQ(rt::gradient_landing_slab_elems(t, small), *std::max_element(tn.begin(), tn.end()));
}

TEST(GradientLanding, PiecesCoverTheUnitOnBlockBounds) {
  // grad_chunks(numel, {u}, slab) is the landing's cut (GradientSink::land):
  // in order, covering [0, numel), every piece but the last a whole slab, so
  // every piece starts at a multiple of 16384 (the sum's blocks, a multiple
  // of the 256-element quantization blocks)
  const rt::ModelSpec s = rt::spec_preset("qwen2.5-14b");
  const std::vector<int64_t> n = rt::unit_numels(s);
  rt::CudaOptions o;
  for (uint64_t slab_bytes : {uint64_t{0}, uint64_t{1} << 20, uint64_t{3} << 20}) {
    o.landing_slab_bytes = slab_bytes;
    const int64_t slab = rt::gradient_landing_slab_elems(s, o);
    for (size_t u : {size_t{1}, n.size() - 1}) {
      const std::vector<rt::GradChunk> pieces = rt::grad_chunks(n, {u}, slab);
      ASSERT_EQ(static_cast<int64_t>(pieces.size()), (n[u] + slab - 1) / slab);
      int64_t at = 0;
      for (const rt::GradChunk& c : pieces) {
        EXPECT_EQ(c.u, u);
        EXPECT_EQ(c.b, at);
        EXPECT_EQ(c.b % 16384, 0);
        EXPECT_LE(c.e - c.b, slab);
        EXPECT_TRUE(c.e == n[u] || c.e - c.b == slab);
        at = c.e;
      }
      EXPECT_EQ(at, n[u]);
    }
  }
}

// The MoE expert GEMMs' auto mode (cuda/moe_scratch.h moe_small_experts):
// OLMoE-1B-7B's 8k- and 32k-token calls (1024 and 4096 rows an expert) run
// grouped, the two cases measured on the H100 (the MoE layer alone at 32k:
// grouped 455 expert TFLOP/s, looped 407); the rule is the size of one
// expert GEMM, so Qwen3-30B-A3B's narrower experts group at 64k tokens too
// (4096 rows of 2048 x 768), and Mixtral's wide ones (4096 x 14336) loop at 8k.
TEST(MoeGemmMode, SmallExpertGemmsRunGrouped) {
  auto small = [](const char* preset, int64_t tokens) {
    const rt::ModelSpec s = rt::spec_preset(preset);
    return rt::cuda::moe_small_experts(tokens, s.moe.top_k, s.moe.n_experts, s.hidden, s.moe.expert_intermediate);
  };
  EXPECT_TRUE(small("olmoe-1b-7b", 8192));
  EXPECT_TRUE(small("olmoe-1b-7b", 32768));  // 4096 rows: the boundary, grouped
  EXPECT_FALSE(small("olmoe-1b-7b", 65536));
  EXPECT_TRUE(small("qwen3-30b-a3b", 65536));
  EXPECT_FALSE(small("qwen3-30b-a3b", 131072));
  EXPECT_FALSE(small("mixtral-8x7b", 8192));
}
