// Gradient sink: where the backward's fp32 weight gradients go.
// Device mode: one device buffer per unit keeps every gradient until the
// global norm is known (exact clipping); the optimizer phase copies each out
// in chunks through a small pinned ring (copy_chunk / wait_chunk) and zeroes
// the buffer for the next step (zero_after_copy), which the next backward
// waits for (wait_zeroed).
// Host mode (--grads host): each layer's gradient is made in one of two
// device buffers, leaves on the d2h stream into one of three pinned slabs
// as soon as the layer's backward is queued, and the worker adds it into the
// unit's host arena (= on the first micro-batch of the step, += after); the
// head's buffer leaves as soon as the micro-batch's (layer-major: the last
// micro-batch's) head is queued, under the backward (land_head: its zeroing
// follows its copy on d2h, and the next head waits for that), a device
// embedding's at the end of the backward.
// Fold mode (--grads fold): the same landing, but the worker hands each
// unit's whole step gradient to the fold hook (the optimizer) instead of
// adding it to a host arena; only a host embedding keeps its arena (its rows
// are scattered into it), folded once the backward is done.
// The slabs hold the largest layer (engine/device_plan.h
// gradient_landing_slab_elems), not the largest unit: a larger unit (the LM
// head, a tied embedding) lands in slab-sized pieces, in order, each added
// (host) or handed to the fold hook (fold) as it lands. The fold clips a unit
// by its sum of squares before its first element updates, so for a unit in
// pieces the d2h stream first sums the whole device gradient in
// rt::sum_squares's order (cuda_ops.h sum_squares_ordered: the CPU's double,
// bit for bit) and copies it beside the first piece.
// Stream order of one landing (land()): the compute stream records
// grad_made_ once the unit's gradient is complete; d2h waits for it, then per
// piece: [fold, split unit, first piece: the device sum -> sums_[r]] the
// piece -> slab r, slab_done_[r]. Slab r is claimed on the host (slab_free_[r]
// = 0) before anything is queued into it, and freed by the worker only after
// it synchronised slab_done_[r] and consumed the piece (and sums_[r]), so a
// slab or its double is never rewritten before its copy landed and its
// consumer finished. The device sum's block sums (sum_dev_) are used on d2h
// only, one unit after another: stream order keeps them apart. The source
// buffer is rewritten only after d2h passes the event the caller records
// behind land() (layer_grad_out_, unit_grad_out_), i.e. after every piece.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/cuda/engine_device.h"
#include "engine/device_plan.h"
#include "engine/update_tracker.h"
#include "state/host_state.h"
#include "state/moment_quant.h"

namespace rt::cuda {

class GradientSink {
 public:
  // Device-mode chunks in flight between the device and the optimizer (4 x
  // 16 MiB by default instead of unit-sized slabs: as fast on the H200 host,
  // 6.6 GiB less pinned RAM at 7B; bench/RESULTS.md); kChunkAlign keeps every
  // chunk 64-byte aligned in the arenas (units and tensors are 16-float aligned).
  // (engine/device_plan.h's constants: plan counts the same bytes, gradient_landing_bytes)
  static constexpr int kRing = kGradLandingRing;
  static constexpr int64_t kChunkAlign = kGradChunkAlign;
  static_assert(kChunkAlign % kQuantBlock == 0, "gradient chunks must cut units at quantization-block bounds");
  static constexpr int kSlabs = kGradLandingSlabs;

  // dev_numel: elements of each unit's device buffer, numel or more (the LM
  // head's padding rows, engine/device_plan.h device_unit_numels; data
  // parallel: world * S, the reduce-scatter's padded length; the padding
  // stays zero); empty: numel.
  GradientSink(HostState& st, EngineDevice& dev, UpdateTracker& track, bool host_grads, bool host_embed,
               const std::vector<int64_t>& dev_numel = {});
  // The pinned slabs (host mode) or ring (device mode), sized by o
  // (landing_slab_bytes, landing_chunk_bytes, muon; engine/device_plan.h),
  // and fold's device sums: made after the rest of the device plan, like the
  // engine always did; set_fold before.
  void make_landing(const CudaOptions& o);
  bool on_host() const { return host_; }
  // Fold mode: fold(u, b, e, g, sumsq) runs on the worker for elements [b, e)
  // of unit u's step gradient (g[0] is element b), the pieces of a unit in
  // order and the units in the order they land (engine/fold_clip.h's
  // fold_order). A unit landing whole comes as one piece [0, numel) with
  // sumsq null (the fold sums it on the CPU); a unit in pieces has its
  // device sum of squares (rt::sum_squares's double) in *sumsq with its first
  // piece, null with the others. Null hook: host mode adds into the host arenas.
  using FoldFn = std::function<void(size_t u, int64_t b, int64_t e, const float* g, const double* sumsq)>;
  void set_fold(FoldFn fold) { fold_ = std::move(fold); }
  bool folding() const { return static_cast<bool>(fold_); }

  // The device buffer receiving unit u's gradient.
  float* dev_grad(size_t u);
  // Device mode: the compute stream waits until the last step's copy-out and
  // zeroing of unit u's buffer is done (no-op on the first step). Host mode:
  // the head's buffer, until land_head's zeroing is done; no-op for others.
  void wait_zeroed(size_t u);

  // ---- host mode, during the backward ----
  // Layer i's buffer may be written: its previous layer has left; zeroed.
  void begin_layer(int64_t i);
  // Layer i's backward is queued: its gradient leaves for the host.
  void end_layer(int64_t i, bool first_micro);
  // The step's (micro-batch-major: the micro-batch's) last head is queued:
  // the head's gradient leaves now, under the backward; its buffer is zeroed
  // on d2h behind the copy (wait_zeroed(head) makes the next head wait).
  void land_head(bool first_micro);
  // The backward is done: a device embedding's gradient leaves (and the
  // head's, if land_head did not send it), then the buffers are zeroed.
  void end_backward(bool first_micro);

  // ---- the global norm ----
  // Device mode: queue per-unit sums of squares into norms[u] on the compute stream.
  void queue_norms(double* norms, Scratch sc);
  // Host mode: per-unit sums of squares of the host arenas (on the worker).
  std::vector<double> host_norms();

  // ---- device mode, the optimizer phase (worker thread) ----
  int64_t chunk_elems() const { return chunk_elems_; }
  // Queues elements [b, e) of unit u's gradient into ring slot r on d2h.
  void copy_chunk(int r, size_t u, int64_t b, int64_t e);
  // Waits for ring slot r's copy; its gradients.
  const float* wait_chunk(int r);
  // Queues the zeroing of unit u's buffer behind its copies (d2h).
  void zero_after_copy(size_t u);

  // Test hook (compute_grads): device-mode gradients -> the host arenas, buffers zeroed.
  void copy_to_host();

 private:
  void land(size_t u, const float* src, bool first_micro);
  HostState& st_;
  EngineDevice& dev_;
  UpdateTracker& track_;
  bool host_, host_embed_;
  FoldFn fold_;
  std::vector<DevBuf<float>> grads_;  // per unit (host mode: embedding and head only)
  std::vector<Event> grad_zeroed_;
  DevBuf<float> layer_grad_[2];  // host mode: layers alternate between two buffers
  Event layer_grad_out_[2], unit_grad_out_, grad_made_, head_zeroed_;
  bool head_landed_ = false;        // land_head sent this micro-batch's head gradient
  bool head_zero_pending_ = false;  // its zeroing on d2h: the next head waits for head_zeroed_
  bool layer_grad_pending_[2] = {false, false};
  std::vector<PinnedBuf> slabs_;  // host mode: landing slabs of slab_elems_ floats
  std::vector<Event> slab_done_;
  std::vector<int> slab_free_;  // guarded by the tracker's mutex
  int64_t landing_counter_ = 0;
  int64_t slab_elems_ = 0;
  PinnedBuf sums_;          // fold, units in pieces: a double per slab (a unit's sum of squares, with its first piece)
  DevBuf<double> sum_dev_;  // ... its block sums, then the sum (d2h stream only)
  std::vector<PinnedBuf> ring_;  // device mode: the optimizer's landing chunks
  std::vector<Event> ring_done_;
  int64_t chunk_elems_ = 0;
};

}  // namespace rt::cuda
