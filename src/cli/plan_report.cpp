// ramtrain plan's text report, section by section: the model, the card and
// the host; host RAM per item (with the state tier, the checkpoint on disk and
// data parallel's ranks); the device plan; the predicted step and what to
// change. Prints to stdout and decides nothing: every number comes from the
// stages of cli/plan.h.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cli/plan.h"
#include "core/error.h"

namespace rt::cli {

namespace {

// The model, the card beside the host, and the share of --matmul fp8.
void report_machine(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const ModelSpec& spec = o.spec;
  const int64_t T = o.seq_len, B = o.micro_batch, K = o.grad_accum;
  const CardSpec& card = plan.machine.card;
  const StepPrediction& sp = plan.step;
  const double params = static_cast<double>(spec.params_total());
  std::printf(
      "model: %s, %s params, %lld layers; %lld x %lld tokens per micro-batch, %lld micro-batch%s "
      "per step (%lld tokens)\n",
      o.model_name.c_str(), (params >= 1e9 ? fmt("%.3fB", params / 1e9) : fmt("%.2fM", params / 1e6)).c_str(),
      (long long)spec.n_layers, (long long)B, (long long)T, (long long)K, K == 1 ? "" : "es", (long long)(K * B * T));
  if (o.muon)
    std::printf(
        "--optimizer %s: Muon's Newton-Schulz runs on the GPU, pipelined with the CPU optimizer (two "
        "matrices in flight: U in as fp32, 4 B/element, O out as bf16, 2 B; the norm on the GPU; its workspace "
        "is in the device plan); gradients reach the optimizer whole (--grads host or fold). The step "
        "prediction counts AdamW's rate for every parameter on the CPU and NS5's FLOPs on the GPU at the "
        "rate measured for it on the H200 (728 TFLOP/s per layer: 0.868 of the GEMM peak; a 7B model: 526 "
        "TFLOP per step, 0.72 s there)\n",
        o.optimizer.c_str());
  if (spec.is_moe())
    std::printf(
        "mixture of experts: %lld experts, top %lld per token; %.3fB parameters active per token. The plan "
        "below streams every expert with its layer; the op scratch holds every expert's rows of a micro-batch\n",
        (long long)spec.moe.n_experts, (long long)spec.moe.top_k, static_cast<double>(spec.params_active()) / 1e9);
  std::printf("card: %s, engine budget %s, %.1f bf16 TFLOP/s, PCIe %.0f GB/s; host: %s RAM, AdamW %.2f Gparam/s\n",
              card.name.c_str(), gib(static_cast<double>(plan.machine.budget)).c_str(), card.bf16_tflops, card.pcie_gbs,
              gib(static_cast<double>(o.host_ram)).c_str(), o.gparams);
  if (plan.machine.matmul == MatmulMode::fp8_tensor) {
    const double share = 100.0 * sp.fp8_flops_per_token / sp.hardware_flops_per_token;
    if (card.fp8_tensor_gain > 0)
      std::printf(
          "matmul fp8, per-tensor scales: the projections' %.0f%% of the step's FLOPs at %.2fx the bf16 rate, %s "
          "(the per-tensor GEMM's 1.75x less the quantizers' bytes at %.2f TB/s, fitted on the H100's measured 7B "
          "step, step_model.cpp; not the datasheet's %.0f FP8 TFLOP/s); their workspace is not counted\n",
          share, card.fp8_tensor_gain, card.name == "h100" ? "as measured" : "an ESTIMATE for this card",
          card.memory_tbs, card.fp8_tflops);
    else
      std::printf(
          "matmul fp8, per-tensor scales: the projections' %.0f%% of the step's FLOPs at %.0f FP8 TFLOP/s "
          "(--gpu-fp8-tflops, the same efficiency as bf16); their workspace is not counted\n",
          share, card.fp8_tflops);
  }
  if (plan.machine.matmul == MatmulMode::fp8) {
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
}

// The state tier's RAM and SSD bytes and the SSD's traffic against the step.
void report_tier(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const RunTierPlan& tier = plan.host.tier;
  const StepPrediction& sp = plan.step;
  std::printf(
      "state tier (--max-host-memory %s, SSD %.1f GB/s): the state items above take RAM %s = %s %s + units kept "
      "in RAM %s + 3 units in flight %s%s\n",
      gib(static_cast<double>(plan.host.tier_budget)).c_str(), o.ssd_gbs,
      gib(static_cast<double>(tier.place.ram())).c_str(),
      tier.weights_paged ? "gradients" : "bf16 weights and gradients",
      gib(static_cast<double>(tier.place.resident)).c_str(), gib(static_cast<double>(tier.place.kept)).c_str(),
      gib(static_cast<double>(tier.place.slots)).c_str(),
      tier.fits ? ""
                : cat(": DOES NOT FIT (the minimum is ", gib(static_cast<double>(tier.place.min_bytes)), ")").c_str());
  std::printf("  SSD %s: the optimizer state of %d of %zu units %s%s%s\n",
              gib(static_cast<double>(tier.place.file_bytes)).c_str(), tier.place.n_paged(), tier.place.paged.size(),
              gib(static_cast<double>(tier.state_file)).c_str(), tier.weights_paged ? ", and their bf16 weights " : "",
              tier.weights_paged ? gib(static_cast<double>(tier.weights_file)).c_str() : "");
  const bool fold = plan.device.plan.place.fold;
  const double step_s = tier_step_s(tier, sp, fold);
  std::printf(
      "  SSD traffic per step: %.1f GB read + %.1f GB written = %.2f s at %.1f GB/s, while the update runs (%s "
      "%.2f s): %s%.2f s step, %s\n",
      static_cast<double>(tier.read_bytes) / 1e9, static_cast<double>(tier.write_bytes) / 1e9, tier.ssd_s, o.ssd_gbs,
      fold ? "in the backward, as gradients land; none in the forward of" : "a pass after the backward of",
      fold ? step_forward_s(sp) : sp.optimizer_s,
      step_s > sp.step_s ? "the SSD binds: " : "the SSD does not bind: ",
      step_s,
      fmt("%.0f tokens/s", static_cast<double>(o.grad_accum * o.micro_batch * o.seq_len) / step_s).c_str());
  if (tier.weights_paged && tier.device_resident)
    std::printf(
        "  (weights on the SSD: every layer held on the device, so each paged unit's weights are read and "
        "written once a step with its state, and sent to the device once, after its update)\n");
  else if (tier.weights_paged)
    std::printf(
        "  (weights on the SSD: read ahead of the forward, the backward and the update, written after it; not "
        "built: the engine refuses it, as it pages the weights only with every layer on the device "
        "(--resident); or give --max-host-memory %s to keep them in RAM)\n",
        fmt("%.0fG", static_cast<double>(tier.place.min_bytes_resident_weights) / kGiB + 0.999).c_str());
}

// Host RAM per item, the state tier, the checkpoint on disk, data parallel's bytes per rank.
void report_host(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const PlanHost& h = plan.host;
  const double params = static_cast<double>(o.spec.params_total());
  std::printf("\nhost RAM%s: %s, %.3f B/param (~%s usable)%s\n",
              o.tiered ? " with the state tier (the master, moments, shadows and gradients below are split between "
                         "RAM and the SSD)"
                       : "",
              gib(static_cast<double>(h.total)).c_str(), static_cast<double>(h.total) / params,
              gib(static_cast<double>(plan.machine.host_usable)).c_str(), h.fits ? "" : ": DOES NOT FIT");
  for (const PlanHostItem& it : h.items)
    if (it.bytes)
      std::printf("  %-62s %10s %7.3f B/param\n", it.what.c_str(), gib(static_cast<double>(it.bytes)).c_str(),
                  static_cast<double>(it.bytes) / params);
  if (o.tiered) report_tier(plan);
  std::printf(
      "checkpoint (--save-every, --out): %s on disk per save, %.3f B/param (the state as held: %s master, "
      "%s moments)\n",
      gib(static_cast<double>(h.saved_bytes)).c_str(), static_cast<double>(h.saved_bytes) / params,
      master_is_bf16(o.storage) ? "bf16" : "fp32", o.optimizer.c_str());
  if (o.ranks > 1)
    std::printf(
        "data parallel, %d ranks on this host (the optimizer state sharded over them, docs/multi_gpu.md): up to "
        "%s per rank, %.3f B/param (fp32 master + Adam 12/N, the whole bf16 weights 2; a fresh run starts from "
        "5.2 B/param and keeps its slices unit by unit, a resume loads the checkpoint's 12 first); the %d ranks "
        "together %s%s\n",
        o.ranks, gib(static_cast<double>(h.dp_rank_max)).c_str(), static_cast<double>(h.dp_rank_max) / params, o.ranks,
        gib(static_cast<double>(h.dp_host)).c_str(), h.dp_fits ? "" : ": DOES NOT FIT");
}

// The device plan: placement, kept layers, the fit's changes, its bytes; Muon's workspace and work.
void report_device(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const ModelSpec& spec = o.spec;
  const bool muon = o.muon;
  const CudaOptions& co = plan.device.options;
  const DevicePlan& dp = plan.device.plan;
  const DevicePlacement& pl = dp.place;
  std::printf(
      "\ndevice plan: %s, %d weight slot%s, gradients on %s, checkpoints on %s, embedding on %s, %s, "
      "activations of %lld of %lld layers kept, the attention half of %lld more (selective recompute)\n",
      co.resident ? "resident" : "streaming", pl.slots, pl.slots == 1 ? "" : "s",
      pl.fold         ? (muon && co.grads == "auto" ? "host (folded into the update as they land: Muon needs whole "
                                                      "gradients)"
                                                    : "host (folded into the update as they land)")
      : pl.host_grads ? (muon && co.grads == "auto" ? "host (Muon needs whole gradients)" : "host")
                      : "device",
      pl.host_ckpt ? "host" : "device", pl.host_embed ? "host" : "device",
      pl.layer_major ? "layer-major" : "micro-batch-major", (long long)dp.kept_layers, (long long)spec.n_layers,
      (long long)dp.attn_kept_layers);
  if (plan.device.host_fallback)
    std::printf("  micro-batch-major: the host cannot pin the block inputs of all %lld micro-batches (layer-major)\n",
                (long long)o.grad_accum);
  for (const std::string& c : dp.changes) std::printf("  shrunk to fit: %s\n", c.c_str());
  std::printf("  device memory %s of %s budget%s\n", gib(static_cast<double>(dp.total)).c_str(),
              gib(static_cast<double>(dp.budget)).c_str(), dp.fits() ? "" : ": DOES NOT FIT");
  if (muon) {  // one of the items above (engine/cuda/muon_gpu.h)
    uint64_t ws = 0;
    for (const DevicePlanItem& it : dp.items)
      if (it.what.rfind("Muon Newton-Schulz", 0) == 0) ws += it.bytes;
    const MuonMatrixDims md = muon_matrix_dims(spec);
    std::printf(
        "  of which the Muon Newton-Schulz workspace %s (2 lanes: U in fp32 and X in bf16 of %lld "
        "elements, A and B of %lld^2 in bf16)\n",
        gib(static_cast<double>(ws)).c_str(), (long long)md.max_numel, (long long)md.max_small);
    const MuonStepWork ns = muon_step_work(spec);
    std::printf(
        "  Muon's Newton-Schulz: %.1f TFLOP per step on the GPU (%.2f s with its jobs' conversions and norms, in "
        "the compute below: it shares the device with the step) + %.2f GB of copies (fp32 in, bf16 out, in the "
        "copies below)\n",
        ns.flops / 1e12, plan.step.ns5_s, ns.bytes / 1e9);
  }
}

// The predicted step, what binds it, its FLOPs; then what to change.
void report_step(const Plan& plan) {
  const CardSpec& card = plan.machine.card;
  const CudaOptions& co = plan.device.options;
  const DevicePlacement& pl = plan.device.plan.place;
  const StepPrediction& sp = plan.step;
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
      "H100)\n",
      sp.model_flops_per_token / 1e9, sp.hardware_flops_per_token / 1e9, 100 * sp.efficiency,
      100 * sp.efficiency * card.bf16_tflops / sp.gemm_peak_tflops, sp.gemm_peak_tflops,
      card.gemm_peak_measured ? "measured" : "not measured: the H100's share of the datasheet");
  if (!plan.fixes.empty()) std::printf("\nto change:\n");
  for (const std::string& f : plan.fixes) std::printf("  - %s\n", f.c_str());
}

}  // namespace

void plan_report(const Plan& plan) {
  report_machine(plan);
  report_host(plan);
  report_device(plan);
  report_step(plan);
}

}  // namespace rt::cli
