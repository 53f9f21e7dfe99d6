#include "engine/cuda/checkpoint_store.h"

#include <algorithm>

#include "core/error.h"
#include "engine/device_plan.h"
#include "state/host_state.h"

namespace rt::cuda {

CheckpointStore::CheckpointStore(EngineDevice& dev, int64_t n_layers, int64_t row_elems, bool on_host, int64_t sets)
    : dev_(dev), L_(n_layers), n_(row_elems), host_(on_host), sets_(sets) {
  const uint64_t rows = static_cast<uint64_t>(sets_) * static_cast<uint64_t>(L_ + 1);
  if (host_) {
    const uint64_t bytes = rows * static_cast<uint64_t>(n_) * 2, avail = host_memory_available();
    if (avail != 0 && bytes > avail)
      throw HostBudgetError(cat(
          "[cuda] the block checkpoints need ", bytes >> 20, " MiB of pinned host RAM (", sets_, " micro-batch",
          sets_ == 1 ? "" : "es", " x ", L_ + 1, " block inputs of ", (n_ * 2) >> 20, " MiB) but only ", avail >> 20,
          " MiB are available. Use fewer tokens per micro-batch or fewer "
          "micro-batches per step (--grad-accum), --layer-major off, or --checkpoints device if the card has room"));
    host_buf_ = PinnedBuf(bytes, "block checkpoints");
    for (auto& x : xbuf_) x = DevBuf<bf16>(dev_.alloc, n_, "a block input buffer");
    if (sets_ > 1) {  // layer-major: the ring and one event per row
      for (int r = 0; r < kCheckpointRing; ++r) {
        ring_.emplace_back(dev_.alloc, n_, "a layer-major block input buffer");
        ring_free_.push_back(r);
      }
      ring_used_.resize(kCheckpointRing);
      ring_out_.resize(kCheckpointRing);
      ring_in_.resize(kCheckpointRing);
      row_out_.resize(rows);
    }
  } else {
    ckpt_ = DevBuf<bf16>(dev_.alloc, static_cast<int64_t>(rows) * n_, "block checkpoints");
  }
}

void CheckpointStore::before_write(int64_t i) {
  // x_i overwrites x_{i-2}, which must have left for the host
  if (host_ && out_pending_[i % 2]) CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), out_[i % 2].get(), 0));
}

void CheckpointStore::written(int64_t i) {  // device buffer of x_i -> host, on d2h after the compute that made it
  if (!host_) return;
  CUDA_CHECK(cudaEventRecord(made_.get(), dev_.compute.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), made_.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(host_at(i), at(i), n_ * 2, cudaMemcpyDeviceToHost, dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(out_[i % 2].get(), dev_.d2h.get()));
  out_pending_[i % 2] = true;
}

void CheckpointStore::load(int64_t i) {  // host -> device buffer of x_i, on h2d
  CUDA_CHECK(cudaMemcpyAsync(at(i), host_at(i), n_ * 2, cudaMemcpyHostToDevice, dev_.h2d.get()));
  CUDA_CHECK(cudaEventRecord(in_[i % 2].get(), dev_.h2d.get()));
}

void CheckpointStore::begin_backward() {
  if (!host_) return;
  // both input buffers are free once the head is done; x_{L-1} must have reached the host
  CUDA_CHECK(cudaEventRecord(made_.get(), dev_.compute.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.h2d.get(), made_.get(), 0));
  for (auto& e : out_) CUDA_CHECK(cudaStreamWaitEvent(dev_.h2d.get(), e.get(), 0));
  load(L_ - 1);
}

void CheckpointStore::before_backward(int64_t i) {
  if (!host_) return;
  if (i - 1 >= 0) {  // prefetch x_{i-1} into the buffer layer i+1 used
    if (i + 1 <= L_ - 1) CUDA_CHECK(cudaStreamWaitEvent(dev_.h2d.get(), used_[(i + 1) % 2].get(), 0));
    load(i - 1);
  }
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), in_[i % 2].get(), 0));
}

void CheckpointStore::after_backward(int64_t i) {
  if (host_) CUDA_CHECK(cudaEventRecord(used_[i % 2].get(), dev_.compute.get()));
}

// ---- layer-major ----

int CheckpointStore::take_free() {
  RT_CHECK(!ring_free_.empty(), "[engine] internal: the layer-major checkpoint ring has no free buffer");
  const int b = ring_free_.front();
  ring_free_.erase(ring_free_.begin());
  return b;
}

bf16* CheckpointStore::lm_out(int64_t k, int64_t i) {
  if (!host_) return ckpt_.data() + row(k, i) * n_;
  const int b = take_free();
  // its last copy out is done (its last use on the compute stream is queued before this write)
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), ring_out_[b].get(), 0));
  ring_rows_.emplace_back(row(k, i), b);
  return ring_[b].data();
}

void CheckpointStore::lm_written(int64_t k, int64_t i) {
  if (!host_) return;
  const int64_t r = row(k, i);
  auto it = std::find_if(ring_rows_.begin(), ring_rows_.end(), [&](auto& e) { return e.first == r; });
  RT_CHECK(it != ring_rows_.end(), "[engine] internal: checkpoint row ", r, " was not being written");
  const int b = it->second;
  ring_rows_.erase(it);
  CUDA_CHECK(cudaEventRecord(made_.get(), dev_.compute.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), made_.get(), 0));
  CUDA_CHECK(cudaMemcpyAsync(host_at(r), ring_[b].data(), n_ * 2, cudaMemcpyDeviceToHost, dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(ring_out_[b].get(), dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(row_out_[r].get(), dev_.d2h.get()));
  ring_free_.push_back(b);  // the compute stream's use of it is queued; the next user waits for ring_out_
}

void CheckpointStore::lm_prefetch(int64_t k, int64_t i) {
  if (!host_) return;
  const int64_t r = row(k, i);
  for (auto& e : ring_rows_)
    if (e.first == r) return;  // already in (or on its way)
  const int b = take_free();
  cudaStream_t h2d = dev_.h2d.get();
  CUDA_CHECK(cudaStreamWaitEvent(h2d, ring_used_[b].get(), 0));  // its last reader is done
  CUDA_CHECK(cudaStreamWaitEvent(h2d, ring_out_[b].get(), 0));   // its last copy out is done
  CUDA_CHECK(cudaStreamWaitEvent(h2d, row_out_[r].get(), 0));    // the row itself has reached the host
  CUDA_CHECK(cudaMemcpyAsync(ring_[b].data(), host_at(r), n_ * 2, cudaMemcpyHostToDevice, h2d));
  CUDA_CHECK(cudaEventRecord(ring_in_[b].get(), h2d));
  ring_rows_.emplace_back(r, b);
}

const bf16* CheckpointStore::lm_in(int64_t k, int64_t i) {
  if (!host_) return ckpt_.data() + row(k, i) * n_;
  lm_prefetch(k, i);  // no-op when prefetched
  const int64_t r = row(k, i);
  auto it = std::find_if(ring_rows_.begin(), ring_rows_.end(), [&](auto& e) { return e.first == r; });
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), ring_in_[it->second].get(), 0));
  return ring_[it->second].data();
}

void CheckpointStore::lm_done(int64_t k, int64_t i) {
  if (!host_) return;
  const int64_t r = row(k, i);
  auto it = std::find_if(ring_rows_.begin(), ring_rows_.end(), [&](auto& e) { return e.first == r; });
  RT_CHECK(it != ring_rows_.end(), "[engine] internal: checkpoint row ", r, " is not on the device");
  const int b = it->second;
  ring_rows_.erase(it);
  CUDA_CHECK(cudaEventRecord(ring_used_[b].get(), dev_.compute.get()));
  ring_free_.push_back(b);
}

}  // namespace rt::cuda
