// Host embedding (--grads host with an untied embedding, the low-memory
// setting): the table stays on the host. The forward gathers a micro-batch's
// rows from the pinned bf16 shadow on the CPU and copies the N x C block in;
// the backward copies the residual gradient at layer 0 out and the worker
// scatters it into the embedding's host gradient with cpu::embedding_backward
// (the order of the CUDA kernel, so the weights are bit-identical to the
// device modes).
#pragma once
#include <cstdint>

#include "engine/cuda/engine_device.h"
#include "engine/update_tracker.h"
#include "state/host_state.h"

namespace rt::cuda {

class HostEmbedding {
 public:
  HostEmbedding(HostState& st, EngineDevice& dev, UpdateTracker& track, int64_t n_tokens);
  // Gathers the rows of ids[0..N) from table (one thread: the pool is the
  // optimizer's); checks every id against the vocabulary.
  void gather(const int32_t* ids, const uint16_t* table);
  // Queues the gathered rows into dst (N x C) on the compute stream.
  void copy_in(bf16* dst);
  // The residual gradient dx (N x C) leaves the device; the worker scatters
  // it into the embedding's host gradient (= when first_micro, += after).
  void land(const bf16* dx, const int32_t* ids, bool first_micro);

 private:
  HostState& st_;
  EngineDevice& dev_;
  UpdateTracker& track_;
  int64_t N_, C_;
  PinnedBuf rows_, dx_;  // gathered rows in, residual gradient out (N x C bf16)
  bool dx_free_ = true;  // guarded by the tracker's mutex
  Event dx_done_, grad_made_;
};

}  // namespace rt::cuda
