// ramtrain plan: what a training run of a model on a card beside a host would
// need and do, without a GPU: the host RAM per plan item, the device plan the
// CUDA engine would choose (engine/device_plan.h: the engine's own planner),
// the predicted step time (engine/step_model.h) and, when it does not fit,
// which flag to change and by how much. Exits 1 when the run would be refused.
// The stages and their order: cli/plan.h.
#include "cli/plan.h"

#include <cstdio>
#include <string>

#include "core/error.h"

namespace rt::cli {

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

std::string gib(double bytes) {
  return bytes >= kGiB ? fmt("%.2f GiB", bytes / kGiB) : fmt("%.2f MiB", bytes / (1 << 20));
}

int cmd_plan(const Args& args) {
  Plan plan;
  if (!plan_options(args, &plan.opt)) return 0;
  plan.machine = plan_machine(plan.opt);
  plan.device = plan_device_fit(plan.opt, plan.machine);
  plan.host = plan_host_ram(plan.opt, plan.machine, plan.device);
  plan.step = predict_step(plan.opt.spec, plan.opt.micro_batch, plan.opt.seq_len, plan.device.plan, plan.machine.card,
                           plan.opt.gparams, plan.machine.matmul);
  plan.fixes = plan_fixes(plan);
  if (plan.opt.json)
    std::printf("%s\n", plan_json(plan).c_str());
  else
    plan_report(plan);
  std::fflush(stdout);
  if (!plan.fits())
    fail("[plan] this run would be refused: ", plan.fixes.empty() ? std::string("see above") : plan.fixes.front());
  return 0;
}

}  // namespace rt::cli
