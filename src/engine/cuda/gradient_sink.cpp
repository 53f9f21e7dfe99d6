#include "engine/cuda/gradient_sink.h"
#include "engine/cuda/host_wait.h"

#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda/cuda_ops.h"
#include "cuda/sum_squares_order.h"
#include "engine/update_order.h"
#include "optim/adamw.h"

static_assert(rt::cuda::kSumSquaresBlock == rt::kOptimBlock, "the device sum of squares is rt::sum_squares's");

namespace rt::cuda {

GradientSink::GradientSink(HostState& st, EngineDevice& dev, UpdateTracker& track, bool host_grads, bool host_embed,
                           const std::vector<int64_t>& dev_numel)
    : st_(st), dev_(dev), track_(track), host_(host_grads), host_embed_(host_embed) {
  RT_CHECK(dev_numel.empty() || dev_numel.size() == st_.units().size(),
           "[cuda] internal: one device gradient length per unit");
  auto& units = st_.units();
  const int64_t L = st_.spec().n_layers;
  for (size_t u = 0; u < units.size(); ++u) {
    const bool layer = u >= 1 && u <= static_cast<size_t>(L);
    if ((host_ && layer) || (host_embed_ && u == 0))
      grads_.emplace_back();  // layers use the two buffers below
    else
      grads_.emplace_back(dev_.alloc, dev_numel.empty() ? units[u].numel : dev_numel[u],
                          "gradients of " + units[u].name);
  }
  if (host_)
    for (auto& g : layer_grad_) g = DevBuf<float>(dev_.alloc, units[1].numel, "a layer gradient buffer");
  for (auto& g : layer_grad_)
    if (g.data()) CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.bytes(), dev_.compute.get()));
  grad_zeroed_.resize(units.size());
  for (auto& g : grads_) CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.bytes(), dev_.compute.get()));
}

void GradientSink::make_landing(const CudaOptions& o) {
  const ModelSpec& s = st_.spec();
  // host mode: pinned slabs where each unit's gradient (or a piece of it) lands during the backward
  if (host_) {
    DevicePlacement p;  // this sink's placement, as the plan counts it (gradient_landing_bytes)
    p.host_grads = true;
    p.host_embed = host_embed_;
    p.fold = folding();
    slab_elems_ = gradient_landing_slab_elems(s, o);
    for (int r = 0; r < kSlabs; ++r)
      slabs_.emplace_back(static_cast<size_t>(slab_elems_) * 4, "a gradient landing slab");
    slab_done_.resize(kSlabs);
    slab_free_.assign(kSlabs, 1);
    if (const uint64_t d = gradient_landing_sum_doubles(s, p, o)) {
      sums_ = PinnedBuf(kSlabs * sizeof(double), "the gradient landing's sums of squares");
      sum_dev_ = DevBuf<double>(dev_.alloc, static_cast<int64_t>(d), "gradient landing sums of squares");
    }
  } else {  // a pinned ring of chunks the optimizer phase copies gradients through
    chunk_elems_ = gradient_landing_chunk_elems(s, o.landing_chunk_bytes);
    for (int r = 0; r < kRing; ++r)
      ring_.emplace_back(static_cast<size_t>(chunk_elems_) * 4, "a gradient landing chunk");
    ring_done_.resize(kRing);
  }
}

float* GradientSink::dev_grad(size_t u) {
  const bool layer = u >= 1 && u <= static_cast<size_t>(st_.spec().n_layers);
  return host_ && layer ? layer_grad_[u % 2].data() : grads_[u].data();
}

void GradientSink::wait_zeroed(size_t u) {
  if (host_) {  // host mode zeroes its device buffers right before (layers) or after (embed, head) use
    if (u == static_cast<size_t>(st_.spec().n_layers + 1) && head_zero_pending_) {
      CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), head_zeroed_.get(), 0));
      head_zero_pending_ = false;
    }
    return;
  }
  if (track_.step() == 0) return;
  // the optimizer of the last step has queued the copy-out and zeroing of unit u
  {
    HostWait hw("wait: the last step's gradient copy-out");
    track_.wait_grad_issued(u, track_.step());
  }
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), grad_zeroed_[u].get(), 0));
}

void GradientSink::begin_layer(int64_t i) {
  if (!host_) return;
  // the buffer's previous layer has left for the host
  const int gb = static_cast<int>((i + 1) % 2);
  if (layer_grad_pending_[gb]) CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), layer_grad_out_[gb].get(), 0));
  CUDA_CHECK(cudaMemsetAsync(layer_grad_[gb].data(), 0, layer_grad_[gb].bytes(), dev_.compute.get()));
}

void GradientSink::end_layer(int64_t i, bool first_micro) {
  if (!host_) return;
  const int gb = static_cast<int>((i + 1) % 2);
  land(static_cast<size_t>(i + 1), layer_grad_[gb].data(), first_micro);
  CUDA_CHECK(cudaEventRecord(layer_grad_out_[gb].get(), dev_.d2h.get()));
  layer_grad_pending_[gb] = true;
}

void GradientSink::land_head(bool first_micro) {
  if (!host_) return;
  const size_t head = static_cast<size_t>(st_.spec().n_layers + 1);
  land(head, grads_[head].data(), first_micro);
  // the zeroing follows the pieces' copies on d2h; the next head (the next micro-batch's or step's) waits for it
  CUDA_CHECK(cudaMemsetAsync(grads_[head].data(), 0, grads_[head].bytes(), dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(head_zeroed_.get(), dev_.d2h.get()));
  head_landed_ = true;
  head_zero_pending_ = true;
}

void GradientSink::end_backward(bool first_micro) {
  if (!host_) return;
  const size_t head = static_cast<size_t>(st_.spec().n_layers + 1);
  for (size_t u : {size_t{0}, head}) {
    if (host_embed_ && u == 0) {  // its rows were scattered into the host arena (HostEmbedding::land)
      if (fold_) track_.push([this] { fold_(0, 0, st_.units()[0].numel, st_.units()[0].grad.p, nullptr); });
      continue;
    }
    if (u == head && head_landed_) {  // land_head sent it under the backward
      head_landed_ = false;
      continue;
    }
    land(u, grads_[u].data(), first_micro);
    CUDA_CHECK(cudaEventRecord(unit_grad_out_.get(), dev_.d2h.get()));
    CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), unit_grad_out_.get(), 0));
    CUDA_CHECK(cudaMemsetAsync(grads_[u].data(), 0, grads_[u].bytes(), dev_.compute.get()));
  }
}

// Unit u's gradient leaves the device now (d2h, into the pinned slabs, in
// pieces of at most a slab); the worker adds each piece to the host arena (=
// on the first micro-batch) or hands it to the fold hook. The stream order
// is in the header.
void GradientSink::land(size_t u, const float* src, bool first) {
  const int64_t n = st_.units()[u].numel;
  const bool split = n > slab_elems_;
  RT_CHECK(!split || fold_ == nullptr || sums_.as<double>(), "[cuda] internal: unit ", st_.units()[u].name,
           " lands in pieces, but the plan made no room for its sum of squares");
  CUDA_CHECK(cudaEventRecord(grad_made_.get(), dev_.compute.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), grad_made_.get(), 0));
  auto span = dev_.tracer.gpu_begin(Lane::d2h, "grads", static_cast<int>(u) - 1, dev_.d2h.get());
  for (const GradChunk& piece : grad_chunks({n}, {0}, slab_elems_)) {
    const int64_t b = piece.b, e = piece.e;
    const int r = static_cast<int>(landing_counter_++ % kSlabs);
    // the slab's last piece has landed and its consumer is done with it (and its double)
    {
      HostWait hw("wait: a gradient landing slab");
      track_.wait([&] { return slab_free_[r] != 0; });
    }
    track_.update([&] { slab_free_[r] = 0; });
    const bool with_sum = split && fold_ && b == 0;
    if (with_sum) {  // the whole unit's sum of squares, before its first piece updates anything
      double* out = sum_dev_.data() + (cuda::sum_squares_ordered_doubles(n) - 2);
      sum_squares_ordered(out, src, n, sum_dev_.data(), 0.0, dev_.d2h.get());
      CUDA_CHECK(cudaMemcpyAsync(sums_.as<double>() + r, out, sizeof(double), cudaMemcpyDeviceToHost, dev_.d2h.get()));
    }
    CUDA_CHECK(cudaMemcpyAsync(slabs_[r].as<float>(), src + b, static_cast<size_t>(e - b) * 4, cudaMemcpyDeviceToHost,
                               dev_.d2h.get()));
    CUDA_CHECK(cudaEventRecord(slab_done_[r].get(), dev_.d2h.get()));
    track_.push([this, u, r, b, e, first, with_sum] {
      CUDA_CHECK(cudaEventSynchronize(slab_done_[r].get()));
      const float* g = slabs_[r].as<float>();
      if (fold_) {
        fold_(u, b, e, g, with_sum ? sums_.as<double>() + r : nullptr);
        track_.update([&] { slab_free_[r] = 1; });
        return;
      }
      float* dst = st_.units()[u].grad.p + b;
      auto span = dev_.tracer.host_begin("land", static_cast<int>(u) - 1);
      parallel_for(e - b, 1 << 16, [&](int64_t lo, int64_t hi) {
        if (first)
          std::memcpy(dst + lo, g + lo, static_cast<size_t>(hi - lo) * 4);
        else
          for (int64_t i = lo; i < hi; ++i) dst[i] += g[i];
      });
      dev_.tracer.host_end(span);
      track_.update([&] { slab_free_[r] = 1; });
    });
  }
  dev_.tracer.gpu_end(span, dev_.d2h.get());
}

void GradientSink::queue_norms(double* norms, Scratch sc) {
  auto& units = st_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    auto span = dev_.tracer.gpu_begin(Lane::compute, "norm", static_cast<int>(u), dev_.compute.get());
    sum_squares(norms + u, grads_[u].data(), units[u].numel, sc, dev_.compute.get());
    dev_.tracer.gpu_end(span, dev_.compute.get());
  }
}

std::vector<double> GradientSink::host_norms() {
  std::vector<double> norms(st_.units().size(), 0.0);
  track_.push([this, &norms] {
    auto& us = st_.units();
    for (size_t u = 0; u < us.size(); ++u) norms[u] = rt::sum_squares(us[u].grad.p, us[u].numel);
  });
  track_.drain();
  return norms;
}

void GradientSink::copy_chunk(int r, size_t u, int64_t b, int64_t e) {
  CUDA_CHECK(cudaMemcpyAsync(ring_[r].as<float>(), grads_[u].data() + b, static_cast<size_t>(e - b) * 4,
                             cudaMemcpyDeviceToHost, dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(ring_done_[r].get(), dev_.d2h.get()));
}

const float* GradientSink::wait_chunk(int r) {
  CUDA_CHECK(cudaEventSynchronize(ring_done_[r].get()));
  return ring_[r].as<float>();
}

void GradientSink::zero_after_copy(size_t u) {
  CUDA_CHECK(cudaMemsetAsync(grads_[u].data(), 0, grads_[u].bytes(), dev_.d2h.get()));
  CUDA_CHECK(cudaEventRecord(grad_zeroed_[u].get(), dev_.d2h.get()));
}

void GradientSink::copy_to_host() {
  RT_CHECK(!fold_, "[engine] compute_grads is not available with --grads fold (no host gradient arenas)");
  auto& units = st_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    RT_CHECK(units[u].grad.p, "[engine] compute_grads needs a HostState with gradients");
    CUDA_CHECK(
        cudaMemcpy(units[u].grad.p, grads_[u].data(), static_cast<size_t>(units[u].numel) * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemset(grads_[u].data(), 0, grads_[u].bytes()));
  }
}

}  // namespace rt::cuda
