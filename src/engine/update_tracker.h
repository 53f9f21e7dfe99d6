// UpdateTracker: what the streaming engine's optimizer worker has done, per
// unit, and the worker itself. The compute thread asks for a unit's weights at
// a version (the count of updates they must include) and waits, under one
// mutex, until the worker's update of that unit has reached it; the worker
// marks progress chunk by chunk, so loads can start under the update.
//
// Versions: step() counts the steps whose update has been queued. Delayed
// update (backend.h): a step computes with all updates but the last one (the
// one applied meanwhile), or all of them right after sync().
//
// Failure: a job that throws marks the tracker failed and wakes every waiter,
// which then rethrows the job's error (never blocks forever).
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/worker.h"

namespace rt {

class UpdateTracker {
 public:
  UpdateTracker(size_t n_units, bool delayed);

  // ---- versions (compute thread) ----
  bool delayed() const { return delayed_; }
  int64_t step() const { return step_; }
  void next_step() { ++step_; }
  void synced() { min_version_ = step_; }  // delayed: the pending update is in
  // The update count of the weights this step computes with.
  int64_t need_version() const { return delayed_ ? std::max(step_ - 1, min_version_) : step_; }

  // ---- the worker ----
  void push(std::function<void()> job);
  void drain() { worker_.drain(); }
  void rethrow_if_failed() { worker_.rethrow_if_failed(); }
  [[noreturn]] void report_failure();

  // ---- per-unit progress ----
  // Worker side: unit u's update of `step` has reached element e / is done;
  // its gradient copy-out and zeroing for `step` is queued.
  void mark_progress(size_t u, int64_t step, int64_t e);
  void mark_updated(size_t u, int64_t step);
  void mark_grad_issued(size_t u, int64_t step);
  // Compute side.
  bool is_updated(size_t u, int64_t need);
  void wait_updated(size_t u, int64_t need);
  // Blocks until more than `issued` elements of unit u (numel elements) hold
  // version `need`; returns how many do.
  int64_t wait_ready(size_t u, int64_t need, int64_t numel, int64_t issued);
  void wait_grad_issued(size_t u, int64_t step);

  // ---- other flags the worker and the compute thread share ----
  // wait(pred): blocks until pred() (called under the mutex) holds; rethrows
  // a failed job's error. update(f): runs f under the mutex, wakes waiters.
  template <class P>
  void wait(P pred) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return pred() || failed_; });
    if (failed_) {
      lk.unlock();
      report_failure();
    }
  }
  template <class F>
  void update(F f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      f();
    }
    cv_.notify_all();
  }
  template <class F>
  auto read(F f) const {
    std::lock_guard<std::mutex> lk(mu_);
    return f();
  }

 private:
  int64_t ready_elems(size_t u, int64_t need, int64_t numel) const;  // mu_ held
  bool delayed_;
  int64_t step_ = 0, min_version_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ = false;
  std::vector<int64_t> updated_;                   // per unit: updates applied
  std::vector<int64_t> progress_, progress_step_;  // per unit: update progress_step_ has reached element progress_
  std::vector<int64_t> grad_issued_;               // per unit: steps whose gradient copy-out + zeroing is queued
  Worker worker_;                                  // last: its thread stops first
};

}  // namespace rt
