// ramtrain plan's JSON (--json): the plan as one object, the text report's
// numbers and the items behind them. bench/plan_check.sh, bench/lean_size.sh
// and tests/cli/plan_test.cpp read its keys (unique within each object);
// bytes are integers, times seconds.
#include <algorithm>
#include <string>

#include "cli/plan.h"

namespace rt::cli {

std::string plan_json(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const ModelSpec& spec = o.spec;
  const int64_t T = o.seq_len, B = o.micro_batch, K = o.grad_accum;
  const CardSpec& card = plan.machine.card;
  const MatmulMode matmul = plan.machine.matmul;
  const DevicePlan& dp = plan.device.plan;
  const DevicePlacement& pl = dp.place;
  const PlanHost& h = plan.host;
  const RunTierPlan& tier = h.tier;
  const StepPrediction& sp = plan.step;
  const double params = static_cast<double>(spec.params_total());
  const char* mode = plan.device.options.resident ? "resident" : "streaming";
  std::string j = "{\"fits\":" + std::string(plan.fits() ? "true" : "false");
  j += ",\"model\":" + json_str(o.model_name) + ",\"params\":" + fmt("%.0f", params) +
       ",\"layers\":" + std::to_string(spec.n_layers) + ",\"seq_len\":" + std::to_string(T) +
       ",\"micro_batch\":" + std::to_string(B) + ",\"grad_accum\":" + std::to_string(K) +
       ",\"tokens_per_step\":" + std::to_string(K * B * T);
  // MoE: the parameters one token uses (router + top-k experts per layer)
  j += ",\"active_params\":" + fmt("%.0f", static_cast<double>(spec.params_active()));
  j += ",\"card\":{\"name\":" + json_str(card.name) + ",\"budget_bytes\":" + std::to_string(plan.machine.budget) +
       ",\"bf16_tflops\":" + fmt("%g", card.bf16_tflops) + ",\"fp8_tflops\":" + fmt("%g", card.fp8_tflops) +
       ",\"pcie_gbs\":" + fmt("%g", card.pcie_gbs) + "}";
  const double fp8_gain = matmul == MatmulMode::fp8_tensor ? card.fp8_tensor_gain
                          : matmul == MatmulMode::fp8      ? card.fp8_gain
                                                           : 0.0;
  j += ",\"matmul\":" + json_str(o.matmul) +
       ",\"fp8_scaling\":" + json_str(matmul == MatmulMode::bf16 ? "none" : o.fp8_scaling) +
       ",\"fp8_gain\":" + fmt("%.4g", fp8_gain) +
       ",\"fp8_gain_estimated\":" +
       (matmul == MatmulMode::fp8_tensor && fp8_gain > 0 && card.name != "h100" ? "true" : "false") +
       ",\"fp8_flops_per_token\":" + fmt("%.6g", sp.fp8_flops_per_token);
  j += ",\"host\":{\"ram_bytes\":" + std::to_string(o.host_ram) +
       ",\"usable_bytes\":" + std::to_string(plan.machine.host_usable) +
       ",\"needed_bytes\":" + std::to_string(h.total) +
       ",\"bytes_per_param\":" + fmt("%.4f", static_cast<double>(h.total) / params) +
       ",\"fits\":" + (h.fits ? "true" : "false") + ",\"checkpoint_bytes\":" + std::to_string(h.saved_bytes) +
       ",\"items\":[";
  for (size_t i = 0; i < h.items.size(); ++i)
    j += std::string(i ? "," : "") + "{\"what\":" + json_str(h.items[i].what) +
         ",\"bytes\":" + std::to_string(h.items[i].bytes) + "}";
  j += "]}";
  const double tier_s = o.tiered ? tier_step_s(tier, sp, plan.device.plan.place.fold) : sp.step_s;
  if (o.tiered)
    j += ",\"tier\":{\"fits\":" + std::string(tier.fits ? "true" : "false") +
         ",\"budget_bytes\":" + std::to_string(h.tier_budget) + ",\"ram_bytes\":" + std::to_string(tier.place.ram()) +
         ",\"resident_bytes\":" + std::to_string(tier.place.resident) +
         ",\"kept_bytes\":" + std::to_string(tier.place.kept) + ",\"slot_bytes\":" + std::to_string(tier.place.slots) +
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
         ",\"write_bytes_per_step\":" + std::to_string(tier.write_bytes) + ",\"ssd_gbs\":" + fmt("%g", o.ssd_gbs) +
         ",\"ssd_s\":" + fmt("%.6g", tier.ssd_s) + ",\"fold\":" + (plan.device.plan.place.fold ? "true" : "false") +
         ",\"forward_s\":" + fmt("%.6g", step_forward_s(sp)) + ",\"ssd_binds\":" + (tier_s > sp.step_s ? "true" : "false") +
         ",\"step_s\":" + fmt("%.6g", tier_s) +
         ",\"tokens_per_s\":" + fmt("%.6g", static_cast<double>(K * B * T) / tier_s) + "}";
  if (o.ranks > 1)
    j += ",\"data_parallel\":{\"ranks\":" + std::to_string(o.ranks) +
         ",\"rank_bytes_max\":" + std::to_string(h.dp_rank_max) + ",\"host_bytes\":" + std::to_string(h.dp_host) +
         ",\"fits\":" + (h.dp_fits ? "true" : "false") + "}";
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
       ",\"efficiency\":" + fmt("%g", sp.efficiency) + ",\"gemm_peak_tflops\":" + fmt("%g", sp.gemm_peak_tflops) + "}";
  j += ",\"fixes\":[";
  for (size_t i = 0; i < plan.fixes.size(); ++i) j += std::string(i ? "," : "") + json_str(plan.fixes[i]);
  j += "]}";
  return j;
}

}  // namespace rt::cli
