#include "engine/device_plan.h"

#include <algorithm>

#include "core/error.h"
#include "cpu/ops.h"
#include "cuda/lm_head_rows.h"
#include "cuda/moe_scratch.h"
#include "cuda/newton_schulz_workspace.h"
#include "cuda/sum_squares_order.h"
#include "model/block.h"
#include "model/block_memory.h"
#include "model/weight_map.h"
#include "optim/adamw.h"
#include "state/host_state.h"
#include "state/moment_quant.h"

namespace rt {

std::vector<int64_t> unit_numels(const ModelSpec& s) {
  std::vector<int64_t> n(static_cast<size_t>(s.n_layers + 2), 0);
  for (const WeightEntry& e : weight_map(s)) {
    const size_t u = e.kind == WeightKind::embed ? 0
                     : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                                 : static_cast<size_t>(s.n_layers + 1);
    n[u] += (e.numel() + 15) / 16 * 16;  // HostState's arena layout: every tensor 16-float aligned
  }
  return n;
}

std::vector<int64_t> device_unit_numels(const ModelSpec& s) {
  std::vector<int64_t> n = unit_numels(s);
  // the LM head is its unit's last tensor (weight_map order): the embedding's
  // only one, or the head's after the final norm
  const size_t u = s.tie_embeddings ? 0 : static_cast<size_t>(s.n_layers + 1);
  const int64_t head = (s.vocab * s.hidden + 15) / 16 * 16, padded = cuda::lm_head_rows(s.vocab) * s.hidden;
  n[u] = std::max(n[u], n[u] - head + padded);
  return n;
}

MuonMatrixDims muon_matrix_dims(const ModelSpec& s) {
  MuonMatrixDims d;
  for (const WeightEntry& e : weight_map(s))
    if (muon_matrix(e)) {
      d.max_numel = std::max(d.max_numel, e.shape[0] * e.shape[1]);
      d.max_small = std::max(d.max_small, std::min(e.shape[0], e.shape[1]));
    }
  return d;
}

MuonStepWork muon_step_work(const ModelSpec& s) {
  MuonStepWork w;
  for (const WeightEntry& e : weight_map(s))
    if (muon_matrix(e)) {
      const double m = static_cast<double>(std::min(e.shape[0], e.shape[1]));
      const double n = static_cast<double>(std::max(e.shape[0], e.shape[1]));
      w.flops += 5 * (4 * m * m * n + 2 * m * m * m);
      w.bytes += 6 * m * n;
    }
  return w;
}

uint64_t muon_workspace_bytes(const ModelSpec& s) {
  const MuonMatrixDims d = muon_matrix_dims(s);
  return d.max_numel > 0 ? cuda::newton_schulz_workspace_bytes(d.max_numel, d.max_small) : 0;
}

uint64_t muon_pinned_bytes(const ModelSpec& s) {
  const MuonMatrixDims d = muon_matrix_dims(s);
  return d.max_numel > 0 ? static_cast<uint64_t>(cuda::kNewtonSchulzLanes) *
                               (static_cast<uint64_t>(d.max_numel) * 6 + sizeof(double))
                         : 0;
}

DevicePlacement place_on_device(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& o, uint64_t budget) {
  const int64_t L = s.n_layers, N = B * T;
  DevicePlacement p;
  p.slots = o.resident ? static_cast<int>(L) : std::max(2, std::min<int>(o.slots, static_cast<int>(L)));
  // where gradients and checkpoints live (auto: the device, unless they would take a large part of it)
  const uint64_t layer_numel = static_cast<uint64_t>(unit_numels(s)[1]);
  const uint64_t dev_grad_bytes = layer_numel * 4 * static_cast<uint64_t>(L);
  // layer-major (auto: K > 1, the weights stream, the embedding untied: backend.h)
  RT_CHECK(o.layer_major == "auto" || o.layer_major == "on" || o.layer_major == "off",
           "[cuda] --layer-major must be auto, on or off, got '", o.layer_major, "'");
  RT_CHECK(o.micro_batches >= 1, "[cuda] the micro-batches per step (--grad-accum) must be >= 1, got ",
           o.micro_batches);
  p.micro_batches = o.micro_batches;
  // (MoE models too: each micro-batch's routing is complete after the layer-major forward, before any backward)
  p.layer_major = o.micro_batches > 1 &&
                  (o.layer_major == "on" || (o.layer_major == "auto" && p.slots < L && !s.tie_embeddings));
  const uint64_t ckpt_bytes = static_cast<uint64_t>(p.sets()) * (L + 1) * N * s.hidden * 2;
  auto pick = [](const std::string& v, bool big, const char* what) {
    RT_CHECK(v == "auto" || v == "device" || v == "host" || (v == "fold" && std::string(what) == "grads"), "[cuda] --",
             what, " must be auto, device or host", std::string(what) == "grads" ? " or fold" : "", ", got '", v, "'");
    return v == "host" || v == "fold" || (v == "auto" && big);
  };
  // Muon orthogonalises whole matrices: the device mode's optimizer updates
  // chunks as they land, so each unit's gradient must reach the host whole
  if (o.muon && o.grads == "device")
    fail("[cuda] --optimizer muon orthogonalises whole matrices, but --grads device updates each unit in chunks as "
         "they land: use --grads host or --grads fold (or auto, which picks one of them)");
  if (o.muon && o.delayed_update)
    fail("[cuda] --optimizer muon needs each unit's whole gradient on the host (--grads host or fold), which "
         "--delayed-update cannot use: drop --delayed-update");
  p.host_grads = pick(o.grads, o.muon || (!o.delayed_update && (o.prefer_host_grads || dev_grad_bytes > budget / 3)),
                      "grads");
  if (o.delayed_update && p.host_grads)
    fail(
        "[cuda] --delayed-update needs the gradients on the device (--grads device), not --grads ", o.grads,
        ": with host gradients each layer's gradient lands in the host arena the pending update still reads. Drop "
        "--delayed-update, or use --grads device if ",
        dev_grad_bytes >> 20, " MiB of fp32 gradients fit");
  // fold: each unit's gradient must be whole when it leaves (one micro-batch,
  // or layer-major, which sums all of them on the device first)
  const bool whole = o.micro_batches == 1 || p.layer_major;
  if (o.grads == "fold" && !whole)
    fail("[cuda] --grads fold needs each layer's gradient summed over the step's ", o.micro_batches,
         " micro-batches on the device before it leaves: ",
         o.layer_major == "off" ? "use --layer-major on (or auto), or --grad-accum 1"
         : s.tie_embeddings       ? "layer-major auto stays off for tied embeddings (equal only up to rounding): "
                                    "use --layer-major on, or --grad-accum 1"
                                  : "layer-major auto stays off when every layer is resident: use --layer-major on, "
                                    "or --grad-accum 1");
  p.fold = o.grads == "fold" || (o.grads == "auto" && p.host_grads && !o.clipping && whole);
  p.host_ckpt = pick(o.checkpoints, ckpt_bytes > budget / 4, "checkpoints");
  p.host_embed = p.host_grads && !s.tie_embeddings;  // a tied table is the LM head too: it stays on the device
  return p;
}

namespace {
int64_t largest_unit(const ModelSpec& s) {
  const std::vector<int64_t> n = unit_numels(s);
  return *std::max_element(n.begin(), n.end());
}
}  // namespace

int64_t gradient_landing_chunk_elems(const ModelSpec& s, uint64_t landing_chunk_bytes) {
  const int64_t max_unit = largest_unit(s);
  const int64_t want = static_cast<int64_t>(landing_chunk_bytes / 4) / kGradChunkAlign * kGradChunkAlign;
  return want > 0 ? std::min(want, max_unit) : max_unit;
}

static_assert(kGradSlabAlign == kOptimBlock && kGradSlabAlign == cuda::kSumSquaresBlock,
              "landing pieces start on blocks of rt::sum_squares and of the device's ordered sum");
static_assert(kGradSlabAlign % kGradChunkAlign == 0 && kGradSlabAlign % kQuantBlock == 0,
              "landing pieces never cut a quantization block");

int64_t gradient_landing_slab_elems(const ModelSpec& s, const CudaOptions& o) {
  const std::vector<int64_t> n = unit_numels(s);
  const int64_t max_unit = *std::max_element(n.begin(), n.end());
  if (o.muon) return max_unit;
  const int64_t max_layer = s.n_layers > 0 ? *std::max_element(n.begin() + 1, n.end() - 1) : max_unit;
  const int64_t want = o.landing_slab_bytes > 0 ? static_cast<int64_t>(o.landing_slab_bytes / 4) : max_layer;
  const int64_t slab = (std::max<int64_t>(want, 1) + kGradSlabAlign - 1) / kGradSlabAlign * kGradSlabAlign;
  return std::min(slab, max_unit);
}

std::vector<size_t> gradient_landing_split_units(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o) {
  std::vector<size_t> split;
  if (!p.host_grads) return split;
  const std::vector<int64_t> n = unit_numels(s);
  const int64_t slab = gradient_landing_slab_elems(s, o);
  for (size_t u = 0; u < n.size(); ++u)
    if (!(u == 0 && p.host_embed) && n[u] > slab) split.push_back(u);
  return split;
}

uint64_t gradient_landing_sum_doubles(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o) {
  if (!p.fold) return 0;
  const std::vector<int64_t> n = unit_numels(s);
  uint64_t d = 0;
  for (size_t u : gradient_landing_split_units(s, p, o)) d = std::max(d, cuda::sum_squares_ordered_doubles(n[u]));
  return d;
}

uint64_t gradient_landing_bytes(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o) {
  if (p.host_grads)
    return static_cast<uint64_t>(kGradLandingSlabs) *
           (static_cast<uint64_t>(gradient_landing_slab_elems(s, o)) * 4 +
            (gradient_landing_sum_doubles(s, p, o) > 0 ? sizeof(double) : 0));
  return static_cast<uint64_t>(kGradLandingRing) *
         static_cast<uint64_t>(gradient_landing_chunk_elems(s, o.landing_chunk_bytes)) * 4;
}

uint64_t host_checkpoint_bytes(const ModelSpec& s, int64_t B, int64_t T, const DevicePlacement& p) {
  if (!p.host_ckpt) return 0;
  return static_cast<uint64_t>(p.sets()) * static_cast<uint64_t>(s.n_layers + 1) * static_cast<uint64_t>(B * T) *
         static_cast<uint64_t>(s.hidden) * 2;
}

int64_t auto_kept_layers(uint64_t used, uint64_t act_bytes, uint64_t budget) {
  const uint64_t planned = used + act_bytes + budget / 64;
  return static_cast<int64_t>((budget - std::min(budget, planned)) / act_bytes);
}

KeptLayers engine_kept_layers(const ModelSpec& s, const BlockDims& dm, const CudaOptions& o, uint64_t used,
                              uint64_t budget, int64_t sets) {
  const uint64_t planned = used + block_acts_bytes(s, dm, 2) + budget / 64;
  const uint64_t left = budget - std::min(budget, planned);
  if (sets <= 1) return plan_kept_layers(s, dm, left, 2, 1, o.keep_activations, o.keep_attention);
  KeptLayers k;  // layer-major: a layer's attention halves of every micro-batch, or nothing
  const uint64_t per_layer = std::max<uint64_t>(block_attn_acts_bytes(s, dm, 2) * static_cast<uint64_t>(sets), 1);
  k.attention =
      std::min<int64_t>(s.n_layers, o.keep_attention >= 0 ? o.keep_attention : static_cast<int64_t>(left / per_layer));
  return k;
}

bool shrink_plan(CudaOptions& o, std::string* change) {
  const bool grads_auto = o.grads == "auto" && !o.delayed_update && !o.prefer_host_grads;
  if (grads_auto || o.checkpoints == "auto") {
    if (grads_auto) o.prefer_host_grads = true;  // host, or fold where auto folds (CudaOptions::grads)
    if (o.checkpoints == "auto") o.checkpoints = "host";
    *change = "gradients and block checkpoints in host RAM";
  } else if (o.slots > 2 && !o.resident && o.fit_slots) {
    o.slots = 2;
    *change = "2 weight slots";
  } else if (o.ce_chunk_rows > 256) {
    o.ce_chunk_rows = 256;
    *change = "LM-head chunks of 256 rows";
  } else if (o.layer_major == "auto" && o.micro_batches > 1) {  // it costs the most time
    o.layer_major = "off";
    *change = "micro-batch-major (one set of block inputs and residual gradients, not one per micro-batch)";
  } else if (o.mlp_chunk_held) {  // last: results change by fp32 summation order (docs/long_sequences.md)
    o.mlp_chunk_held = false;
    *change = "MLP in token chunks";
  } else {
    return false;
  }
  return true;
}

namespace {

uint64_t round256(uint64_t b) { return (b + 255) / 256 * 256; }

}  // namespace

int64_t plan_mlp_chunk_tokens(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& o, uint64_t available) {
  RT_CHECK(o.mlp_chunk_tokens >= -1, "[cuda] --mlp-chunk-tokens must be auto, 0 (off) or a token count > 0, got ",
           o.mlp_chunk_tokens);
  if (o.mlp_chunk_tokens >= 0) return o.mlp_chunk_tokens;
  if (o.mlp_chunk_held) return 0;
  const int64_t chunk = pick_mlp_chunk_tokens(s, B, T, 2, available, 1, 256);
  if (chunk >= 0) return chunk;
  return mlp_chunk_candidates(B * T).empty() ? 0 : kMinMlpChunkTokens;  // none fits: the smallest, to report
}

uint64_t lm_head_scratch_estimate(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& o) {
  const uint64_t r = static_cast<uint64_t>(o.ce_chunk_rows), v = static_cast<uint64_t>(cuda::lm_head_rows(s.vocab));
  const uint64_t lm = round256(r * v * 4) + round256(r * v * 2) + 2 * round256(r * 4);
  if (!s.is_moe()) return lm;
  const cuda::MoeDims md{B * T, s.hidden, s.moe.n_experts, s.moe.top_k, s.moe.expert_intermediate,
                         s.moe.norm_topk_prob};
  return std::max<uint64_t>(lm, cuda::moe_scratch_bytes(md));
}

DevicePlan plan_device(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& o, uint64_t budget,
                       const OpScratchBytes& op_scratch) {
  DevicePlan p;
  p.options = o;
  p.budget = budget;
  p.place = place_on_device(s, B, T, o, budget);
  const std::vector<int64_t> numel = device_unit_numels(s);
  const int64_t L = s.n_layers, N = B * T, C = s.hidden;
  const size_t U = numel.size();
  auto add = [&](std::string what, uint64_t bytes_each, int64_t count = 1) {
    p.items.push_back({std::move(what), round256(bytes_each) * static_cast<uint64_t>(count), count});
    p.total += p.items.back().bytes;
  };
  const auto u64 = [](int64_t v) { return static_cast<uint64_t>(v); };
  // the engine's order: weights, gradients, checkpoints, step buffers, scratch, activations
  if (!p.place.host_embed) add("the embedding", u64(numel[0]) * 2);
  add("the final norm and LM head", u64(numel[U - 1]) * 2);
  add("layer weight slots", u64(numel[1]) * 2, p.place.slots);
  for (size_t u = 0; u < U; ++u) {
    const bool layer = u >= 1 && u + 1 < U;
    if ((p.place.host_grads && layer) || (p.place.host_embed && u == 0)) continue;
    add(u == 0       ? "gradients of embed"
        : u + 1 == U ? "gradients of head"
                     : "gradients of layer." + std::to_string(u - 1),
        u64(numel[u]) * 4);
  }
  if (p.place.host_grads) add("layer gradient buffers", u64(numel[1]) * 4, 2);
  const int64_t K = p.place.sets();
  if (p.place.host_ckpt) {
    add("block input buffers", u64(N * C) * 2, 2);
    if (p.place.layer_major) add("layer-major block input ring", u64(N * C) * 2, kCheckpointRing);
  } else {
    add("block checkpoints", u64(K * (L + 1) * N * C) * 2);
  }
  add("final hidden states", u64(N * C) * 2);
  add(K > 1 ? "residual gradients (one per micro-batch)" : "residual gradient", u64(K * N * C) * 2);
  add("final norm gradients", u64(N * C) * 2);
  add("final norm statistics", u64(N) * 4);
  add("token ids, targets, positions", u64(K * N) * 4, 3);
  add("document starts (packed rows)", u64(K * N) * 4);
  add("loss totals", 16);  // CrossEntropyTotals: double + long long
  add("gradient norms", u64(static_cast<int64_t>(U)) * 8);
  add("RoPE frequencies", cpu::rope_inv_freq(s.rope, s.head_dim).size() * 4);
  if (s.rope_local_on) add("local RoPE frequencies", cpu::rope_inv_freq(s.rope_local, s.head_dim).size() * 4);
  add("op scratch", op_scratch(s, B, T, o));
  if (o.muon) {  // cuda/newton_schulz_workspace.h, per lane: U (fp32), X, A, B, the norm's block sums
    const MuonMatrixDims d = muon_matrix_dims(s);
    const int64_t lanes = cuda::kNewtonSchulzLanes;
    const uint64_t x = u64(d.max_numel) * 2, a = u64(d.max_small) * u64(d.max_small) * 2;
    add("Muon Newton-Schulz workspace (U in fp32, X's copy)", 2 * x, lanes);
    add("Muon Newton-Schulz workspace (X)", x, lanes);
    add("Muon Newton-Schulz workspace (A, B)", a, 2 * lanes);
    add("Muon Newton-Schulz workspace (norm block sums)", cuda::newton_schulz_norm_doubles(d.max_numel) * 8, lanes);
  }
  // the MLP token chunk: on auto, the largest that lets the shared activation
  // set and the backward scratch fit in what is left (1/64 held back)
  p.mlp_chunk_tokens = plan_mlp_chunk_tokens(s, B, T, o, budget - std::min(budget, p.total + budget / 64));
  const BlockDims dm{B, T, p.mlp_chunk_tokens};
  add("backward scratch", block_scratch_bytes(s, dm, 2, 256));
  // fold, units landing in pieces: their sums of squares on the device (engine/cuda/gradient_sink.h)
  if (const uint64_t d = gradient_landing_sum_doubles(s, p.place, o))
    add("gradient landing sums of squares (units landing in pieces)", d * 8);
  // the activations: the shared set, then the kept layers (engine: auto_kept_layers on what is in so far)
  p.layer_act_bytes = block_acts_bytes(s, dm, 2);  // bf16 activations, unrounded, as the engine counts
  p.layer_attn_bytes = block_attn_acts_bytes(s, dm, 2);
  // layer-major: attention halves only, one per micro-batch of a kept layer
  const int64_t sets = p.place.layer_major ? K : 1;
  const KeptLayers k = engine_kept_layers(s, dm, o, p.total, budget, sets);
  p.kept_layers = std::min(k.all, L);
  p.attn_kept_layers = k.attention;
  const uint64_t acts = block_acts_bytes(s, dm, 2, 256);
  p.items.push_back({"block activations (shared + kept layers)", acts * u64(1 + p.kept_layers), 1 + p.kept_layers});
  p.total += p.items.back().bytes;
  if (p.attn_kept_layers > 0) {
    p.items.push_back({sets > 1 ? "kept attention halves (selective recompute, one per micro-batch)"
                                : "kept attention halves (selective recompute)",
                       block_attn_acts_bytes(s, dm, 2, 256) * u64(p.attn_kept_layers * sets),
                       p.attn_kept_layers * sets});
    p.total += p.items.back().bytes;
  }
  return p;
}

DevicePlan fit_device_plan(const ModelSpec& s, int64_t B, int64_t T, const CudaOptions& opt, uint64_t budget,
                           const OpScratchBytes& op_scratch) {
  CudaOptions o = opt;
  o.mlp_chunk_held = o.fit && o.mlp_chunk_tokens == -1;  // auto chunking: the chain's last step
  std::vector<std::string> changes;
  for (;;) {
    DevicePlan p = plan_device(s, B, T, o, budget, op_scratch);
    std::string change;
    if (p.fits() || !o.fit || !shrink_plan(o, &change)) {
      p.changes = std::move(changes);
      return p;
    }
    changes.push_back(change);
  }
}

}  // namespace rt
