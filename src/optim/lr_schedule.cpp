// LrSchedule: warm-up then constant, cosine or linear decay to a floor; contract in lr_schedule.h.
#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace rt {

void LrSchedule::validate() const {
  RT_CHECK(std::isfinite(peak) && peak > 0, "[lr_schedule] peak learning rate ", peak,
           " must be a positive number; set lr in the optimizer config");
  RT_CHECK(total_steps >= 1, "[lr_schedule] total_steps = ", total_steps, " must be >= 1");
  RT_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps, "[lr_schedule] warmup_steps = ", warmup_steps,
           " must lie in [0, total_steps = ", total_steps, "]; shorten the warm-up or train longer");
  RT_CHECK(min_lr_ratio >= 0 && min_lr_ratio <= 1, "[lr_schedule] min_lr_ratio = ", min_lr_ratio,
           " must lie in [0, 1] (it is a fraction of the peak lr, not an absolute lr)");
}

double LrSchedule::at(int64_t step) const {
  validate();
  RT_CHECK(step >= 1, "[lr_schedule] step ", step, ": steps are 1-based");
  if (step <= warmup_steps) return peak * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (kind == Kind::constant) return peak;
  double floor = peak * min_lr_ratio;
  int64_t decay_steps = total_steps - warmup_steps;
  double progress = decay_steps > 0 ? static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps) : 1.0;
  if (progress > 1) progress = 1;
  if (kind == Kind::cosine) return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return floor + (peak - floor) * (1.0 - progress);
}

LrSchedule::Kind lr_schedule_kind_parse(const std::string& name) {
  if (name == "constant") return LrSchedule::Kind::constant;
  if (name == "cosine") return LrSchedule::Kind::cosine;
  if (name == "linear") return LrSchedule::Kind::linear;
  fail("[lr_schedule] unknown schedule \"", name, "\"; choose constant, cosine or linear");
}

const char* lr_schedule_kind_name(LrSchedule::Kind kind) {
  switch (kind) {
    case LrSchedule::Kind::constant:
      return "constant";
    case LrSchedule::Kind::cosine:
      return "cosine";
    case LrSchedule::Kind::linear:
      return "linear";
  }
  return "unknown";
}

}  // namespace rt
