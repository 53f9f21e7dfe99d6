// Checkpoint store: the block inputs x_0..x_L that wait from the forward to
// the backward (where block i is recomputed from x_i). Device mode: one array
// of L+1 inputs. Host mode (--checkpoints host): two device buffers; each
// x_i leaves for pinned host memory on the d2h stream as soon as it is made
// and comes back on the h2d stream one layer ahead of the backward that needs
// it; events keep a buffer from being overwritten before its copy is done.
#pragma once
#include <cstdint>

#include "engine/cuda/engine_device.h"

namespace rt::cuda {

class CheckpointStore {
 public:
  // row_elems: elements of one block input (N x C).
  CheckpointStore(EngineDevice& dev, int64_t n_layers, int64_t row_elems, bool on_host);
  bool on_host() const { return host_; }
  // The device buffer of block input i.
  bf16* at(int64_t i) { return host_ ? xbuf_[i % 2].data() : ckpt_.data() + i * n_; }

  // ---- forward ----
  // The compute stream may write x_i (host mode: the buffer's previous
  // input has left for the host).
  void before_write(int64_t i);
  // x_i has been queued on the compute stream (training): host mode sends it out.
  void written(int64_t i);

  // ---- backward ----
  // The head is done: host mode queues x_{L-1} back in.
  void begin_backward();
  // Block i's backward comes next: prefetch x_{i-1}, the compute stream waits for x_i.
  void before_backward(int64_t i);
  // Block i's backward is queued: its buffer may be refilled.
  void after_backward(int64_t i);

 private:
  uint16_t* host_at(int64_t i) { return host_buf_.as<uint16_t>() + i * n_; }
  void load(int64_t i);
  EngineDevice& dev_;
  int64_t L_, n_;
  bool host_;
  DevBuf<bf16> ckpt_;  // device mode: (L+1) x N x C
  PinnedBuf host_buf_;  // host mode: (L+1) x N x C
  DevBuf<bf16> xbuf_[2];
  Event out_[2], in_[2], used_[2], made_;
  bool out_pending_[2] = {false, false};
};

}  // namespace rt::cuda
