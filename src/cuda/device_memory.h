// Device and pinned host memory owners. Every device allocation of the
// streaming engine goes through one DeviceAllocator, which never takes more
// than its budget (--max-gpu-memory) and reports what it needed and had.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "cuda/check.h"

namespace rt::cuda {

// The engine's plan does not fit its device budget (make_cuda_backend may
// shrink the plan and try again; see CudaOptions::fit).
class DeviceBudgetError : public Error {
 public:
  using Error::Error;
};

// Pinned host memory the plan needs but the host does not have free (the
// engine's fit loop may fall back to a plan that pins less).
class HostBudgetError : public Error {
 public:
  using Error::Error;
};

class DeviceAllocator {
 public:
  explicit DeviceAllocator(uint64_t budget) : budget_(budget) {}
  void* alloc(size_t bytes, const std::string& what) {
    bytes = (bytes + 255) / 256 * 256;
    if (used_ + bytes > budget_)
      throw DeviceBudgetError(cat("[cuda] not enough device memory for ", what, ": needs ", bytes >> 20, " MiB more, ",
                                  (budget_ - used_) >> 20, " MiB left of the ", budget_ >> 20, " MiB budget (",
                                  used_ >> 20,
                                  " MiB in use). Lower --micro-batch or --seq-len, use --low-memory "
                                  "(or --checkpoints host, --grads host), or raise --max-gpu-memory."));
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw DeviceBudgetError(cat("[cuda] cudaMalloc of ", bytes >> 20, " MiB for ", what, " failed (",
                                  cudaGetErrorString(e), "); the device has ", free_b >> 20, " MiB free of ",
                                  total_b >> 20, " MiB. Lower --max-gpu-memory or the batch."));
    }
    used_ += bytes;
    if (used_ > peak_) peak_ = used_;
    return p;
  }
  void release(void* p, size_t bytes) {
    if (!p) return;
    cudaFree(p);
    used_ -= (bytes + 255) / 256 * 256;
  }
  uint64_t used() const { return used_; }
  uint64_t peak() const { return peak_; }
  uint64_t budget() const { return budget_; }

 private:
  uint64_t budget_, used_ = 0, peak_ = 0;
};

template <class T>
class DevBuf {
 public:
  DevBuf() = default;
  DevBuf(DeviceAllocator& a, int64_t n, const std::string& what) : a_(&a), n_(static_cast<size_t>(n)) {
    p_ = static_cast<T*>(a.alloc(n_ * sizeof(T), what));
  }
  ~DevBuf() {
    if (a_) a_->release(p_, n_ * sizeof(T));
  }
  DevBuf(DevBuf&& o) noexcept : a_(o.a_), p_(o.p_), n_(o.n_) { o.a_ = nullptr, o.p_ = nullptr, o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (a_) a_->release(p_, n_ * sizeof(T));
      a_ = o.a_, p_ = o.p_, n_ = o.n_;
      o.a_ = nullptr, o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  DeviceAllocator* a_ = nullptr;
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory of exactly the requested size (cudaHostAlloc; no
// power-of-two rounding), so streamed copies run at PCIe speed.
class PinnedBuf {
 public:
  PinnedBuf() = default;
  PinnedBuf(size_t bytes, const std::string& what) : bytes_(bytes) {
    if (bytes == 0) return;
    cudaError_t e = cudaHostAlloc(&p_, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("[cuda] cannot pin ", bytes >> 20, " MiB of host memory for ", what, " (", cudaGetErrorString(e),
           "). Free host RAM or use a smaller model.");
    }
  }
  ~PinnedBuf() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuf(PinnedBuf&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  PinnedBuf& operator=(PinnedBuf&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFreeHost(p_);
      p_ = o.p_, bytes_ = o.bytes_;
      o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class Event {
 public:
  Event() { CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  explicit Event(bool timing) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (e_) cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace rt::cuda
