#include "engine/cuda/optimizer_phase.h"
#include "engine/cuda/host_wait.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "engine/sharded_optimizer.h"
#include "engine/update_order.h"
#include "optim/adamw.h"
#include "state/state_tier.h"

namespace rt::cuda {

void OptimizerPhase::run_host(const OptimStep& step_o, float coef, bool apply, int64_t step) {
  OptimStep o = step_o;
  o.orthogonalizer = orth_;
  auto& units = st_.units();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_params = 0;
  auto one = [&](size_t u) {
    if (apply) {
      auto span = dev_.tracer.host_begin(units[u].muon ? "muon" : "adamw", static_cast<int>(u) - 1);
      update_unit(units[u], units[u].grad.p, o, coef, weights_.shadow(0, u));  // in place (no delayed mode here)
      dev_.tracer.host_end(span);
      weights_.upload_paged(u);  // paged weights: to the device while u is paged in (before the tier releases it)
      n_params += units[u].numel;
    }
    track_.mark_updated(u, step);
  };
  if (apply)  // --state-dir: each unit's state paged in ahead, written back behind (state/state_tier.h)
    for_each_unit_state(st_, update_order(units.size(), false), one);
  else
    for (size_t u = 0; u < units.size(); ++u) one(u);
  finished(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_params);
}

void OptimizerPhase::begin_fold(const OptimStep& o, bool apply, int64_t version) {
  HostWait hw("wait: the last step's fold");
  track_.wait([&] { return !fold_busy_; });  // the last step's fold jobs are all done
  fold_o_ = o;
  fold_o_.orthogonalizer = orth_;
  fold_apply_ = apply;
  fold_version_ = version;
  fold_clip_ = FoldClip(o.clip);
  fold_order_ = fold_order(st_.spec().n_layers);
  fold_next_ = 0;
  if (StateTier* t = st_.tier(); t && apply) t->prefetch_next_paged(fold_order_, 0);  // --state-dir: the first one
  fold_seconds_ = 0;
  fold_params_ = 0;
  deferred_.clear();  // the last step's ran before its fold jobs were done
  track_.update([&] {
    fold_sq_.assign(st_.units().size(), 0.0);
    folded_ = 0;
    fold_busy_ = true;
  });
}

uint64_t OptimizerPhase::enable_fold_defer(double fraction, uint64_t max_bytes) {
  if (st_.tier() || dp_.on() || fraction <= 0) return 0;
  std::vector<int64_t> numel;
  for (size_t u : fold_order(st_.spec().n_layers)) numel.push_back(st_.units()[u].numel);
  FoldDefer d = fold_defer_plan(numel, fraction, max_bytes);
  if (d.at.empty()) return 0;
  defer_buf_.reset(new float[static_cast<size_t>(d.elems)]);
  float* buf = defer_buf_.get();
  parallel_for(d.elems, 1 << 20, [&](int64_t lo, int64_t hi) {  // touched now, not in the first step's backward
    std::memset(buf + lo, 0, static_cast<size_t>(hi - lo) * 4);
  });
  defer_at_ = std::move(d.at);
  return static_cast<uint64_t>(d.elems) * 4;
}

void OptimizerPhase::run_deferred() {
  // forward order: the reverse of fold order (the last layers, then the head)
  for (auto it = deferred_.rbegin(); it != deferred_.rend(); ++it) {
    StateUnit& un = st_.units()[it->u];
    const auto t0 = std::chrono::steady_clock::now();
    auto span = dev_.tracer.host_begin("fold", static_cast<int>(it->u) - 1);
    update_unit_range(un, 0, un.numel, defer_buf_.get() + defer_at_[it->slot], fold_o_, it->coef,
                      weights_.shadow(0, it->u));
    dev_.tracer.host_end(span);
    fold_params_ += un.numel;
    fold_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    track_.mark_updated(it->u, fold_version_);
  }
  deferred_.clear();
}

void OptimizerPhase::fold(size_t u, int64_t b, int64_t e, const float* g, const double* sumsq) {
  StateUnit& un = st_.units()[u];
  const auto t0 = std::chrono::steady_clock::now();
  auto span = dev_.tracer.host_begin("fold", static_cast<int>(u) - 1);
  StateTier* tier = fold_apply_ ? st_.tier() : nullptr;  // --state-dir: u's state in, the next one's read ahead
  if (b == 0) {  // the unit's first piece (or the whole unit): its clip coefficient, before any element updates
    RT_CHECK(fold_next_ < fold_order_.size() && fold_order_[fold_next_] == u, "[engine] unit ", u,
             " landed out of the fold order");
    RT_CHECK(sumsq || e == un.numel, "[engine] internal: unit ", un.name,
             " lands in pieces without its sum of squares");
    ++fold_next_;
    // the CPU sum (as host mode), or for a unit in pieces the device's in the same order: the same double
    const double sq = sumsq ? *sumsq : rt::sum_squares(g, un.numel);
    fold_unit_sq_ = sq;
    fold_coef_ = fold_clip_.next(sq);
    // deferred: one of the first defer_at_.size() units in fold order, with an update to make
    fold_defer_now_ = fold_next_ - 1 < defer_at_.size() && fold_apply_ && std::isfinite(sq);
    track_.update([&] {  // the step's norm is known before its last update is done
      fold_sq_[u] = sq;
      ++folded_;
    });
    if (tier) {  // the next paged unit read ahead, past kept ones (the SSD busy while their gradients land)
      tier->prefetch_next_paged(fold_order_, fold_next_);
      tier->acquire(u);
    }
  } else {
    RT_CHECK(fold_next_ > 0 && fold_order_[fold_next_ - 1] == u && b == fold_at_, "[engine] internal: unit ", un.name,
             " piece [", b, ", ", e, ") landed out of order");
  }
  fold_at_ = e;
  if (fold_defer_now_) {  // aside, for run_deferred (the slab is reused once this returns)
    float* dst = defer_buf_.get() + defer_at_[fold_next_ - 1] + b;
    parallel_for(e - b, 1 << 16,
                 [&](int64_t lo, int64_t hi) { std::memcpy(dst + lo, g + lo, static_cast<size_t>(hi - lo) * 4); });
  } else if (fold_apply_ && std::isfinite(fold_unit_sq_)) {
    update_unit_range(un, b, e, g, fold_o_, fold_coef_, weights_.shadow(0, u));  // in place (no delayed mode here)
    fold_params_ += e - b;
  }
  const bool unit_done = e == un.numel;
  // paged weights: the whole updated unit to the device before the tier releases it (no tier defers)
  if (unit_done && fold_apply_ && std::isfinite(fold_unit_sq_) && !fold_defer_now_) weights_.upload_paged(u);
  if (tier && unit_done) tier->release(u, std::isfinite(fold_unit_sq_));
  dev_.tracer.host_end(span);
  fold_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!unit_done) return;
  if (fold_defer_now_)
    deferred_.push_back({u, fold_next_ - 1, fold_coef_});
  else
    track_.mark_updated(u, fold_version_);
  if (fold_next_ == fold_order_.size()) {
    run_deferred();
    track_.update([&] {
      seconds_ = fold_seconds_;
      params_ = fold_params_;
      fold_busy_ = false;
    });
  }
}

std::vector<double> OptimizerPhase::wait_folded(bool* all_applied) {
  {
    HostWait hw("wait: this step's fold");
    track_.wait([&] { return folded_ == fold_sq_.size(); });
  }
  // fold_clip_ saw every unit before the last norm was recorded
  return track_.read([&] {
    *all_applied = fold_apply_ && fold_clip_.all_finite();
    return fold_sq_;
  });
}

// Data parallel: the chunks of each unit's own slice [r.b, r.e) (an empty
// slice is one empty chunk: its buffer is still zeroed and the unit marked).
void OptimizerPhase::run_sharded(const OptimStep& o, float coef, bool apply, int64_t step) {
  auto& units = st_.units();
  struct Piece {
    size_t u;
    int64_t b, e;
    bool last;
  };
  std::vector<Piece> pieces;
  const int64_t ce = grads_.chunk_elems();
  for (size_t u : update_order(units.size(), false)) {
    const ShardRange r = dp_.shard->range(u);
    if (r.e == r.b) pieces.push_back({u, r.b, r.b, true});
    for (int64_t b = r.b; b < r.e; b += ce) pieces.push_back({u, b, std::min(r.e, b + ce), b + ce >= r.e});
  }
  constexpr int kRing = GradientSink::kRing;
  auto issue = [&](size_t c) {
    const Piece& p = pieces[c];
    if (p.e > p.b) grads_.copy_chunk(static_cast<int>(c % kRing), p.u, p.b, p.e);
    if (!p.last) return;
    grads_.zero_after_copy(p.u);  // the whole padded buffer
    track_.mark_grad_issued(p.u, step);
  };
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_params = 0;
  for (size_t c = 0; c < std::min<size_t>(kRing, pieces.size()); ++c) issue(c);
  for (size_t c = 0; c < pieces.size(); ++c) {
    const Piece& p = pieces[c];
    if (p.e > p.b) {
      const float* g = grads_.wait_chunk(static_cast<int>(c % kRing));
      if (apply) {
        dp_.shard->update_piece(p.u, p.b, p.e, g, o, coef, weights_.shadow(0, p.u));
        n_params += p.e - p.b;
      }
    }
    if (c + kRing < pieces.size()) issue(c + kRing);
    if (p.last) track_.mark_updated(p.u, step);
  }
  finished(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_params);
}

void OptimizerPhase::run(const OptimStep& o, float coef, bool apply, int64_t step, cudaEvent_t backward_done) {
  if (grads_.on_host()) return run_host(o, coef, apply, step);
  if (dp_.on()) {
    CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), backward_done, 0));  // after the reduce-scatters
    return run_sharded(o, coef, apply, step);
  }
  RT_CHECK(!st_.units()[0].muon, "[engine] Muon updates whole units: device gradients cannot reach it (the plan "
                                 "picks host or fold gradients for --optimizer muon)");
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
  // --state-dir (state/state_tier.h): a unit's state is paged in before its first chunk (the next unit's read
  // ahead) and written back after its last
  StateTier* tier = apply ? st_.tier() : nullptr;
  const std::vector<size_t> order = update_order(U, delayed);
  size_t unit_k = 0;
  if (tier) tier->prefetch_next_paged(order, 0);
  for (size_t c = 0; c < std::min<size_t>(kRing, chunks.size()); ++c) issue(c);
  Tracer::Span host_span;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const GradChunk& ch = chunks[c];
    StateUnit& un = units[ch.u];
    const float* g = grads_.wait_chunk(static_cast<int>(c % kRing));
    if (tier && ch.b == 0) {
      tier->prefetch_next_paged(order, ++unit_k);
      tier->acquire(ch.u);
    }
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
    if (apply && ch.e == un.numel) weights_.upload_paged(ch.u);  // paged weights: before the tier releases u
    if (tier && ch.e == un.numel) tier->release(ch.u, true);
    if (ch.e == un.numel && weights_.split()) un.cur_shadow = shadow;  // also after a skipped step
    if (ch.e < un.numel)
      track_.mark_progress(ch.u, step, ch.e);
    else
      track_.mark_updated(ch.u, step);
  }
  finished(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), n_params);
}

}  // namespace rt::cuda
