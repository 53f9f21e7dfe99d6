// A fixed pool of worker threads for the CPU backend and the optimizer.
// Determinism rule: callers split work into tasks whose boundaries depend only
// on the problem size (never on the thread count or on timing), and each task
// writes its own outputs; reductions combine per-task partials in task order.
// Then results are bit-identical run to run and for any thread count.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rt {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(task) for task in [0, n_tasks) and returns when all are done.
  // The calling thread takes part. Exceptions from tasks are rethrown (first one).
  void run(int64_t n_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// The process-wide pool. Size: RAMTRAIN_THREADS, else hardware concurrency.
ThreadPool& global_pool();
// Recreates the global pool with n threads (n <= 0: hardware concurrency).
void set_global_threads(int n);

// Splits [0, n) into chunks of `grain` (the last may be shorter) and runs
// fn(begin, end) for each on the global pool.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// memcpy of `bytes` in 16 MiB pieces on the global pool: large copies into
// fresh memory fault their pages in on every core (one thread does a few GB/s).
void copy_parallel(void* dst, const void* src, size_t bytes);

}  // namespace rt
