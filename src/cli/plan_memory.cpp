// ramtrain plan's bytes, as the CUDA engine would place them: the device plan
// (fit_device_plan, the engine's own planner) with make_cuda_backend's
// fallback to micro-batch-major when the host cannot pin layer-major's block
// inputs, then host RAM item by item beside it (HostState::planned_bytes split
// into master, moments and shadows; gradients, checkpoints, landing buffers,
// Muon's staging, token batches), the state tier's RAM/SSD split and data
// parallel's bytes per rank. What the engine pins or refuses on the host is
// mirrored here: a change there is a change here.
#include <algorithm>
#include <string>
#include <vector>

#include "cli/plan.h"
#include "core/error.h"
#include "engine/sharded_optimizer.h"
#include "io/checkpoint.h"
#include "optim/muon.h"

namespace rt::cli {

namespace {

uint64_t sum(const std::vector<uint64_t>& v) {
  uint64_t n = 0;
  for (uint64_t x : v) n += x;
  return n;
}

// Bytes of the host gradient arenas per unit: every unit's (host), the host
// embedding's only (fold), none (device).
std::vector<uint64_t> host_grad_bytes(const ModelSpec& spec, const DevicePlacement& place) {
  const std::vector<int64_t> unit_numel = unit_numels(spec);
  std::vector<uint64_t> bytes(unit_numel.size());
  for (size_t u = 0; u < unit_numel.size(); ++u)
    if (place.host_grads && (!place.fold || (u == 0 && place.host_embed)))
      bytes[u] = 4 * static_cast<uint64_t>(unit_numel[u]);
  return bytes;
}

// The pinned gradient landing's line (engine/device_plan.h gradient_landing_bytes):
// host gradients land in 3 slabs of the largest layer, a larger unit in
// pieces (fold: its sum of squares taken on the GPU first); Muon's in 3 slabs
// of the largest unit (whole units); device gradients through the ring.
std::string landing_item(const ModelSpec& spec, const DevicePlacement& pl, const CudaOptions& co) {
  if (!pl.host_grads) return "pinned gradient landing (4 chunks for the optimizer's copy-out)";
  if (co.muon) return "pinned gradient landing (3 slabs of the largest unit: Muon)";
  const std::vector<size_t> split = gradient_landing_split_units(spec, pl, co);
  const std::vector<int64_t> n = unit_numels(spec);
  const int64_t slab = gradient_landing_slab_elems(spec, co);
  std::string what;
  for (size_t u : split)
    what += std::string(what.empty() ? "; " : ", ") +
            (u == 0               ? "embedding"
             : u == n.size() - 1 ? "LM head"
                                 : "layer " + std::to_string(u - 1)) +
            " in " + std::to_string((n[u] + slab - 1) / slab) + " pieces";
  return "pinned gradient landing (3 layer slabs" + what + ")";
}

}  // namespace

// ---- the device plan

PlanDevice plan_device_fit(const PlanOptions& o, const PlanMachine& m) {
  const ModelSpec& spec = o.spec;
  const int64_t T = o.seq_len, B = o.micro_batch, K = o.grad_accum;
  const uint64_t host_ram = o.host_ram;
  PlanDevice d;
  CudaOptions& co = d.options;
  co = o.engine;
  co.max_gpu_memory = m.budget;
  d.plan = fit_device_plan(spec, B, T, co, m.budget);
  const std::string& master = co.master;
  const std::string& opt = o.optimizer;
  const int ranks = o.ranks;
  // --nproc-per-node's rules, after fit_device_plan: the engine's refusals come first
  if (ranks > 1 && K % ranks != 0)
    fail("[plan] --grad-accum ", K, " is not a multiple of --nproc-per-node ", ranks,
         ": the ranks share the step's micro-batches, as train runs them (and refuses this); use --grad-accum ",
         ranks * ((K + ranks - 1) / ranks));
  if (ranks > 1 && (opt != "adamw" || (master != "auto" && master != "fp32" && master != "split")))
    fail("[plan] --nproc-per-node ", ranks,
         " plans the sharded fp32 state (fp32 master + AdamW moments), as train's "
         "--nproc-per-node runs it; drop --optimizer ",
         opt, master == "auto" ? "" : " / --master " + master, " or plan one rank");
  // As the engine does (make_cuda_backend, HostBudgetError): when the host
  // cannot pin the block inputs of every micro-batch beside the state,
  // layer-major left at auto falls back to micro-batch-major.
  if (co.layer_major == "auto" && d.plan.place.layer_major && d.plan.place.host_ckpt) {
    const DevicePlacement& pl = d.plan.place;
    const uint64_t state_ram =
        !o.tiered ? HostState::planned_bytes(spec, o.storage, co.delayed_update ? 2 : 1, false, o.moments, o.rule)
        : o.max_host_memory ? *o.max_host_memory
                            : 0;
    const uint64_t need = state_ram + sum(host_grad_bytes(spec, pl)) + host_checkpoint_bytes(spec, B, T, pl) +
                          gradient_landing_bytes(spec, pl, co) +
                          static_cast<uint64_t>(24 * K * B * T);
    if (need + kHostReserveBytes > host_ram) {
      if (co.grads == "fold") {  // fold needs layer-major with K > 1: say why it cannot stay on
        // The pinned block inputs are (L + 1) x tokens per step x hidden x 2 B, however the step is split,
        // so what helps is fewer tokens per step (the most micro-batches of B that fit), host gradients or RAM.
        const uint64_t ck = host_checkpoint_bytes(spec, B, T, pl);
        const uint64_t per_set = ck / static_cast<uint64_t>(K) + static_cast<uint64_t>(24 * B * T);
        const uint64_t rest = need - ck - static_cast<uint64_t>(24 * K * B * T);
        const int64_t k_fit = host_ram > rest + kHostReserveBytes
                                  ? static_cast<int64_t>((host_ram - rest - kHostReserveBytes) / per_set)
                                  : 0;
        fail("[plan] --grads fold with ", K, " micro-batches needs layer-major, which pins the block inputs of all ", K,
             " (", gib(static_cast<double>(ck)),
             ": every layer's input for every token of the step), more than "
             "the host RAM left allows: ",
             k_fit >= 2 ? cat("fewer tokens per step (--grad-accum ", std::min<int64_t>(k_fit, K - 1),
                              " or less at --micro-batch ", B, "), ")
                        : std::string(),
             "--grads host (micro-batch-major: the inputs of one micro-batch), or more --host-ram");
      }
      co.layer_major = "off";
      d.plan = fit_device_plan(spec, B, T, co, m.budget);
      d.host_fallback = true;
    }
  }
  return d;
}

// ---- host RAM, per item (HostState::planned_bytes is the total the engine holds)

PlanHost plan_host_ram(const PlanOptions& o, const PlanMachine& m, const PlanDevice& d) {
  const ModelSpec& spec = o.spec;
  const int64_t T = o.seq_len, B = o.micro_batch, K = o.grad_accum;
  const MasterStorage storage = o.storage;
  const MomentStorage moments = o.moments;
  const UpdateRule rule = o.rule;
  const bool muon = o.muon;
  const DevicePlacement& pl = d.plan.place;
  PlanHost h;
  const int shadows = d.options.delayed_update ? 2 : 1;
  const uint64_t no_grads = HostState::planned_bytes(spec, storage, shadows, false, moments, rule);
  const uint64_t bare = HostState::planned_bytes(spec, storage, 0, false, moments, rule);
  for (int64_t n : unit_numels(spec)) h.numel += static_cast<uint64_t>(n);
  const uint64_t numel = h.numel;
  const uint64_t mom = HostState::planned_bytes(spec, MasterStorage::fp32, 0, false, moments, rule) - 4 * numel;
  h.moment_bytes = mom;
  // m covers every element; v (Muon: the non-matrix tensors' only) the rest
  const uint64_t mom_m = (HostState::planned_bytes(spec, MasterStorage::fp32, 0, false, moments) - 4 * numel) / 2;
  const std::string mom_kind = moments == MomentStorage::fp32 ? "fp32"
                               : moments == MomentStorage::q8 ? "8-bit codes + an fp32 absmax per 256"
                                                              : "4-bit codes + an fp32 absmax per 256";
  const std::vector<uint64_t> grad_bytes = host_grad_bytes(spec, pl);
  h.block_checkpoint_bytes = host_checkpoint_bytes(spec, B, T, pl);
  std::vector<PlanHostItem>& host = h.items;
  host.push_back({storage == MasterStorage::split ? "master remainder + tie bits (split; upper half = the shadow)"
                  : storage == MasterStorage::bf16_kahan ? "bf16 Kahan compensation (bf16-kahan; master = the shadow)"
                  : storage == MasterStorage::bf16_sr    ? "master: the bf16 shadow itself (bf16-sr)"
                                                         : "fp32 master",
                  bare - mom});
  host.push_back({(muon ? "Adam m / Muon momentum (" : "Adam m (") + mom_kind + ")", mom_m});
  host.push_back({(muon ? "Adam v, none for Muon matrices (" : "Adam v (") + mom_kind + ")", mom - mom_m});
  host.push_back({shadows == 2 ? "pinned bf16 shadows (2: delayed update)" : "pinned bf16 shadow", no_grads - bare});
  host.push_back(
      {pl.fold ? "host gradients (fp32; fold: the host embedding's only)" : "host gradients (fp32)", sum(grad_bytes)});
  host.push_back({"pinned block checkpoints", h.block_checkpoint_bytes});
  host.push_back({landing_item(spec, pl, d.options), gradient_landing_bytes(spec, pl, d.options)});
  if (muon) {  // engine/cuda/muon_gpu.h: per lane, U (fp32) in and O (bf16) out of the matrix in flight
    host.push_back({"pinned Muon Newton-Schulz staging (fp32 U in, bf16 O out; a lane each of the largest matrix)",
                    muon_pinned_bytes(spec)});
    const bool decoded = storage != MasterStorage::fp32 && storage != MasterStorage::split;
    host.push_back({moments != MomentStorage::fp32
                        ? (decoded ? "Muon update scratch (a decoded master chunk; m, v windows)"
                                   : "Muon update scratch (m, v windows)")
                    : decoded ? "Muon update scratch (a decoded master chunk)"
                              : "Muon update scratch (none: U and O are in the staging, the master updates in place)",
                    muon_scratch_bytes(spec, storage, moments != MomentStorage::fp32, /*pipelined=*/true)});
  }
  // the step's token batches (ids, targets, positions) and their pinned staging: 12 B/token each
  host.push_back({"token batches and staging", static_cast<uint64_t>(24 * K * B * T)});
  for (const PlanHostItem& it : host) h.total += it.bytes;
  // the state tier: the state items (the first kPlanStateItems) become RAM + SSD
  if (o.tiered) {
    uint64_t others = h.total;
    for (size_t i = 0; i < kPlanStateItems; ++i) others -= host[i].bytes;
    h.tier_budget = o.max_host_memory ? *o.max_host_memory
                                      : std::max<uint64_t>(m.host_usable > others ? m.host_usable - others : 0, 1);
    h.tier = plan_run_tier(spec, storage, shadows, moments, rule, grad_bytes, h.tier_budget, o.ssd_gbs,
                           pl.slots >= spec.n_layers);
    h.total = others + h.tier.place.ram();
  }
  h.fits = h.total <= m.host_usable && h.tier.fits;
  // one checkpoint on disk: the state as held (a split master's file is fp32, a bf16 master's bf16)
  h.saved_bytes = checkpoint_bytes_estimate(spec, moments, storage, rule);
  // data parallel (issue 22's layout): each rank's host bytes, and the host's ranks together
  for (int r = 0; r < o.ranks && o.ranks > 1; ++r) {
    const uint64_t b = dp_rank_host_bytes(spec, o.ranks, r, 2, /*grad_slices=*/false);  // a GPU rank (CudaOptions::dp)
    h.dp_rank_max = std::max(h.dp_rank_max, b);
    h.dp_host += b;
  }
  h.dp_fits = h.dp_host <= m.host_usable;
  return h;
}

}  // namespace rt::cli
