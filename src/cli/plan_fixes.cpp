// ramtrain plan's "to change": for a plan that does not fit, the flags that
// make it fit and by how much (the device plan first: the largest micro-batch
// that fits, by bisection over the engine's planner; then the state tier,
// then host RAM, item by item); for one that fits, what the binding part of
// the step would gain from. Each line names the flag; the first is the one
// the refusal quotes. Plans, never prints.
#include <string>
#include <vector>

#include "cli/plan.h"
#include "core/error.h"
#include "state/moment_quant.h"

namespace rt::cli {

namespace {

// The device plan does not fit even at its smallest: the largest micro-batch that does.
std::string device_fix(const Plan& plan) {
  const ModelSpec& spec = plan.opt.spec;
  const int64_t T = plan.opt.seq_len, B = plan.opt.micro_batch, K = plan.opt.grad_accum;
  const CudaOptions& co = plan.device.options;
  const DevicePlan& dp = plan.device.plan;
  const uint64_t budget = plan.machine.budget;
  // The largest micro-batch that fits, by bisection (the device plan grows
  // with the micro-batch; a linear search took minutes at --micro-batch 10^5).
  auto fits_at = [&](int64_t b) {
    CudaOptions c = co;
    c.micro_batches = (K * B + b - 1) / b;
    return fit_device_plan(spec, b, T, c, budget).fits();
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
    f += "use --micro-batch " + std::to_string(fit_b) + " --grad-accum " + std::to_string((K * B + fit_b - 1) / fit_b) +
         " (about the same tokens per step)";
  else
    f += "lower --seq-len, or a card with " + gib(static_cast<double>(dp.total)) + " or more for the engine";
  return f;
}

// Host RAM is over: how much, then what each item would give back.
void host_fixes(const Plan& plan, std::vector<std::string>* fixes) {
  const PlanOptions& o = plan.opt;
  const int64_t T = o.seq_len, B = o.micro_batch, K = o.grad_accum;
  const CudaOptions& co = plan.device.options;
  const DevicePlacement& pl = plan.device.plan.place;
  const uint64_t budget = plan.machine.budget, host_usable = plan.machine.host_usable;
  const PlanHost& h = plan.host;
  const uint64_t host_total = h.total;
  const double numel = static_cast<double>(h.numel);
  const double over = static_cast<double>(host_total - host_usable);
  fixes->push_back("host RAM: needs " + gib(static_cast<double>(host_total)) + " of ~" +
                   gib(static_cast<double>(host_usable)) + " usable (" + gib(over) + " over): --host-ram " +
                   fmt("%.0fG", (static_cast<double>(host_total + kHostReserveBytes)) / kGiB + 0.999) + " or more");
  if (o.storage == MasterStorage::fp32)
    fixes->push_back("--master split saves " + gib(1.875 * numel) + " (bit-identical results)");
  if (o.moments != MomentStorage::q4)
    fixes->push_back(
        std::string("--optimizer ") + (o.moments == MomentStorage::fp32 ? "adamw8bit" : "adamw4bit") + " saves " +
        gib(static_cast<double>(h.moment_bytes) -
            moment_bytes_per_param(o.moments == MomentStorage::fp32 ? MomentStorage::q8 : MomentStorage::q4) * numel) +
        " (quantized Adam moments; changes the results slightly, docs/lean_state.md)");
  if (pl.host_grads && !pl.fold)
    fixes->push_back(
        "--grads fold drops the host gradients (" + gib(4.0 * numel) + "): each layer updates as its gradient lands" +
        (K > 1 && !pl.layer_major ? std::string(" (needs --layer-major on with --grad-accum > 1)") : std::string("")) +
        "; with --clip 0 the results are the same, with clipping each layer is clipped by the norm "
        "landed up to it (docs/small_gpu.md)");
  if (pl.host_grads && !pl.fold) {
    CudaOptions c = co;
    c.grads = "device";
    c.fit = false;
    const DevicePlan d = plan_device(o.spec, B, T, c, budget);
    fixes->push_back(std::string("host gradients take ") + gib(4.0 * numel) +
                     (d.fits() ? ": --grads device fits this card and frees them"
                               : ": they leave the host only on a card with " + gib(static_cast<double>(d.total)) +
                                     " for the engine (--grads device)"));
  }
  if (pl.host_grads && o.muon) {  // Muon lands whole units; AdamW lands a unit larger than a layer in pieces
    CudaOptions a = co;
    a.muon = false;
    const uint64_t pieces = gradient_landing_bytes(o.spec, pl, a);
    if (pieces < h.items[6].bytes)
      fixes->push_back("Muon updates whole units, so its pinned gradient landing is 3 slabs of the largest unit (" +
                       gib(static_cast<double>(h.items[6].bytes)) + "); AdamW (--optimizer " +
                       std::string(optimizer_name(UpdateRule::adamw, o.moments)) +
                       ") lands the LM head in layer-sized pieces: " + gib(static_cast<double>(pieces)));
  }
  const double ckpt = static_cast<double>(h.block_checkpoint_bytes);
  if (pl.host_ckpt && pl.layer_major)
    fixes->push_back("the pinned checkpoints of all " + std::to_string(K) + " micro-batches take " + gib(ckpt) +
                     ": --layer-major off keeps one micro-batch's (" + gib(ckpt / static_cast<double>(K)) +
                     ") but moves the weights once per micro-batch");
  else if (pl.host_ckpt && h.block_checkpoint_bytes > host_total / 10)
    fixes->push_back("the pinned checkpoints take " + gib(ckpt) +
                     ": fewer tokens per micro-batch or per step (--micro-batch, --grad-accum)");
}

// The exact update waits for the backward's global norm, so only the next
// forward hides it; --grads fold updates each layer as its gradient lands,
// under the backward. When the optimizer shows for 5% of the step or more
// and the same run with fold fits and is predicted 3% faster or more: that
// run's tokens/s (measured: the per-tensor FP8 7B step idles 0.89 s of 5.34
// waiting for the CPU AdamW, docs/fp8.md).
std::string fold_fix(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const StepPrediction& sp = plan.step;
  if (o.engine.grads == "fold" || o.engine.delayed_update || plan.device.plan.place.fold || o.ranks > 1 ||
      sp.optimizer_exposed_s < 0.05 * sp.step_s)
    return "";
  PlanOptions alt = o;
  alt.engine.grads = "fold";
  try {
    const PlanDevice d = plan_device_fit(alt, plan.machine);
    if (!d.plan.fits() || !d.plan.place.fold) return "";
    if (!plan_host_ram(alt, plan.machine, d).fits) return "";
    const StepPrediction f =
        predict_step(alt.spec, alt.micro_batch, alt.seq_len, d.plan, plan.machine.card, alt.gparams, plan.machine.matmul);
    if (f.tokens_per_s < 1.03 * sp.tokens_per_s) return "";
    return "the CPU optimizer shows for " + fmt("%.2f s", sp.optimizer_exposed_s) +
           " per step (the exact update starts once the backward has the global norm): --grads fold updates each "
           "layer as its gradient lands, under the backward: " +
           fmt("%.0f tokens/s", f.tokens_per_s) + fmt(" (%+.0f%%)", 100 * (f.tokens_per_s / sp.tokens_per_s - 1)) +
           ", the same bits while the norm stays within --clip (docs/small_gpu.md)";
  } catch (const Error&) {  // fold refused with these flags (e.g. micro-batches without layer-major)
    return "";
  }
}

// The plan fits: what the binding part of the step would gain from.
void step_fixes(const Plan& plan, std::vector<std::string>* fixes) {
  const CudaOptions& co = plan.device.options;
  const DevicePlacement& pl = plan.device.plan.place;
  const StepPrediction& sp = plan.step;
  if (std::string f = fold_fix(plan); !f.empty()) fixes->push_back(f);
  if (sp.binding == std::string("optimizer") && !co.delayed_update && !pl.host_grads)
    fixes->push_back("the CPU optimizer shows for " + fmt("%.2f s", sp.optimizer_exposed_s) +
                     " per step: --delayed-update hides it under the whole step (one step stale)");
  else if (sp.binding == std::string("optimizer"))
    fixes->push_back("the CPU optimizer shows for " + fmt("%.2f s", sp.optimizer_exposed_s) +
                     " per step: more tokens per step (--grad-accum) spread it over more compute");
  if (sp.binding == std::string("copies") && plan.opt.grad_accum > 1 && !pl.layer_major)
    fixes->push_back("the copies bind: --layer-major on moves the weights once per step, not once per micro-batch");
  else if (sp.binding == std::string("copies"))
    fixes->push_back(
        "the copies bind: more tokens per micro-batch or per step (--micro-batch, --grad-accum) "
        "spread them over more compute");
}

}  // namespace

std::vector<std::string> plan_fixes(const Plan& plan) {
  const PlanOptions& o = plan.opt;
  const DevicePlacement& pl = plan.device.plan.place;
  const PlanHost& h = plan.host;
  std::vector<std::string> fixes;
  if (!plan.device.plan.fits()) fixes.push_back(device_fix(plan));
  if (o.tiered && !h.tier.fits)
    fixes.push_back(
        "the state tier needs " + gib(static_cast<double>(h.tier.place.min_bytes)) +
        " of RAM even with the weights on the SSD (gradients and three units in flight): --max-host-memory " +
        fmt("%.0fG", static_cast<double>(h.tier.place.min_bytes) / kGiB + 0.999) +
        " or more, on a host with that much usable");
  if (!h.fits && (!o.tiered || h.tier.fits)) host_fixes(plan, &fixes);
  if (plan.device.host_fallback && pl.host_grads && !pl.fold)
    fixes.push_back("layer-major fell back to micro-batch-major for host RAM: --grads fold drops the " +
                    gib(4.0 * static_cast<double>(h.numel)) +
                    " of host gradients, so the pinned block inputs of every micro-batch fit (the clipping rule "
                    "differs only on clipped steps: docs/small_gpu.md)");
  if (plan.fits()) step_fixes(plan, &fixes);
  return fixes;
}

}  // namespace rt::cli
