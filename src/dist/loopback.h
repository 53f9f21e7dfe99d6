// LoopbackWorld: N ranks as N threads of one process sharing memory, the CPU
// twin of a multi-GPU world (dist/collective.h's contracts; sums in rank
// order, so deterministic). run(fn) starts one thread per rank, each calling
// fn with its own Collective, and returns when all are done. When a rank
// throws, the world is aborted: ranks waiting in (or later entering) a
// collective throw too, and run rethrows the first rank's error.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "dist/collective.h"

namespace rt {

class LoopbackWorld {
 public:
  explicit LoopbackWorld(int world);
  int world() const { return world_; }
  void run(const std::function<void(Collective&)>& fn);

 private:
  friend class LoopbackRank;
  // Every rank publishes (op, count, pointers) and waits for the others.
  struct Slot {
    int op = 0;
    int64_t count = 0;
    const void* in = nullptr;
    void* out = nullptr;
  };
  void arrive(int rank);  // the world's barrier; throws when aborted
  void abort();
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Slot> slots_;
};

}  // namespace rt
