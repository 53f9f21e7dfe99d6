// Checkpoint store: the block inputs x_0..x_L that wait from the forward to
// the backward (where block i is recomputed from x_i). Device mode: one array
// of L+1 inputs. Host mode (--checkpoints host): two device buffers; each
// x_i leaves for pinned host memory on the d2h stream as soon as it is made
// and comes back on the h2d stream one layer ahead of the backward that needs
// it; events keep a buffer from being overwritten before its copy is done.
//
// Layer-major (backend.h): K sets of inputs x_i^k, k < K. Device mode: one
// array of K x (L+1) inputs. Host mode: K x (L+1) pinned rows that visit the
// device through a ring of kCheckpointRing buffers (device_plan.h): an output
// leaves on d2h as soon as it is made, an input comes in on h2d one step
// ahead (lm_prefetch) behind the copy out of that very row; a buffer is
// reused only after its copy out and its last use are done. The schedule
// calls the same lm_* methods in both modes.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/cuda/engine_device.h"

namespace rt::cuda {

class CheckpointStore {
 public:
  // row_elems: elements of one block input (N x C); sets: K (layer-major) or 1.
  // Host mode checks the pinned bytes against the free host RAM first.
  CheckpointStore(EngineDevice& dev, int64_t n_layers, int64_t row_elems, bool on_host, int64_t sets = 1);
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

  // ---- layer-major: input i of micro-batch k ----
  // A device buffer for the compute stream to write x_i^k into.
  bf16* lm_out(int64_t k, int64_t i);
  // x_i^k has been queued on the compute stream: host mode sends it out.
  void lm_written(int64_t k, int64_t i);
  // Host mode: queue x_i^k's copy in now (it is used a step later).
  void lm_prefetch(int64_t k, int64_t i);
  // x_i^k on the device, the compute stream waiting for its copy in.
  const bf16* lm_in(int64_t k, int64_t i);
  // The compute stream's last use of input x_i^k is queued.
  void lm_done(int64_t k, int64_t i);

 private:
  uint16_t* host_at(int64_t i) { return host_buf_.as<uint16_t>() + i * n_; }
  void load(int64_t i);
  EngineDevice& dev_;
  int64_t L_, n_;
  bool host_;
  DevBuf<bf16> ckpt_;   // device mode: (L+1) x N x C
  PinnedBuf host_buf_;  // host mode: (L+1) x N x C
  DevBuf<bf16> xbuf_[2];
  Event out_[2], in_[2], used_[2], made_;
  bool out_pending_[2] = {false, false};
  // layer-major
  int64_t sets_;
  int64_t row(int64_t k, int64_t i) const { return k * (L_ + 1) + i; }
  int take_free();  // a ring buffer whose last use is queued (host mode)
  std::vector<DevBuf<bf16>> ring_;
  std::vector<Event> ring_used_, ring_out_, ring_in_;
  std::vector<int> ring_free_;                      // FIFO: the least recently freed first
  std::vector<std::pair<int64_t, int>> ring_rows_;  // rows in a ring buffer (fetched or being written)
  std::vector<Event> row_out_;                      // per host row: its copy out is done
};

}  // namespace rt::cuda
