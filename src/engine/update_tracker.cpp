#include "engine/update_tracker.h"

#include "core/error.h"

namespace rt {

UpdateTracker::UpdateTracker(size_t n_units, bool delayed)
    : delayed_(delayed),
      updated_(n_units, 0),
      progress_(n_units, 0),
      progress_step_(n_units, -1),
      grad_issued_(n_units, 0) {}

void UpdateTracker::push(std::function<void()> job) {
  worker_.push([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      update([&] { failed_ = true; });
      throw;
    }
  });
}

void UpdateTracker::report_failure() {
  worker_.drain();  // rethrows the job's error
  fail("[engine] the optimizer failed");
}

void UpdateTracker::mark_progress(size_t u, int64_t step, int64_t e) {
  update([&] {
    progress_step_[u] = step;
    progress_[u] = e;
  });
}
void UpdateTracker::mark_updated(size_t u, int64_t step) {
  update([&] { updated_[u] = step; });
}
void UpdateTracker::mark_grad_issued(size_t u, int64_t step) {
  update([&] { grad_issued_[u] = step; });
}

int64_t UpdateTracker::ready_elems(size_t u, int64_t need, int64_t numel) const {
  if (updated_[u] >= need) return numel;
  return progress_step_[u] == need ? progress_[u] : 0;
}

bool UpdateTracker::is_updated(size_t u, int64_t need) {
  return read([&] { return updated_[u] >= need; });
}
void UpdateTracker::wait_updated(size_t u, int64_t need) {
  wait([&] { return updated_[u] >= need; });
}
int64_t UpdateTracker::wait_ready(size_t u, int64_t need, int64_t numel, int64_t issued) {
  int64_t ready = 0;
  wait([&] { return (ready = ready_elems(u, need, numel)) > issued; });
  return ready;
}
void UpdateTracker::wait_grad_issued(size_t u, int64_t step) {
  wait([&] { return grad_issued_[u] >= step; });
}

}  // namespace rt
