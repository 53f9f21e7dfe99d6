// --trace FILE.json: a Chrome/Perfetto trace of the streaming engine, one lane
// per stream (h2d, compute, d2h) and one for the CPU optimizer, one span per
// layer per phase. GPU spans are timed with CUDA events against a base event
// whose host time is taken when it completes; host spans use steady_clock.
// Disabled (every call a no-op) when the path is empty. Thread-safe.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace rt::cuda {

enum class Lane { h2d = 1, compute = 2, d2h = 3, optimizer = 4 };

class Tracer {
 public:
  struct Span {
    int idx = -1;
  };
  explicit Tracer(std::string path);
  ~Tracer();  // waits for the device, writes the file atomically
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  bool enabled() const { return !path_.empty(); }

  Span gpu_begin(Lane lane, const char* name, int layer, cudaStream_t s);
  void gpu_end(Span sp, cudaStream_t s);
  Span host_begin(const char* name, int layer);
  void host_end(Span sp);
  void flush_step(int64_t step);  // resolves finished GPU spans, frees their events
  // Busy time of a lane in a step (union of its resolved spans), seconds.
  double lane_busy_seconds(Lane lane, int64_t step);
  void write();

 private:
  struct Rec {
    Lane lane;
    std::string name;
    int layer;
    int64_t step;
    cudaEvent_t b = nullptr, e = nullptr;  // GPU spans
    double t0 = 0, t1 = -1;                // microseconds since base
    bool done = false;
  };
  cudaEvent_t get_event();
  double host_now_us() const;
  std::string path_;
  std::mutex mu_;
  std::vector<Rec> recs_;
  std::vector<cudaEvent_t> pool_;
  cudaEvent_t base_ = nullptr;
  std::chrono::steady_clock::time_point base_host_;
  int64_t step_ = 0;
  size_t resolved_upto_ = 0;
};

}  // namespace rt::cuda
