// HostWait: an NVTX range around one of the engine's host waits (a landing
// slab, a layer's update, the last step's fold), so that nsys and
// bench/kernel_profile.cpp's gap attribution (RAMTRAIN_KPROF_GAPS) can say
// what the launch thread waited for while the GPU ran out of work. Without a
// tool attached, NVTX's calls return at once.
#pragma once
#include <nvtx3/nvToolsExt.h>

namespace rt::cuda {

class HostWait {
 public:
  explicit HostWait(const char* what) : id_(nvtxRangeStartA(what)) {}
  ~HostWait() { nvtxRangeEnd(id_); }
  HostWait(const HostWait&) = delete;
  HostWait& operator=(const HostWait&) = delete;

 private:
  nvtxRangeId_t id_;
};

}  // namespace rt::cuda
