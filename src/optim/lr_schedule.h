// Learning-rate schedules. Steps are 1-based (step 1 = the first optimizer update).
//   warm-up (warmup_steps > 0): lr = peak * step / warmup_steps for step <= warmup_steps,
//     so step 1 gives peak / warmup_steps and step warmup_steps gives peak;
//   then, with floor = peak * min_lr_ratio (a ratio of peak, not an absolute lr) and
//   progress = (step - warmup_steps) / (total_steps - warmup_steps) clamped to [0, 1]:
//     constant: peak
//     cosine:   floor + (peak - floor) * (1 + cos(pi * progress)) / 2
//     linear:   floor + (peak - floor) * (1 - progress)
//   so the decay reaches floor at total_steps and stays there after it.
// Values are doubles, like the Python floats torch's optimizers take.
#pragma once
#include <cstdint>
#include <string>

namespace rt {

struct LrSchedule {
  enum class Kind { constant, cosine, linear };
  Kind kind = Kind::cosine;
  double peak = 3e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;  // floor = peak * min_lr_ratio, in [0, 1]

  // Throws rt::Error ("[lr_schedule] ...") unless peak > 0 (finite), 0 <= warmup_steps
  // <= total_steps, total_steps >= 1 and 0 <= min_lr_ratio <= 1.
  void validate() const;
  // The learning rate of 1-based `step` (validates first; step < 1 throws).
  double at(int64_t step) const;
};

// "constant" | "cosine" | "linear"; anything else throws rt::Error naming the choices.
LrSchedule::Kind lr_schedule_kind_parse(const std::string& name);
const char* lr_schedule_kind_name(LrSchedule::Kind kind);

}  // namespace rt
