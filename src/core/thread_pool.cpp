#include "core/thread_pool.h"

#include <cstdlib>
#include <cstring>
#include <memory>

namespace rt {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (fn_ && next_ < n_tasks_) {
      int64_t t = next_++;
      const auto* fn = fn_;
      lk.unlock();
      try {
        (*fn)(t);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lk.lock();
      if (++done_ == n_tasks_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  fn_ = &fn;
  n_tasks_ = n_tasks;
  next_ = 0;
  done_ = 0;
  error_ = nullptr;
  ++generation_;
  cv_work_.notify_all();
  while (next_ < n_tasks_) {
    int64_t t = next_++;
    lk.unlock();
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lk.lock();
    ++done_;
  }
  cv_done_.wait(lk, [&] { return done_ == n_tasks_; });
  fn_ = nullptr;
  std::exception_ptr e = error_;
  error_ = nullptr;
  lk.unlock();
  if (e) std::rethrow_exception(e);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> p;
  return p;
}
int default_threads() {
  if (const char* s = std::getenv("RAMTRAIN_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  unsigned h = std::thread::hardware_concurrency();
  return h ? static_cast<int>(h) : 1;
}
}  // namespace

ThreadPool& global_pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void set_global_threads(int n) {
  auto& p = pool_slot();
  p.reset();
  p = std::make_unique<ThreadPool>(n > 0 ? n : default_threads());
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t n_tasks = (n + grain - 1) / grain;
  global_pool().run(n_tasks, [&](int64_t t) {
    int64_t b = t * grain;
    int64_t e = b + grain < n ? b + grain : n;
    fn(b, e);
  });
}

void copy_parallel(void* dst, const void* src, size_t bytes) {
  constexpr int64_t grain = int64_t(1) << 24;
  parallel_for(static_cast<int64_t>(bytes), grain, [&](int64_t b, int64_t e) {
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, static_cast<size_t>(e - b));
  });
}

}  // namespace rt
