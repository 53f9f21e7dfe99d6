// Worker: a FIFO of host jobs run one at a time, in push order, on one
// thread of its own (the streaming engine's optimizer). A job that throws
// stops the queue: later jobs are skipped, and drain() or rethrow_if_failed()
// rethrows the first error once. The destructor runs what is queued, then
// joins.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace rt {

class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void push(std::function<void()> f);
  // Blocks until every pushed job has run; rethrows a job's error.
  void drain();
  // Rethrows a job's error without waiting.
  void rethrow_if_failed();

 private:
  void loop();
  std::mutex mu_, err_mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false, busy_ = false;
  std::exception_ptr error_;
  std::thread t_;  // last: started once the rest is constructed
};

}  // namespace rt
