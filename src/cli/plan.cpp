// ramtrain plan: what a training run of a model on a card beside a host would
// need and do, without a GPU: the host RAM per plan item, the device plan the
// CUDA engine would choose (engine/device_plan.h: the engine's own planner),
// the predicted step time (engine/step_model.h) and, when it does not fit,
// which flag to change and by how much. Exits 1 when the run would be refused.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/fs.h"
#include "engine/backend.h"
#include "engine/device_plan.h"
#include "engine/sharded_optimizer.h"
#include "engine/step_model.h"
#include "engine/tier_plan.h"
#include "io/checkpoint.h"
#include "model/weight_map.h"
#include "optim/muon.h"
#include "state/host_state.h"

namespace rt::cli {

namespace {

constexpr double GiB = 1ull << 30;

// Host RAM the OS and the process keep beyond the plan: on the lent 128 GiB
// H200 host the engine found ~24.4 GiB free beside a 99.3 GiB state (issue 16:
// "host gradients need 29051 MiB more host RAM but only ~25000 MiB are
// available"), so ~124 GiB of 128 are usable.
constexpr uint64_t kHostReserveBytes = 4ull << 30;

const char* kSummary =
    "Plans a training run without running it: the host RAM it needs per item, the device plan\n"
    "the CUDA engine would choose for the card (its own planner), the predicted step time split into\n"
    "compute, host<->device copies and the CPU optimizer, with the binding one named, and what to\n"
    "change when it does not fit. Card figures are datasheet leads; the time model is calibrated on\n"
    "H200 measurements (bench/plan_check.sh compares). Exits 1 when the run would be refused.";

const char* kExamples =
    "  ramtrain plan --preset qwen2.5-7b --gpu rtx3080 --micro-batch 2 --grad-accum 16\n"
    "  ramtrain plan --preset qwen2.5-7b --gpu h200 --micro-batch 32 --delayed-update --json\n"
    "  ramtrain plan --model ./Qwen2.5-7B --gpu-memory 10G --gpu-tflops 60 --pcie-gbs 25 --host-ram 64G\n";

struct HostItem {
  std::string what;
  uint64_t bytes;
};

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += static_cast<char>(c);
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else
      o += static_cast<char>(c);
  }
  return o + "\"";
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// GiB, or MiB below 1 GiB (small models)
std::string gib(double bytes) {
  return bytes >= GiB ? fmt("%.2f GiB", bytes / GiB) : fmt("%.2f MiB", bytes / (1 << 20));
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

int cmd_plan(const Args& args) {
  ArgParser p("plan", kSummary, kExamples);
  p.group("Model");
  p.option("preset", "NAME", "a built-in model shape (ramtrain train --help lists them)");
  p.option("model", "DIR", "a HF model directory (only config.json is read)");
  p.option("layers", "N", "plan with this many layers instead of the model's (a what-if)").integer(1);
  p.group("Tokens per step");
  p.option("seq-len", "T", "tokens per sequence", "2048").integer(1);
  p.option("micro-batch", "B", "sequences per micro-batch", "8").integer(1);
  p.option("grad-accum", "K", "micro-batches per optimizer step", "1").integer(1);
  p.group("Card");
  p.option("gpu", "NAME", std::string("a known card: ") + card_names() + " (datasheet leads)", "h200")
      .choice({"rtx3080", "rtx3090", "rtx4090", "rtx5090", "a100-40g", "h100", "h200"});
  p.option("gpu-memory", "SIZE",
           "device memory the engine may plan with, as train's --max-gpu-memory (default: the card's, "
           "less ~0.6 GiB for the CUDA context)")
      .size();
  p.option("gpu-tflops", "X", "dense bf16 TFLOP/s with fp32 accumulate (default: the card's)").above(0);
  p.option("pcie-gbs", "Y", "practical host<->device GB/s (default: the card's: gen4 x16 25, gen5 x16 50)").above(0);
  p.option("matmul", "bf16|fp8",
           "the projections' GEMMs, as train's --matmul: fp8 counts their FLOPs at the card's FP8 rate (block "
           "scaling: h100, h200, measured; tensor scaling: rtx4090, rtx5090, h100, h200, an ESTIMATE until measured; "
           "other cards are refused as train refuses them)",
           "bf16")
      .choice({"bf16", "fp8"});
  p.option("fp8-scaling", "block|tensor",
           "with --matmul fp8, as train's --fp8-scaling: block (1x128/128x128 scales, Hopper) or tensor (one scale "
           "per tensor, any FP8 card; its rate is an estimate from the GEMM's measured 1.75x less the quantizers' "
           "bytes, step_model.cpp)",
           "block")
      .choice({"block", "tensor"});
  p.option("gpu-fp8-tflops", "X",
           "dense FP8 TFLOP/s with fp32 accumulate for --matmul fp8 (default: the card's; with --gpu-tflops, "
           "the card's FP8/bf16 ratio applied to it)")
      .above(0);
  p.group("Host");
  p.option("host-ram", "SIZE", "the host's RAM (about 4 GiB of it is kept for the OS and the process)", "128G").size();
  p.option("cpu-adamw-gparams", "X", "CPU AdamW rate in Gparam/s (measured ~4 on the 16-core H200 host)", "4.0")
      .above(0);
  p.option("state-dir", "PATH",
           "plan the state tier below RAM, as train --state-dir (the path is not touched): the optimizer state of "
           "the units that do not fit in RAM lives on an SSD, and the bf16 weights too when RAM cannot hold them; "
           "prints the bytes per tier, the SSD traffic of a step and whether the SSD binds it");
  p.option("max-host-memory", "SIZE",
           "with the state tier: host RAM the training state may take (default: the usable RAM less the other "
           "items: block checkpoints, staging)")
      .size();
  p.option("ssd-gbs", "X", "the state SSD's sustained GB/s, reads and writes together (a PCIe 4 NVMe: ~7)", "3.0")
      .above(0);
  p.group("Engine options (as in train)");
  p.flag("delayed-update", "apply step t's update during step t+1");
  p.flag("low-memory", "gradients and checkpoints on the host, 2 slots, 256-row LM-head chunks");
  p.flag("resident", "keep every layer on the device");
  p.option("slots", "N", "device weight slots", "3").integer(2);
  p.option("grads", "auto|device|host|fold",
           "where gradients wait for the norm (fold: nowhere, each layer updates as its gradient lands)", "auto")
      .choice({"auto", "device", "host", "fold"});
  p.option("clip", "NORM", "the run's --clip (0: off; auto then folds where it would send gradients to the host)",
           "1.0")
      .number(0);
  p.option("checkpoints", "auto|device|host", "where block inputs wait for the backward", "auto")
      .choice({"auto", "device", "host"});
  p.option("layer-major", "auto|on|off", "layer-major micro-batches (--grad-accum > 1)", "auto")
      .choice({"auto", "on", "off"});
  p.option("master", "auto|fp32|split|bf16-sr|bf16-kahan",
           "host storage of the master (auto: split; bf16-*: the bf16 shadow is the master)", "auto")
      .choice({"auto", "fp32", "split", "bf16-sr", "bf16-kahan"});
  p.option("optimizer", "adamw|adamw8bit|adamw4bit|muon|muon8bit|muon4bit",
           "Adam moments in fp32, or block-wise quantized to 8 or 4 bits; muon, muon8bit, muon4bit: Muon for the "
           "layers' matrices (a momentum, fp32, 8- or 4-bit, and no second moment), AdamW for the rest; "
           "Newton-Schulz runs on the GPU (its workspace is in the device plan) and gradients reach the optimizer "
           "whole (--grads host or fold)",
           "adamw")
      .choice({"adamw", "adamw8bit", "adamw4bit", "muon", "muon8bit", "muon4bit"});
  p.option("keep-activations", "N|auto", "layers whose activations stay forward to backward", "auto")
      .integer(0)
      .or_word("auto");
  p.option("keep-attention", "N|auto",
           "layers (before the kept ones) that keep only their attention half: q/k/v, the attention output and the "
           "residual h; their backward recomputes the norms and the MLP's gate/up alone (selective recompute)",
           "auto")
      .integer(0)
      .or_word("auto");
  p.option("nproc-per-node", "N",
           "ranks (GPUs) on this host in data parallel: also print each rank's host RAM with the optimizer "
           "state sharded over the ranks (1/N of the fp32 master and Adam moments, the whole bf16 weights; "
           "docs/multi_gpu.md), as train --nproc-per-node N runs it on N GPUs",
           "1")
      .integer(1, 1024);
  p.group("Output");
  p.flag("json", "print one JSON object instead of the report");
  if (!p.parse(args)) return 0;

  // ---- the model
  if (p.has("preset") == p.has("model")) fail("[plan] give exactly one of --preset NAME or --model DIR");
  std::string model_name;
  ModelSpec spec;
  if (p.has("preset")) {
    model_name = p.str("preset");
    spec = spec_preset(model_name);
  } else {
    model_name = resolve_model_dir(p.str("model"));
    model_dir_check(model_name, false, "[plan]");
    spec = spec_from_config_file(path_join(model_name, "config.json"));
  }
  if (p.has("layers")) spec.n_layers = p.integer("layers");
  const int64_t T = p.integer("seq-len"), B = p.integer("micro-batch"), K = p.integer("grad-accum");
  if (T > spec.max_sequence())
    fail("[plan] --seq-len ", T, " exceeds the model's ", spec.max_sequence_why(), "; lower --seq-len");

  // ---- the machine
  CardSpec card;
  card_lookup(p.str("gpu"), &card);  // a choice: always known
  uint64_t budget = card_engine_budget(card.memory_bytes);
  if (p.has("gpu-memory")) budget = p.size_bytes("gpu-memory");
  if (p.has("gpu-tflops")) {
    if (card.bf16_tflops > 0) card.fp8_tflops *= p.number("gpu-tflops") / card.bf16_tflops;
    card.bf16_tflops = p.number("gpu-tflops");
    card.gemm_peak_tflops = 0, card.gemm_peak_measured = false;  // its GEMM peak: the H100's share of the rate given
  }
  const MatmulMode matmul =
      p.str("matmul") == "fp8" ? (p.str("fp8-scaling") == "tensor" ? MatmulMode::fp8_tensor : MatmulMode::fp8)
                               : MatmulMode::bf16;
  if (matmul == MatmulMode::bf16 && p.given_explicitly("fp8-scaling"))
    fail("[plan] --fp8-scaling applies to --matmul fp8 only; add --matmul fp8 or drop --fp8-scaling");
  if (p.has("gpu-fp8-tflops"))  // the rate as given
    card.fp8_tflops = p.number("gpu-fp8-tflops"), card.fp8_gain = 0, card.fp8_tensor_gain = 0;
  if (matmul == MatmulMode::fp8 && !card.fp8_path)
    fail("[plan] --matmul fp8: ramtrain runs its block-scaled FP8 projections on Hopper only (--gpu h100 or h200: "
         "cuBLASLt's 1x128/128x128 block scaling), and `train --matmul fp8` refuses ", card.name,
         card.fp8_tflops > 0 ? " (it has FP8 tensor cores, but cuBLASLt gives it per-tensor scales only): plan with "
                               "--fp8-scaling tensor, or --matmul bf16"
                             : " (no FP8 tensor cores): plan with --matmul bf16");
  if (matmul == MatmulMode::fp8_tensor && !card.fp8_tensor_path)
    fail("[plan] --matmul fp8 --fp8-scaling tensor: ", card.name,
         " has no FP8 tensor cores (sm_89 and newer have them: rtx4090, rtx5090, h100, h200), and `train` refuses "
         "it; plan with --matmul bf16");
  if (p.has("pcie-gbs")) card.pcie_gbs = p.number("pcie-gbs");
  if (p.given("gpu-memory") || p.given("gpu-tflops") || p.given("pcie-gbs") || p.given("gpu-fp8-tflops"))
    card.name += " (adjusted)";
  const uint64_t host_ram = p.size_bytes("host-ram");
  const double gparams = p.number("cpu-adamw-gparams");

  // ---- the engine options, as `ramtrain train` builds them (cli/train.cpp)
  CudaOptions co;
  co.max_gpu_memory = budget;
  co.slots = static_cast<int>(p.integer("slots"));
  co.fit_slots = !p.given("slots");
  co.resident = p.on("resident");
  co.delayed_update = p.on("delayed-update");
  co.grads = p.str("grads");
  co.clipping = p.number("clip") > 0;
  co.checkpoints = p.str("checkpoints");
  co.layer_major = p.str("layer-major");
  co.master = p.str("master");
  co.muon = p.str("optimizer").rfind("muon", 0) == 0;  // whole-unit updates, NS5 workspace
  co.micro_batches = K;
  co.keep_activations = p.str("keep-activations") == "auto" ? -1 : p.integer("keep-activations");
  co.keep_attention = p.str("keep-attention") == "auto" ? -1 : p.integer("keep-attention");
  co.verbose = false;
  if (p.on("low-memory")) set_low_memory(co);
  DevicePlan dp = fit_device_plan(spec, B, T, co, budget);
  // As the engine does (make_cuda_backend, HostBudgetError): when the host
  // cannot pin the block inputs of every micro-batch beside the state,
  // layer-major left at auto falls back to micro-batch-major.
  bool host_fallback = false;
  const std::string master = co.master, opt = p.str("optimizer");
  const bool muon = opt.rfind("muon", 0) == 0;
  const UpdateRule rule = muon ? UpdateRule::muon : UpdateRule::adamw;
  const MasterStorage storage = master == "fp32" ? MasterStorage::fp32
                                : master == "bf16-sr"    ? MasterStorage::bf16_sr
                                : master == "bf16-kahan" ? MasterStorage::bf16_kahan
                                                         : MasterStorage::split;
  const MomentStorage moments = opt == "adamw8bit" || opt == "muon8bit"   ? MomentStorage::q8
                                : opt == "adamw4bit" || opt == "muon4bit" ? MomentStorage::q4
                                                                          : MomentStorage::fp32;
  const int ranks = static_cast<int>(p.integer("nproc-per-node"));
  if (ranks > 1 && K % ranks != 0)
    fail("[plan] --grad-accum ", K, " is not a multiple of --nproc-per-node ", ranks,
         ": the ranks share the step's micro-batches, as train runs them (and refuses this); use --grad-accum ",
         ranks * ((K + ranks - 1) / ranks));
  if (ranks > 1 && (opt != "adamw" || (master != "auto" && master != "fp32" && master != "split")))
    fail("[plan] --nproc-per-node ", ranks, " plans the sharded fp32 state (fp32 master + AdamW moments), as train's "
         "--nproc-per-node runs it; drop --optimizer ", opt, master == "auto" ? "" : " / --master " + master,
         " or plan one rank");
  const std::vector<int64_t> unit_numel = unit_numels(spec);
  // host gradient arenas: every unit's (host), the host embedding's only (fold), none (device)
  auto host_grad_bytes = [&](const DevicePlacement& q) -> uint64_t {
    uint64_t n = 0;
    for (size_t u = 0; u < unit_numel.size(); ++u)
      if (q.host_grads && (!q.fold || (u == 0 && q.host_embed))) n += static_cast<uint64_t>(unit_numel[u]);
    return 4 * n;
  };
  // the state tier (engine/tier_plan.h) pages the state: it takes --max-host-memory of RAM, or what is left
  const bool tiered = p.has("state-dir") || p.has("max-host-memory");
  if (co.layer_major == "auto" && dp.place.layer_major && dp.place.host_ckpt) {
    const uint64_t state_ram =
        !tiered ? HostState::planned_bytes(spec, storage, co.delayed_update ? 2 : 1, false, moments, rule)
        : p.has("max-host-memory") ? p.size_bytes("max-host-memory")
                                   : 0;
    const uint64_t need = state_ram +
                          host_grad_bytes(dp.place) + host_checkpoint_bytes(spec, B, T, dp.place) +
                          gradient_landing_bytes(spec, dp.place, co) +
                          static_cast<uint64_t>(24 * K * B * T);
    if (need + kHostReserveBytes > host_ram) {
      if (co.grads == "fold") {  // fold needs layer-major with K > 1: say why it cannot stay on
        // The pinned block inputs are (L + 1) x tokens per step x hidden x 2 B, however the step is split,
        // so what helps is fewer tokens per step (the most micro-batches of B that fit), host gradients or RAM.
        const uint64_t ck = host_checkpoint_bytes(spec, B, T, dp.place);
        const uint64_t per_set = ck / static_cast<uint64_t>(K) + static_cast<uint64_t>(24 * B * T);
        const uint64_t rest = need - ck - static_cast<uint64_t>(24 * K * B * T);
        const int64_t k_fit = host_ram > rest + kHostReserveBytes
                                  ? static_cast<int64_t>((host_ram - rest - kHostReserveBytes) / per_set)
                                  : 0;
        fail("[plan] --grads fold with ", K, " micro-batches needs layer-major, which pins the block inputs of all ",
             K, " (", gib(static_cast<double>(ck)), ": every layer's input for every token of the step), more than "
             "the host RAM left allows: ",
             k_fit >= 2 ? cat("fewer tokens per step (--grad-accum ", std::min<int64_t>(k_fit, K - 1),
                              " or less at --micro-batch ", B, "), ")
                        : std::string(),
             "--grads host (micro-batch-major: the inputs of one micro-batch), or more --host-ram");
      }
      co.layer_major = "off";
      dp = fit_device_plan(spec, B, T, co, budget);
      host_fallback = true;
    }
  }
  const DevicePlacement& pl = dp.place;

  // ---- host RAM, per item (HostState::planned_bytes is the total the engine holds)
  const int shadows = co.delayed_update ? 2 : 1;
  const uint64_t no_grads = HostState::planned_bytes(spec, storage, shadows, false, moments, rule);
  const uint64_t bare = HostState::planned_bytes(spec, storage, 0, false, moments, rule);
  uint64_t numel = 0;
  for (int64_t n : unit_numels(spec)) numel += static_cast<uint64_t>(n);
  const uint64_t mom = HostState::planned_bytes(spec, MasterStorage::fp32, 0, false, moments, rule) - 4 * numel;
  // m covers every element; v (Muon: the non-matrix tensors' only) the rest
  const uint64_t mom_m = (HostState::planned_bytes(spec, MasterStorage::fp32, 0, false, moments) - 4 * numel) / 2;
  const std::string mom_kind = moments == MomentStorage::fp32 ? "fp32"
                               : moments == MomentStorage::q8 ? "8-bit codes + an fp32 absmax per 256"
                                                              : "4-bit codes + an fp32 absmax per 256";
  std::vector<HostItem> host;
  host.push_back({storage == MasterStorage::split ? "master remainder + tie bits (split; upper half = the shadow)"
                  : storage == MasterStorage::bf16_kahan ? "bf16 Kahan compensation (bf16-kahan; master = the shadow)"
                  : storage == MasterStorage::bf16_sr    ? "master: the bf16 shadow itself (bf16-sr)"
                                                         : "fp32 master",
                  bare - mom});
  host.push_back({(muon ? "Adam m / Muon momentum (" : "Adam m (") + mom_kind + ")", mom_m});
  host.push_back({(muon ? "Adam v, none for Muon matrices (" : "Adam v (") + mom_kind + ")", mom - mom_m});
  host.push_back({shadows == 2 ? "pinned bf16 shadows (2: delayed update)" : "pinned bf16 shadow", no_grads - bare});
  host.push_back({pl.fold ? "host gradients (fp32; fold: the host embedding's only)" : "host gradients (fp32)",
                  host_grad_bytes(pl)});
  host.push_back({"pinned block checkpoints", host_checkpoint_bytes(spec, B, T, pl)});
  host.push_back({landing_item(spec, pl, co), gradient_landing_bytes(spec, pl, co)});
  if (muon) {  // engine/cuda/muon_gpu.h: per lane, U (fp32) in and O (bf16) out of the matrix in flight
    host.push_back({"pinned Muon Newton-Schulz staging (fp32 U in, bf16 O out; a lane each of the largest matrix)",
                    muon_pinned_bytes(spec)});
    host.push_back({moments != MomentStorage::fp32 ? "Muon update scratch (a decoded master; m, v windows)"
                    : storage != MasterStorage::fp32 ? "Muon update scratch (decoded master; largest matrix)"
                                                     : "Muon update scratch (none: U and O are in the staging)",
                    muon_scratch_bytes(spec, storage != MasterStorage::fp32, moments != MomentStorage::fp32,
                                       /*pipelined=*/true)});
  }
  // the step's token batches (ids, targets, positions) and their pinned staging: 12 B/token each
  host.push_back({"token batches and staging", static_cast<uint64_t>(24 * K * B * T)});
  uint64_t host_total = 0;
  for (const HostItem& h : host) host_total += h.bytes;
  const uint64_t host_usable = host_ram > kHostReserveBytes ? host_ram - kHostReserveBytes : 0;
  // the state tier: the state items (the first five) become RAM + SSD
  RunTierPlan tier;
  uint64_t tier_budget = 0;
  if (tiered) {
    std::vector<uint64_t> grad_bytes(unit_numel.size());
    for (size_t u = 0; u < unit_numel.size(); ++u)
      if (pl.host_grads && (!pl.fold || (u == 0 && pl.host_embed)))
        grad_bytes[u] = 4 * static_cast<uint64_t>(unit_numel[u]);
    uint64_t others = host_total;
    for (size_t i = 0; i < 5; ++i) others -= host[i].bytes;
    tier_budget = p.has("max-host-memory") ? p.size_bytes("max-host-memory")
                                           : std::max<uint64_t>(host_usable > others ? host_usable - others : 0, 1);
    tier = plan_run_tier(spec, storage, shadows, moments, rule, grad_bytes, tier_budget, p.number("ssd-gbs"),
                         pl.slots >= spec.n_layers);
    host_total = others + tier.place.ram();
  }
  const bool host_fits = host_total <= host_usable && tier.fits;
  const double params = static_cast<double>(spec.params_total());
  // one checkpoint on disk: the state as held (a split master's file is fp32, a bf16 master's bf16)
  const uint64_t ckpt_bytes = checkpoint_bytes_estimate(spec, moments, storage, rule);

  const StepPrediction sp = predict_step(spec, B, T, dp, card, gparams, matmul);
  // data parallel (issue 22's layout): each rank's host bytes, and the host's ranks together
  uint64_t dp_rank_max = 0, dp_host = 0;
  for (int r = 0; r < ranks && ranks > 1; ++r) {
    const uint64_t b = dp_rank_host_bytes(spec, ranks, r, 2, /*grad_slices=*/false);  // a GPU rank (CudaOptions::dp)
    dp_rank_max = std::max(dp_rank_max, b);
    dp_host += b;
  }
  const bool dp_fits = dp_host <= host_usable;

  // ---- what to change
  std::vector<std::string> fixes;
  if (!dp.fits()) {
    // The largest micro-batch that fits, by bisection (the device plan grows
    // with the micro-batch; a linear search took minutes at --micro-batch 10^5).
    auto fits_at = [&](int64_t b) {
      CudaOptions o = co;
      o.micro_batches = (K * B + b - 1) / b;
      return fit_device_plan(spec, b, T, o, budget).fits();
    };
    int64_t fit_b = 0;
    if (B > 1 && fits_at(1)) {
      int64_t lo = 1, hi = B - 1;  // fits_at(lo); the answer is in [lo, hi]
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (fits_at(mid))
          lo = mid;
        else
          hi = mid - 1;
      }
      fit_b = lo;
    }
    std::string f = "the device plan needs " + gib(static_cast<double>(dp.total)) + " of the " +
                    gib(static_cast<double>(budget)) + " budget even at its smallest: ";
    if (fit_b)
      f += "use --micro-batch " + std::to_string(fit_b) + " --grad-accum " +
           std::to_string((K * B + fit_b - 1) / fit_b) + " (about the same tokens per step)";
    else
      f += "lower --seq-len, or a card with " + gib(static_cast<double>(dp.total)) + " or more for the engine";
    fixes.push_back(f);
  }
  if (tiered && !tier.fits)
    fixes.push_back(
        "the state tier needs " + gib(static_cast<double>(tier.place.min_bytes)) +
        " of RAM even with the weights on the SSD (gradients and three units in flight): --max-host-memory " +
        fmt("%.0fG", static_cast<double>(tier.place.min_bytes) / GiB + 0.999) +
        " or more, on a host with that much usable");
  if (!host_fits && (!tiered || tier.fits)) {
    const double over = static_cast<double>(host_total - host_usable);
    fixes.push_back("host RAM: needs " + gib(static_cast<double>(host_total)) + " of ~" +
                    gib(static_cast<double>(host_usable)) + " usable (" + gib(over) + " over): --host-ram " +
                    fmt("%.0fG", (static_cast<double>(host_total + kHostReserveBytes)) / GiB + 0.999) + " or more");
    if (storage == MasterStorage::fp32)
      fixes.push_back("--master split saves " + gib(1.875 * static_cast<double>(numel)) + " (bit-identical results)");
    if (moments != MomentStorage::q4)
      fixes.push_back(
          std::string("--optimizer ") + (moments == MomentStorage::fp32 ? "adamw8bit" : "adamw4bit") + " saves " +
          gib(static_cast<double>(mom) -
              moment_bytes_per_param(moments == MomentStorage::fp32 ? MomentStorage::q8 : MomentStorage::q4) *
                  static_cast<double>(numel)) +
          " (quantized Adam moments; changes the results slightly, docs/lean_state.md)");
    if (pl.host_grads && !pl.fold)
      fixes.push_back("--grads fold drops the host gradients (" + gib(4.0 * static_cast<double>(numel)) +
                      "): each layer updates as its gradient lands" +
                      (K > 1 && !pl.layer_major ? std::string(" (needs --layer-major on with --grad-accum > 1)")
                                                : std::string("")) +
                      "; with --clip 0 the results are the same, with clipping each layer is clipped by the norm "
                      "landed up to it (docs/small_gpu.md)");
    if (pl.host_grads && !pl.fold) {
      CudaOptions o = co;
      o.grads = "device";
      o.fit = false;
      const DevicePlan d = plan_device(spec, B, T, o, budget);
      fixes.push_back(std::string("host gradients take ") + gib(4.0 * static_cast<double>(numel)) +
                      (d.fits() ? ": --grads device fits this card and frees them"
                                : ": they leave the host only on a card with " + gib(static_cast<double>(d.total)) +
                                      " for the engine (--grads device)"));
    }
    if (pl.host_grads && muon) {  // Muon lands whole units; AdamW lands a unit larger than a layer in pieces
      CudaOptions a = co;
      a.muon = false;
      const uint64_t pieces = gradient_landing_bytes(spec, pl, a);
      if (pieces < host[6].bytes)
        fixes.push_back("Muon updates whole units, so its pinned gradient landing is 3 slabs of the largest unit (" +
                        gib(static_cast<double>(host[6].bytes)) + "); AdamW (--optimizer " +
                        std::string(optimizer_name(UpdateRule::adamw, moments)) +
                        ") lands the LM head in layer-sized pieces: " + gib(static_cast<double>(pieces)));
    }
    if (pl.host_ckpt && pl.layer_major)
      fixes.push_back("the pinned checkpoints of all " + std::to_string(K) + " micro-batches take " +
                      gib(static_cast<double>(host[5].bytes)) + ": --layer-major off keeps one micro-batch's (" +
                      gib(static_cast<double>(host[5].bytes) / static_cast<double>(K)) +
                      ") but moves the weights once per micro-batch");
    else if (pl.host_ckpt && host[5].bytes > host_total / 10)
      fixes.push_back("the pinned checkpoints take " + gib(static_cast<double>(host[5].bytes)) +
                      ": fewer tokens per micro-batch or per step (--micro-batch, --grad-accum)");
  }
  if (host_fallback && pl.host_grads && !pl.fold)
    fixes.push_back("layer-major fell back to micro-batch-major for host RAM: --grads fold drops the " +
                    gib(4.0 * static_cast<double>(numel)) +
                    " of host gradients, so the pinned block inputs of every micro-batch fit (the clipping rule "
                    "differs only on clipped steps: docs/small_gpu.md)");
  if (dp.fits() && host_fits) {
    if (sp.binding == std::string("optimizer") && !co.delayed_update && !pl.host_grads)
      fixes.push_back("the CPU optimizer shows for " + fmt("%.2f s", sp.optimizer_exposed_s) +
                      " per step: --delayed-update hides it under the whole step (one step stale)");
    else if (sp.binding == std::string("optimizer"))
      fixes.push_back("the CPU optimizer shows for " + fmt("%.2f s", sp.optimizer_exposed_s) +
                      " per step: more tokens per step (--grad-accum) spread it over more compute");
    if (sp.binding == std::string("copies") && K > 1 && !pl.layer_major)
      fixes.push_back("the copies bind: --layer-major on moves the weights once per step, not once per micro-batch");
    else if (sp.binding == std::string("copies"))
      fixes.push_back(
          "the copies bind: more tokens per micro-batch or per step (--micro-batch, --grad-accum) "
          "spread them over more compute");
  }

  // ---- report
  const char* mode = co.resident ? "resident" : "streaming";
  if (p.on("json")) {
    std::string j = "{\"fits\":" + std::string(dp.fits() && host_fits ? "true" : "false");
    j += ",\"model\":" + json_str(model_name) + ",\"params\":" + fmt("%.0f", params) +
         ",\"layers\":" + std::to_string(spec.n_layers) + ",\"seq_len\":" + std::to_string(T) +
         ",\"micro_batch\":" + std::to_string(B) + ",\"grad_accum\":" + std::to_string(K) +
         ",\"tokens_per_step\":" + std::to_string(K * B * T);
    // MoE: the parameters one token uses (router + top-k experts per layer)
    j += ",\"active_params\":" + fmt("%.0f", static_cast<double>(spec.params_active()));
    j += ",\"card\":{\"name\":" + json_str(card.name) + ",\"budget_bytes\":" + std::to_string(budget) +
         ",\"bf16_tflops\":" + fmt("%g", card.bf16_tflops) + ",\"fp8_tflops\":" + fmt("%g", card.fp8_tflops) +
         ",\"pcie_gbs\":" + fmt("%g", card.pcie_gbs) + "}";
    const double fp8_gain = matmul == MatmulMode::fp8_tensor ? card.fp8_tensor_gain
                            : matmul == MatmulMode::fp8      ? card.fp8_gain
                                                             : 0.0;
    j += ",\"matmul\":" + json_str(p.str("matmul")) +
         ",\"fp8_scaling\":" + json_str(matmul == MatmulMode::bf16 ? "none" : p.str("fp8-scaling")) +
         ",\"fp8_gain\":" + fmt("%.4g", fp8_gain) +
         ",\"fp8_gain_estimated\":" + (matmul == MatmulMode::fp8_tensor && fp8_gain > 0 ? "true" : "false") +
         ",\"fp8_flops_per_token\":" + fmt("%.6g", sp.fp8_flops_per_token);
    j += ",\"host\":{\"ram_bytes\":" + std::to_string(host_ram) + ",\"usable_bytes\":" + std::to_string(host_usable) +
         ",\"needed_bytes\":" + std::to_string(host_total) +
         ",\"bytes_per_param\":" + fmt("%.4f", static_cast<double>(host_total) / params) +
         ",\"fits\":" + (host_fits ? "true" : "false") + ",\"checkpoint_bytes\":" + std::to_string(ckpt_bytes) +
         ",\"items\":[";
    for (size_t i = 0; i < host.size(); ++i)
      j += std::string(i ? "," : "") + "{\"what\":" + json_str(host[i].what) +
           ",\"bytes\":" + std::to_string(host[i].bytes) + "}";
    j += "]}";
    if (tiered)
      j += ",\"tier\":{\"fits\":" + std::string(tier.fits ? "true" : "false") +
           ",\"budget_bytes\":" + std::to_string(tier_budget) + ",\"ram_bytes\":" + std::to_string(tier.place.ram()) +
           ",\"resident_bytes\":" + std::to_string(tier.place.resident) +
           ",\"kept_bytes\":" + std::to_string(tier.place.kept) +
           ",\"slot_bytes\":" + std::to_string(tier.place.slots) +
           ",\"min_bytes\":" + std::to_string(tier.place.min_bytes) +
           ",\"ssd_bytes\":" + std::to_string(tier.place.file_bytes) +
           ",\"ssd_state_bytes\":" + std::to_string(tier.state_file) +
           ",\"ssd_weight_bytes\":" + std::to_string(tier.weights_file) +
           ",\"weights_paged\":" + (tier.weights_paged ? "true" : "false") +
           ",\"device_resident\":" + (tier.device_resident ? "true" : "false") +
           ",\"min_bytes_resident_weights\":" + std::to_string(tier.place.min_bytes_resident_weights) +
           ",\"units_paged\":" + std::to_string(tier.place.n_paged()) +
           ",\"units\":" + std::to_string(tier.place.paged.size()) +
           ",\"read_bytes_per_step\":" + std::to_string(tier.read_bytes) +
           ",\"write_bytes_per_step\":" + std::to_string(tier.write_bytes) +
           ",\"ssd_gbs\":" + fmt("%g", p.number("ssd-gbs")) + ",\"ssd_s\":" + fmt("%.6g", tier.ssd_s) +
           ",\"ssd_binds\":" + (tier.ssd_s > sp.step_s ? "true" : "false") +
           ",\"step_s\":" + fmt("%.6g", std::max(sp.step_s, tier.ssd_s)) +
           ",\"tokens_per_s\":" + fmt("%.6g", static_cast<double>(K * B * T) / std::max(sp.step_s, tier.ssd_s)) + "}";
    if (ranks > 1)
      j += ",\"data_parallel\":{\"ranks\":" + std::to_string(ranks) +
           ",\"rank_bytes_max\":" + std::to_string(dp_rank_max) + ",\"host_bytes\":" + std::to_string(dp_host) +
           ",\"fits\":" + (dp_fits ? "true" : "false") + "}";
    j += ",\"device\":{\"fits\":" + std::string(dp.fits() ? "true" : "false") +
         ",\"total_bytes\":" + std::to_string(dp.total) + ",\"budget_bytes\":" + std::to_string(dp.budget) +
         ",\"mode\":" + json_str(mode) + ",\"slots\":" + std::to_string(pl.slots) +
         ",\"host_grads\":" + (pl.host_grads ? "true" : "false") + ",\"fold\":" + (pl.fold ? "true" : "false") +
         ",\"host_checkpoints\":" + (pl.host_ckpt ? "true" : "false") +
         ",\"host_embedding\":" + (pl.host_embed ? "true" : "false") +
         ",\"layer_major\":" + (pl.layer_major ? "true" : "false") +
         ",\"kept_layers\":" + std::to_string(dp.kept_layers) +
         ",\"attn_kept_layers\":" + std::to_string(dp.attn_kept_layers) + ",\"changes\":[";
    for (size_t i = 0; i < dp.changes.size(); ++i) j += std::string(i ? "," : "") + json_str(dp.changes[i]);
    j += "],\"items\":[";
    for (size_t i = 0; i < dp.items.size(); ++i)
      j += std::string(i ? "," : "") + "{\"what\":" + json_str(dp.items[i].what) +
           ",\"bytes\":" + std::to_string(dp.items[i].bytes) + ",\"count\":" + std::to_string(dp.items[i].count) + "}";
    j += "]}";
    j += ",\"step\":{\"compute_s\":" + fmt("%.6g", sp.compute_s) + ",\"copies_s\":" + fmt("%.6g", sp.copies_s) +
         ",\"h2d_bytes\":" + fmt("%.0f", sp.h2d_bytes) + ",\"d2h_bytes\":" + fmt("%.0f", sp.d2h_bytes) +
         ",\"optimizer_s\":" + fmt("%.6g", sp.optimizer_s) + ",\"optimizer_overlap_s\":" + fmt("%.6g", sp.overlap_s) +
         ",\"optimizer_exposed_s\":" + fmt("%.6g", sp.optimizer_exposed_s) + ",\"step_s\":" + fmt("%.6g", sp.step_s) +
         ",\"binding\":" + json_str(sp.binding) + ",\"tokens_per_s\":" + fmt("%.6g", sp.tokens_per_s) +
         ",\"model_tflops\":" + fmt("%.6g", sp.model_tflops) + ",\"gpu_idle\":" + fmt("%.4f", sp.gpu_idle) +
         ",\"model_flops_per_token\":" + fmt("%.6g", sp.model_flops_per_token) +
         ",\"hardware_flops_per_token\":" + fmt("%.6g", sp.hardware_flops_per_token) +
         ",\"efficiency\":" + fmt("%g", sp.efficiency) + ",\"gemm_peak_tflops\":" + fmt("%g", sp.gemm_peak_tflops) +
         "}";
    j += ",\"fixes\":[";
    for (size_t i = 0; i < fixes.size(); ++i) j += std::string(i ? "," : "") + json_str(fixes[i]);
    j += "]}";
    std::printf("%s\n", j.c_str());
  } else {
    std::printf(
        "model: %s, %s params, %lld layers; %lld x %lld tokens per micro-batch, %lld micro-batch%s "
        "per step (%lld tokens)\n",
        model_name.c_str(), (params >= 1e9 ? fmt("%.3fB", params / 1e9) : fmt("%.2fM", params / 1e6)).c_str(),
        (long long)spec.n_layers, (long long)B, (long long)T, (long long)K, K == 1 ? "" : "es", (long long)(K * B * T));
    if (muon)
      std::printf(
          "--optimizer %s: Muon's Newton-Schulz runs on the GPU, pipelined with the CPU optimizer (two "
          "matrices in flight: U in as fp32, 4 B/element, O out as bf16, 2 B; the norm on the GPU; its workspace "
          "is in the device plan); gradients reach the optimizer whole (--grads host or fold). The step "
          "prediction counts AdamW's rate for every parameter on the CPU and NS5's FLOPs on the GPU at the "
          "rate measured for it on the H200 (728 TFLOP/s per layer: 0.868 of the GEMM peak; a 7B model: 526 "
          "TFLOP per step, 0.72 s there)\n",
          opt.c_str());
    if (spec.is_moe())
      std::printf(
          "mixture of experts: %lld experts, top %lld per token; %.3fB parameters active per token. The plan "
          "below streams every expert with its layer; the op scratch holds every expert's rows of a micro-batch\n",
          (long long)spec.moe.n_experts, (long long)spec.moe.top_k, static_cast<double>(spec.params_active()) / 1e9);
    std::printf("card: %s, engine budget %s, %.1f bf16 TFLOP/s, PCIe %.0f GB/s; host: %s RAM, AdamW %.2f Gparam/s\n",
                card.name.c_str(), gib(static_cast<double>(budget)).c_str(), card.bf16_tflops, card.pcie_gbs,
                gib(static_cast<double>(host_ram)).c_str(), gparams);
    if (matmul == MatmulMode::fp8_tensor) {
      const double share = 100.0 * sp.fp8_flops_per_token / sp.hardware_flops_per_token;
      if (card.fp8_tensor_gain > 0)
        std::printf(
            "matmul fp8, per-tensor scales: the projections' %.0f%% of the step's FLOPs at %.2fx the bf16 rate, an "
            "ESTIMATE (not measured yet: the per-tensor GEMM's 1.75x on the H100 less the quantizers' bytes at "
            "%.2f TB/s, step_model.cpp; not the datasheet's %.0f FP8 TFLOP/s); their workspace is not counted\n",
            share, card.fp8_tensor_gain, card.memory_tbs, card.fp8_tflops);
      else
        std::printf(
            "matmul fp8, per-tensor scales: the projections' %.0f%% of the step's FLOPs at %.0f FP8 TFLOP/s "
            "(--gpu-fp8-tflops, the same efficiency as bf16); their workspace is not counted\n",
            share, card.fp8_tflops);
    }
    if (matmul == MatmulMode::fp8) {
      const double share = 100.0 * sp.fp8_flops_per_token / sp.hardware_flops_per_token;
      if (card.fp8_gain > 0)
        std::printf(
            "matmul fp8: the projections' %.0f%% of the step's FLOPs at %.2fx the bf16 rate (GEMMs + "
            "quantizers, measured on the H100: bench/RESULTS.md; not the datasheet's %.0f FP8 TFLOP/s); "
            "their workspace is not counted\n",
            share, card.fp8_gain, card.fp8_tflops);
      else
        std::printf(
            "matmul fp8: the projections' %.0f%% of the step's FLOPs at %.0f FP8 TFLOP/s (--gpu-fp8-tflops, "
            "the same efficiency as bf16); their workspace is not counted\n",
            share, card.fp8_tflops);
    }
    std::printf("\nhost RAM%s: %s, %.3f B/param (~%s usable)%s\n",
                tiered ? " with the state tier (the master, moments, shadows and gradients below are split between RAM "
                         "and the SSD)"
                       : "",
                gib(static_cast<double>(host_total)).c_str(), static_cast<double>(host_total) / params,
                gib(static_cast<double>(host_usable)).c_str(), host_fits ? "" : ": DOES NOT FIT");
    for (const HostItem& h : host)
      if (h.bytes)
        std::printf("  %-62s %10s %7.3f B/param\n", h.what.c_str(), gib(static_cast<double>(h.bytes)).c_str(),
                    static_cast<double>(h.bytes) / params);
    if (tiered) {
      std::printf(
          "state tier (--max-host-memory %s, SSD %.1f GB/s): the state items above take RAM %s = %s %s + units kept "
          "in RAM %s + 3 units in flight %s%s\n",
          gib(static_cast<double>(tier_budget)).c_str(), p.number("ssd-gbs"),
          gib(static_cast<double>(tier.place.ram())).c_str(),
          tier.weights_paged ? "gradients" : "bf16 weights and gradients",
          gib(static_cast<double>(tier.place.resident)).c_str(), gib(static_cast<double>(tier.place.kept)).c_str(),
          gib(static_cast<double>(tier.place.slots)).c_str(),
          tier.fits
              ? ""
              : cat(": DOES NOT FIT (the minimum is ", gib(static_cast<double>(tier.place.min_bytes)), ")").c_str());
      std::printf("  SSD %s: the optimizer state of %d of %zu units %s%s%s\n",
                  gib(static_cast<double>(tier.place.file_bytes)).c_str(), tier.place.n_paged(),
                  tier.place.paged.size(), gib(static_cast<double>(tier.state_file)).c_str(),
                  tier.weights_paged ? ", and their bf16 weights " : "",
                  tier.weights_paged ? gib(static_cast<double>(tier.weights_file)).c_str() : "");
      std::printf(
          "  SSD traffic per step: %.1f GB read + %.1f GB written = %.2f s at %.1f GB/s, %s the %.2f s step: "
          "%s%s\n",
          static_cast<double>(tier.read_bytes) / 1e9, static_cast<double>(tier.write_bytes) / 1e9, tier.ssd_s,
          p.number("ssd-gbs"), tier.ssd_s > sp.step_s ? "above" : "under", sp.step_s,
          tier.ssd_s > sp.step_s ? "the SSD binds: " : "the SSD does not bind: ",
          fmt("%.0f tokens/s", static_cast<double>(K * B * T) / std::max(sp.step_s, tier.ssd_s)).c_str());
      if (tier.weights_paged && tier.device_resident)
        std::printf(
            "  (weights on the SSD: every layer held on the device, so each paged unit's weights are read and "
            "written once a step with its state, and sent to the device once, after its update)\n");
      else if (tier.weights_paged)
        std::printf(
            "  (weights on the SSD: read ahead of the forward, the backward and the update, written after it; not "
            "built: the engine refuses it, as it pages the weights only with every layer on the device "
            "(--resident); or give --max-host-memory %s to keep them in RAM)\n",
            fmt("%.0fG", static_cast<double>(tier.place.min_bytes_resident_weights) / GiB + 0.999).c_str());
    }
    std::printf(
        "checkpoint (--save-every, --out): %s on disk per save, %.3f B/param (the state as held: %s master, "
        "%s moments)\n",
        gib(static_cast<double>(ckpt_bytes)).c_str(), static_cast<double>(ckpt_bytes) / params,
        master_is_bf16(storage) ? "bf16" : "fp32", opt.c_str());
    if (ranks > 1)
      std::printf(
          "data parallel, %d ranks on this host (the optimizer state sharded over them, docs/multi_gpu.md): up to "
          "%s per rank, %.3f B/param (fp32 master + Adam 12/N, the whole bf16 weights 2; a fresh run starts from "
          "5.2 B/param and keeps its slices unit by unit, a resume loads the checkpoint's 12 first); the %d ranks "
          "together %s%s\n",
          ranks, gib(static_cast<double>(dp_rank_max)).c_str(), static_cast<double>(dp_rank_max) / params, ranks,
          gib(static_cast<double>(dp_host)).c_str(), dp_fits ? "" : ": DOES NOT FIT");
    std::printf(
        "\ndevice plan: %s, %d weight slot%s, gradients on %s, checkpoints on %s, embedding on %s, %s, "
        "activations of %lld of %lld layers kept, the attention half of %lld more (selective recompute)\n",
        mode, pl.slots, pl.slots == 1 ? "" : "s",
        pl.fold         ? (muon && co.grads == "auto" ? "host (folded into the update as they land: Muon needs whole "
                                                         "gradients)"
                                                       : "host (folded into the update as they land)")
        : pl.host_grads ? (muon && co.grads == "auto" ? "host (Muon needs whole gradients)" : "host")
                        : "device",
        pl.host_ckpt ? "host" : "device",
        pl.host_embed ? "host" : "device", pl.layer_major ? "layer-major" : "micro-batch-major",
        (long long)dp.kept_layers, (long long)spec.n_layers, (long long)dp.attn_kept_layers);
    if (host_fallback)
      std::printf("  micro-batch-major: the host cannot pin the block inputs of all %lld micro-batches (layer-major)\n",
                  (long long)K);
    for (const std::string& c : dp.changes) std::printf("  shrunk to fit: %s\n", c.c_str());
    std::printf("  device memory %s of %s budget%s\n", gib(static_cast<double>(dp.total)).c_str(),
                gib(static_cast<double>(dp.budget)).c_str(), dp.fits() ? "" : ": DOES NOT FIT");
    if (muon) {  // one of the items above (engine/cuda/muon_gpu.h)
      uint64_t ws = 0;
      for (const DevicePlanItem& it : dp.items)
        if (it.what.rfind("Muon Newton-Schulz", 0) == 0) ws += it.bytes;
      const MuonMatrixDims md = muon_matrix_dims(spec);
      std::printf("  of which the Muon Newton-Schulz workspace %s (2 lanes: U in fp32 and X in bf16 of %lld "
                  "elements, A and B of %lld^2 in bf16)\n",
                  gib(static_cast<double>(ws)).c_str(), (long long)md.max_numel, (long long)md.max_small);
      const MuonStepWork ns = muon_step_work(spec);
      std::printf("  Muon's Newton-Schulz: %.1f TFLOP per step on the GPU (%.2f s, in the compute below: it shares "
                  "the device with the step) + %.2f GB of copies (fp32 in, bf16 out, in the copies below)\n",
                  ns.flops / 1e12, sp.ns5_s, ns.bytes / 1e9);
    }
    std::printf(
        "\npredicted step: %.3f s = max(compute %.3f s, copies %.3f s) + optimizer exposed %.3f s "
        "(CPU AdamW %.3f s, %.3f s of it under the %s)\n",
        sp.step_s, sp.compute_s, sp.copies_s, sp.optimizer_exposed_s, sp.optimizer_s,
        std::min(sp.optimizer_s, sp.overlap_s),
        co.delayed_update ? "whole step"
        : pl.fold         ? "backward and the next forward"
                          : "next forward");
    if (pl.host_grads && !co.delayed_update)
      std::printf("  (host gradients: the optimizer is modelled as not overlapping, as measured on the H200)\n");
    std::printf("  binding: %s; copies %.1f GB in + %.1f GB out; %.0f tokens/s, %.1f model TFLOP/s, GPU idle %.0f%%\n",
                sp.binding.c_str(), sp.h2d_bytes / 1e9, sp.d2h_bytes / 1e9, sp.tokens_per_s, sp.model_tflops,
                100 * sp.gpu_idle);
    std::printf(
        "  FLOPs/token: model %.2f G, hardware %.2f G (recomputed layers); kernels at %.1f%% of the "
        "datasheet rate = %.1f%% of the card's bf16 GEMM peak, %.0f TFLOP/s (%s; the share calibrated on the "
        "H200)\n",
        sp.model_flops_per_token / 1e9, sp.hardware_flops_per_token / 1e9, 100 * sp.efficiency,
        100 * sp.efficiency * card.bf16_tflops / sp.gemm_peak_tflops, sp.gemm_peak_tflops,
        card.gemm_peak_measured ? "measured" : "not measured: the H100's share of the datasheet");
    if (!fixes.empty()) std::printf("\nto change:\n");
    for (const std::string& f : fixes) std::printf("  - %s\n", f.c_str());
  }
  std::fflush(stdout);
  if (!dp.fits() || !host_fits)
    fail("[plan] this run would be refused: ", fixes.empty() ? std::string("see above") : fixes.front());
  return 0;
}

}  // namespace rt::cli
