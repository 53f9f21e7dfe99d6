#include "engine/cuda/optimizer_phase.h"

#include <chrono>
#include <cstring>
#include <vector>

#include "engine/update_order.h"

namespace rt::cuda {

void OptimizerPhase::run_host(const OptimStep& o, float coef, bool apply, int64_t step) {
  auto& units = st_.units();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_params = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (apply) {
      auto span = dev_.tracer.host_begin("adamw", static_cast<int>(u) - 1);
      update_unit(units[u], units[u].grad.p, o, coef, weights_.shadow(0, u));  // in place (no delayed mode here)
      dev_.tracer.host_end(span);
      n_params += units[u].numel;
    }
    track_.mark_updated(u, step);
  }
  finished(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_params);
}

void OptimizerPhase::run(const OptimStep& o, float coef, bool apply, int64_t step, cudaEvent_t backward_done) {
  if (grads_.on_host()) return run_host(o, coef, apply, step);
  auto& units = st_.units();
  const size_t U = units.size();
  const bool delayed = track_.delayed();
  CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), backward_done, 0));
  std::vector<int64_t> numel(U);
  for (size_t u = 0; u < U; ++u) numel[u] = units[u].numel;
  const std::vector<GradChunk> chunks = grad_chunks(numel, update_order(U, delayed), grads_.chunk_elems());
  const int shadow = delayed ? static_cast<int>(step % 2) : 0;
  constexpr int kRing = GradientSink::kRing;
  // Chunk c goes device -> ring slot c % kRing; after a unit's last chunk its
  // device buffer is zeroed on the same stream.
  Tracer::Span d2h_span;
  auto issue = [&](size_t c) {
    const GradChunk& ch = chunks[c];
    if (ch.b == 0) d2h_span = dev_.tracer.gpu_begin(Lane::d2h, "grads", static_cast<int>(ch.u) - 1, dev_.d2h.get());
    grads_.copy_chunk(static_cast<int>(c % kRing), ch.u, ch.b, ch.e);
    if (ch.e < units[ch.u].numel) return;
    grads_.zero_after_copy(ch.u);
    dev_.tracer.gpu_end(d2h_span, dev_.d2h.get());
    track_.mark_grad_issued(ch.u, step);
  };
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_params = 0;
  for (size_t c = 0; c < std::min<size_t>(kRing, chunks.size()); ++c) issue(c);
  Tracer::Span host_span;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const GradChunk& ch = chunks[c];
    StateUnit& un = units[ch.u];
    const float* g = grads_.wait_chunk(static_cast<int>(c % kRing));
    if (apply) {
      if (ch.b == 0) host_span = dev_.tracer.host_begin("adamw", static_cast<int>(ch.u) - 1);
      // split master: the update reads the master's upper half from the other
      // shadow in delayed mode (it holds the weights before this update)
      const uint16_t* prev = weights_.split() && delayed ? weights_.shadow(1 - shadow, ch.u) : nullptr;
      update_unit_range(un, ch.b, ch.e, g, o, coef, weights_.shadow(shadow, ch.u), prev);
      n_params += ch.e - ch.b;
      if (ch.e == un.numel) dev_.tracer.host_end(host_span);
    } else if (delayed) {  // a skipped step: the other shadow must still hold the current weights
      std::memcpy(weights_.shadow(shadow, ch.u) + ch.b, weights_.shadow(static_cast<int>((step + 1) % 2), ch.u) + ch.b,
                  static_cast<size_t>(ch.e - ch.b) * 2);
    }
    if (c + kRing < chunks.size()) issue(c + kRing);
    if (ch.e == un.numel && weights_.split()) un.cur_shadow = shadow;  // also after a skipped step
    if (ch.e < un.numel)
      track_.mark_progress(ch.u, step, ch.e);
    else
      track_.mark_updated(ch.u, step);
  }
  finished(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_params);
}

}  // namespace rt::cuda
