#include "engine/cuda/checkpoint_store.h"

namespace rt::cuda {

CheckpointStore::CheckpointStore(EngineDevice& dev, int64_t n_layers, int64_t row_elems, bool on_host)
    : dev_(dev), L_(n_layers), n_(row_elems), host_(on_host) {
  if (host_) {
    host_buf_ = PinnedBuf(static_cast<uint64_t>(L_ + 1) * n_ * 2, "block checkpoints");
    for (auto& x : xbuf_) x = DevBuf<bf16>(dev_.alloc, n_, "a block input buffer");
  } else {
    ckpt_ = DevBuf<bf16>(dev_.alloc, (L_ + 1) * n_, "block checkpoints");
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

}  // namespace rt::cuda
