#include "core/worker.h"

namespace rt {

Worker::Worker() : t_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  t_.join();
}

void Worker::push(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    q_.push_back(std::move(f));
  }
  cv_.notify_all();
}

void Worker::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void Worker::rethrow_if_failed() {
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void Worker::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (q_.empty() && stop_) return;
    auto f = std::move(q_.front());
    q_.pop_front();
    busy_ = true;
    lk.unlock();
    try {
      if (!error_) f();
    } catch (...) {
      std::lock_guard<std::mutex> g(err_mu_);
      error_ = std::current_exception();
    }
    lk.lock();
    busy_ = false;
    if (q_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace rt
