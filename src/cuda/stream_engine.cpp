// The CUDA streaming engine: layers stream through the GPU from host RAM.
//
// Host (HostState + this file): fp32 master, m, v per unit in ordinary memory;
// a bf16 shadow of every unit in pinned memory of exact size, which the
// optimizer rewrites after each update; pinned slabs where gradients land.
// Device: S weight slots (layer i lives in slot i % S), the embedding and the
// head resident, block checkpoints x_i, one block's activations (plus those of
// the last K layers, kept from forward to backward when memory allows), and fp32
// gradient buffers per unit (kept on the device until the global norm is
// known: exact clipping). With host gradients (the low-memory setting) layer
// gradients leave per layer, and an untied embedding stays on the host: the
// forward gathers its rows from the pinned shadow on the CPU and copies the
// N x C block in; the backward copies the residual gradient out and the CPU
// scatters it into the host gradient (cpu::embedding_backward: the order of
// the CUDA kernel, so the weights are bit-identical to the device modes).
//
// Streams: h2d (weights in), compute, d2h (gradients out); events join them.
// One step:
//   forward 0..L-1: layer i waits for its slot's load; after layer i's work is
//     queued, the load of layer i+S into the same slot is queued behind it;
//   turn-around: the last S layers are still in their slots and are reused;
//   backward L-1..0: recompute block i from x_i (unless its activations were
//     kept: --keep-activations), back-propagate, and queue the
//     load of layer i-S into the freed slot (prefetch, never load-then-wait);
//   norm: per-unit sums of squares on the device, summed in unit order;
//   optimizer (worker thread, CPU pool): in forward order, each unit's grads
//     go device -> host in chunks through a small pinned ring (d2h), AdamW
//     updates master/m/v chunk by chunk as they land and writes the bf16
//     shadow; the next step's load of unit u waits only on u's update.
// Delayed update (backend.h): two bf16 shadows; step t's optimizer writes
//   shadow t % 2 while step t+1 trains on the weights of update t-1 (shadow
//   (t-1) % 2), and it runs in backward order (head, embedding, last layer
//   first) so that step t+1's backward finds each unit's gradient buffer
//   already copied out and zeroed.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/device_info.h"
#include "cuda/trace.h"
#include "engine/backend.h"
#include "model/block.h"

namespace rt {

bool cuda_backend_available() { return cuda::device_count() > 0; }

namespace cuda {
namespace {

template <class T, class P>
BlockWeightsT<T> bind_weights(const StateUnit& u, P* base) {
  BlockWeightsT<T> w{};
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const T* p = reinterpret_cast<const T*>(base) + u.offsets[k];
    switch (u.entries[k].kind) {
      case WeightKind::attn_norm: w.attn_norm = p; break;
      case WeightKind::q_proj: w.q_proj = p; break;
      case WeightKind::q_bias: w.q_bias = p; break;
      case WeightKind::k_proj: w.k_proj = p; break;
      case WeightKind::k_bias: w.k_bias = p; break;
      case WeightKind::v_proj: w.v_proj = p; break;
      case WeightKind::v_bias: w.v_bias = p; break;
      case WeightKind::q_norm: w.q_norm = p; break;
      case WeightKind::k_norm: w.k_norm = p; break;
      case WeightKind::o_proj: w.o_proj = p; break;
      case WeightKind::mlp_norm: w.mlp_norm = p; break;
      case WeightKind::gate_proj: w.gate_proj = p; break;
      case WeightKind::up_proj: w.up_proj = p; break;
      case WeightKind::down_proj: w.down_proj = p; break;
      default: fail("[engine] unexpected tensor ", u.entries[k].name, " in a decoder layer");
    }
  }
  return w;
}

BlockGrads bind_grads(const StateUnit& u, float* base) {
  BlockWeightsT<float> v = bind_weights<float>(u, base);
  auto m = [](const float* p) { return const_cast<float*>(p); };
  return BlockGrads{m(v.attn_norm), m(v.q_proj), m(v.q_bias), m(v.k_proj), m(v.k_bias), m(v.v_proj), m(v.v_bias),
                    m(v.q_norm),    m(v.k_norm), m(v.o_proj), m(v.mlp_norm), m(v.gate_proj), m(v.up_proj),
                    m(v.down_proj)};
}

int64_t entry_offset(const StateUnit& u, WeightKind k) {
  for (size_t i = 0; i < u.entries.size(); ++i)
    if (u.entries[i].kind == k) return u.offsets[i];
  return -1;
}

// A FIFO of host jobs run one at a time on a worker thread (the optimizer).
class Worker {
 public:
  Worker() : t_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    t_.join();
  }
  void push(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  void rethrow_if_failed() {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
      if (q_.empty() && stop_) return;
      auto f = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lk.unlock();
      try {
        if (!error_) f();
      } catch (...) {
        std::lock_guard<std::mutex> g(err_mu_);
        error_ = std::current_exception();
      }
      lk.lock();
      busy_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_, err_mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> q_;
  bool stop_ = false, busy_ = false;
  std::exception_ptr error_;
  std::thread t_;
};

class StreamEngine final : public Backend {
 public:
  StreamEngine(HostState& st, int64_t B, int64_t T, const CudaOptions& opt)
      : st_(st), s_(st.spec()), B_(B), T_(T), N_(B * T), opt_(opt), alloc_(budget(opt)), tracer_(opt.trace_path) {
    const int64_t L = s_.n_layers;
    check_shapes();
    S_ = opt.resident ? static_cast<int>(L) : std::max(2, std::min<int>(opt.slots, static_cast<int>(L)));
    auto& units = st_.units();
    layer_numel_ = units[1].numel;
    delayed_ = opt.delayed_update;
    // pinned bf16 shadows, exact size, filled from the fp32 master (two of each in delayed mode)
    for (int k = 0; k < (delayed_ ? 2 : 1); ++k)
      for (auto& u : units) {
        shadow_[k].emplace_back(static_cast<size_t>(u.numel) * 2,
                                cat(delayed_ ? "a bf16 shadow (delayed update: two per unit) of " : "the bf16 shadow of ", u.name));
        uint16_t* sh = shadow_[k].back().as<uint16_t>();
        const float* m = u.master();
        parallel_for(u.numel, 1 << 16, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) sh[i] = f32_to_bf16(m[i]);
        });
      }
    updated_.assign(units.size(), 0);
    progress_.assign(units.size(), 0);
    progress_step_.assign(units.size(), -1);
    grad_issued_.assign(units.size(), 0);
    // where gradients and checkpoints live (auto: the device, unless they would take a large part of it)
    const uint64_t dev_grad_bytes = static_cast<uint64_t>(layer_numel_) * 4 * L;
    const uint64_t ckpt_bytes = static_cast<uint64_t>(L + 1) * N_ * s_.hidden * 2;
    auto pick = [](const std::string& v, bool big, const char* what) {
      RT_CHECK(v == "auto" || v == "device" || v == "host", "[cuda] --", what, " must be auto, device or host, got '", v, "'");
      return v == "host" || (v == "auto" && big);
    };
    host_grads_ = pick(opt.grads, !delayed_ && dev_grad_bytes > alloc_.budget() / 3, "grads");
    if (delayed_ && host_grads_)
      fail("[cuda] --delayed-update needs the gradients on the device (--grads device), not --grads host: with host "
           "gradients each layer's gradient lands in the host arena the pending update still reads. Drop "
           "--delayed-update, or use --grads device if ", dev_grad_bytes >> 20, " MiB of fp32 gradients fit");
    host_ckpt_ = pick(opt.checkpoints, ckpt_bytes > alloc_.budget() / 4, "checkpoints");
    if (host_grads_) st_.ensure_grads();
    host_embed_ = host_grads_ && !s_.tie_embeddings;  // a tied table is the LM head too: it stays on the device
    // device state
    if (host_embed_) {
      embed_rows_ = PinnedBuf(static_cast<size_t>(N_ * s_.hidden) * 2, "embedding rows of a micro-batch");
      embed_dx_ = PinnedBuf(static_cast<size_t>(N_ * s_.hidden) * 2, "the embedding's output gradient");
    } else {
      embed_w_ = DevBuf<bf16>(alloc_, units[0].numel, "the embedding");
    }
    head_w_ = DevBuf<bf16>(alloc_, units[L + 1].numel, "the final norm and LM head");
    for (int s = 0; s < S_; ++s) slots_.emplace_back(alloc_, layer_numel_, "a layer weight slot");
    slot_layer_.assign(S_, -1);
    slot_version_.assign(S_, -1);
    slot_loaded_.resize(S_);
    slot_free_.resize(S_);
    for (size_t u = 0; u < units.size(); ++u) {
      const bool layer = u >= 1 && u <= static_cast<size_t>(L);
      if ((host_grads_ && layer) || (host_embed_ && u == 0)) grads_.emplace_back();  // layers use the two buffers below
      else grads_.emplace_back(alloc_, units[u].numel, "gradients of " + units[u].name);
    }
    if (host_grads_)
      for (auto& g : layer_grad_) g = DevBuf<float>(alloc_, layer_numel_, "a layer gradient buffer");
    for (auto& g : layer_grad_)
      if (g.data()) CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.bytes(), compute_.get()));
    grad_zeroed_.resize(units.size());
    grad_ready_.resize(units.size());
    for (auto& g : grads_) CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.bytes(), compute_.get()));
    if (host_ckpt_) {
      host_ckpt_buf_ = PinnedBuf(ckpt_bytes, "block checkpoints");
      for (auto& x : xbuf_) x = DevBuf<bf16>(alloc_, N_ * s_.hidden, "a block input buffer");
    } else {
      ckpt_ = DevBuf<bf16>(alloc_, (L + 1) * N_ * s_.hidden, "block checkpoints");
    }
    hf_ = DevBuf<bf16>(alloc_, N_ * s_.hidden, "final hidden states");
    dx_ = DevBuf<bf16>(alloc_, N_ * s_.hidden, "the residual gradient");
    dhf_ = DevBuf<bf16>(alloc_, N_ * s_.hidden, "the final norm gradient");
    rstd_f_ = DevBuf<float>(alloc_, N_, "final norm statistics");
    ids_ = DevBuf<int32_t>(alloc_, N_, "token ids");
    targets_ = DevBuf<int32_t>(alloc_, N_, "targets");
    pos_ = DevBuf<int32_t>(alloc_, N_, "positions");
    host_io_ = PinnedBuf(static_cast<size_t>(3 * N_) * 4, "token staging");
    totals_ = DevBuf<CrossEntropyTotals>(alloc_, 1, "loss totals");
    norms_ = DevBuf<double>(alloc_, static_cast<int64_t>(units.size()), "gradient norms");
    host_small_ = PinnedBuf(sizeof(CrossEntropyTotals) + units.size() * sizeof(double), "loss staging");
    std::vector<float> inv = cpu::rope_inv_freq(s_.rope, s_.head_dim);
    inv_freq_ = DevBuf<float>(alloc_, static_cast<int64_t>(inv.size()), "RoPE frequencies");
    CUDA_CHECK(cudaMemcpy(inv_freq_.data(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
    size_t sc = std::max({rms_norm_backward_scratch_bytes(N_, s_.hidden),
                          rms_norm_backward_scratch_bytes(N_ * std::max(s_.n_heads, s_.n_kv_heads), s_.head_dim),
                          attention_backward_scratch_bytes(B_, T_, s_.n_heads),
                          lm_head_cross_entropy_scratch_bytes(opt_.ce_chunk_rows, s_.vocab),
                          embedding_backward_scratch_bytes(N_, s_.vocab), sum_squares_scratch_bytes(units[0].numel),
                          sum_squares_scratch_bytes(units[L + 1].numel), sum_squares_scratch_bytes(layer_numel_)});
    scratch_ = DevBuf<uint8_t>(alloc_, static_cast<int64_t>(sc), "op scratch");
    ops_ = std::make_unique<CudaOps>(alloc_, blas_, compute_.get(), inv_freq_.data(), Scratch{scratch_.data(), sc});
    bscratch_ = std::make_unique<BlockScratch<CudaOps>>(*ops_, s_, BlockDims{B_, T_});
    int64_t max_unit = 0;
    for (auto& u : units) max_unit = std::max(max_unit, u.numel);
    if (host_grads_) {  // pinned slabs where each unit's gradient lands during the backward
      for (int r = 0; r < kSlabs; ++r) slabs_.emplace_back(static_cast<size_t>(max_unit) * 4, "a gradient landing slab");
      slab_done_.resize(kSlabs);
      slab_free_.assign(kSlabs, 1);
    } else {  // a pinned ring of chunks the optimizer phase copies gradients through
      const int64_t want = static_cast<int64_t>(opt_.landing_chunk_bytes / 4) / kChunkAlign * kChunkAlign;
      chunk_elems_ = want > 0 ? std::min(want, max_unit) : max_unit;
      for (int r = 0; r < kRing; ++r) ring_.emplace_back(static_cast<size_t>(chunk_elems_) * 4, "a gradient landing chunk");
      ring_done_.resize(kRing);
    }
    // Last: the block activations, the shared set and those of the last K
    // layers, which stay from forward to backward (their recompute is
    // skipped); K as asked or, on auto, as many as fit in what the plan leaves
    // of the budget once the shared set is in (1/64 of the budget held back).
    const uint64_t act_bytes = BlockActs<CudaOps>::bytes(s_, BlockDims{B_, T_});
    RT_CHECK(opt_.keep_activations >= -1, "[cuda] --keep-activations must be auto or a layer count >= 0, got ",
             opt_.keep_activations);
    int64_t keep = opt_.keep_activations;
    if (keep < 0) {
      const uint64_t planned = alloc_.used() + act_bytes + alloc_.budget() / 64;
      keep = static_cast<int64_t>((alloc_.budget() - std::min(alloc_.budget(), planned)) / act_bytes);
    }
    keep = std::min(keep, L);
    acts_ = std::make_unique<LayerActs<CudaOps>>(*ops_, s_, BlockDims{B_, T_}, keep);
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    if (opt_.verbose) {
      std::printf("cuda engine: %s, %d weight slot%s of %.1f MiB, gradients on %s, checkpoints on %s, "
                  "embedding on %s, activations of %lld of %lld layers kept (%.2f GiB; the others are recomputed), "
                  "device memory %.2f GiB planned of %.2f GiB budget\n",
                  opt_.resident ? "resident" : "streaming", S_, S_ == 1 ? "" : "s", layer_numel_ * 2.0 / (1 << 20),
                  host_grads_ ? "host (per layer)" : "device", host_ckpt_ ? "host" : "device",
                  host_embed_ ? "host" : "device", (long long)keep, (long long)L,
                  keep * act_bytes / double(1ull << 30), alloc_.used() / double(1ull << 30),
                  alloc_.budget() / double(1ull << 30));
    }
  }

  ~StreamEngine() override {
    try {
      worker_.drain();
    } catch (...) {
    }
    cudaDeviceSynchronize();
  }

  std::string describe() const override {
    return cat("cuda ", opt_.resident ? "resident" : "streaming", " (", S_, " slots, bf16 compute, fp32 master + AdamW on ",
               global_pool().size(), " CPU threads", delayed_ ? ", delayed update" : "", ")");
  }

  uint64_t peak_device_bytes() const { return alloc_.peak(); }

  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override {
    worker_.rethrow_if_failed();
    const int64_t L = s_.n_layers;
    auto& units = st_.units();
    StepStats stats;
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), compute_.get()));
    const float grad_scale = 1.0f / static_cast<float>(n_valid_total);
    for (size_t k = 0; k < batches.size(); ++k) {
      const Batch& b = batches[k];
      RT_CHECK(b.B == B_ && b.T == T_, "[engine] batch ", b.B, "x", b.T, " does not match the engine's ", B_, "x", T_);
      first_micro_ = k == 0;
      upload_batch(b);
      forward(true);
      head(true, grad_scale);
      backward();
    }
    // global norm: per-unit sums of squares, summed in unit order
    Scratch sc{scratch_.data(), scratch_.size()};
    std::vector<double> host_norms(units.size(), 0.0);
    if (host_grads_) {
      push_job([this, &host_norms] {
        auto& us = st_.units();
        for (size_t u = 0; u < us.size(); ++u) host_norms[u] = rt::sum_squares(us[u].grad.p, us[u].numel);
      });
      worker_.drain();
    } else {
      for (size_t u = 0; u < units.size(); ++u) {
        auto span = tracer_.gpu_begin(Lane::compute, "norm", static_cast<int>(u), compute_.get());
        sum_squares(norms_.data() + u, grads_[u].data(), units[u].numel, sc, compute_.get());
        tracer_.gpu_end(span, compute_.get());
      }
    }
    auto* tot = host_small_.as<CrossEntropyTotals>();
    double* nrm = reinterpret_cast<double*>(host_small_.as<uint8_t>() + sizeof(CrossEntropyTotals));
    CUDA_CHECK(cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, compute_.get()));
    CUDA_CHECK(cudaMemcpyAsync(nrm, norms_.data(), units.size() * sizeof(double), cudaMemcpyDeviceToHost, compute_.get()));
    CUDA_CHECK(cudaEventRecord(backward_done_.get(), compute_.get()));
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    stats.loss_sum = tot->loss_sum;
    stats.n_valid = tot->n_valid;
    double sq = 0;
    for (size_t u = 0; u < units.size(); ++u) sq += host_grads_ ? host_norms[u] : nrm[u];
    stats.grad_norm = std::sqrt(sq);
    const bool ok = std::isfinite(stats.loss_sum) && std::isfinite(stats.grad_norm);
    const float coef = clip_coefficient(stats.grad_norm, o.clip);
    ++step_;
    tracer_.flush_step(step_);
    last_busy_ = tracer_.lane_busy_seconds(Lane::compute, step_);
    last_h2d_ = h2d_bytes_;
    h2d_bytes_ = 0;
    last_d2h_ = 0;
    for (size_t u = 0; u < units.size(); ++u)
      last_d2h_ += (host_embed_ && u == 0 ? static_cast<uint64_t>(N_) * s_.hidden * 2
                                          : static_cast<uint64_t>(units[u].numel) * 4) *
                   (host_grads_ ? batches.size() : 1);
    // optimizer phase on the worker, in forward order
    const int64_t step = step_;
    push_job([this, o, coef, ok, step] { optimizer_phase(o, coef, ok, step); });
    stats.applied = ok;
    (void)L;
    return stats;
  }

  double loss_sum(const Batch& in, int64_t* n_valid) override {
    worker_.rethrow_if_failed();
    RT_CHECK(in.B <= B_ && in.T == T_, "[engine] batch ", in.B, "x", in.T, " does not fit the engine's ", B_, "x", T_);
    Batch padded;
    const Batch* bp = &in;
    if (in.B < B_) {  // a short last validation batch: pad with rows that carry no loss
      padded = in;
      padded.B = B_;
      padded.inputs.resize(static_cast<size_t>(N_), 0);
      padded.targets.resize(static_cast<size_t>(N_), ignore_target);
      bp = &padded;
    }
    const Batch& b = *bp;
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), compute_.get()));
    upload_batch(b);
    forward(false);
    head(false, 1.0f);
    auto* tot = host_small_.as<CrossEntropyTotals>();
    CUDA_CHECK(cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, compute_.get()));
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    *n_valid = tot->n_valid;
    return tot->loss_sum;
  }

  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override {
    sync();
    auto& units = st_.units();
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), compute_.get()));
    for (size_t k = 0; k < batches.size(); ++k) {
      first_micro_ = k == 0;
      upload_batch(batches[k]);
      forward(true);
      head(true, 1.0f / static_cast<float>(n_valid_total));
      backward();
    }
    auto* tot = host_small_.as<CrossEntropyTotals>();
    CUDA_CHECK(cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, compute_.get()));
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    if (host_grads_) {  // they already landed in the host arenas
      worker_.drain();
      return tot->loss_sum;
    }
    for (size_t u = 0; u < units.size(); ++u) {
      RT_CHECK(units[u].grad.p, "[engine] compute_grads needs a HostState with gradients");
      CUDA_CHECK(cudaMemcpy(units[u].grad.p, grads_[u].data(), grads_[u].bytes(), cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemset(grads_[u].data(), 0, grads_[u].bytes()));
    }
    // the layers in the slots are still current (no update happened)
    return tot->loss_sum;
  }

  void sync() override {
    worker_.drain();
    CUDA_CHECK(cudaDeviceSynchronize());
    min_version_ = step_;  // delayed update: the pending update is in; the next step trains on it
  }

 private:
  static constexpr int kSlabs = 3;
  // Device-gradient modes: chunks in flight between the device and the
  // optimizer (4 x 16 MiB by default instead of unit-sized slabs: as fast on
  // the H200 host, 6.6 GiB less pinned RAM at 7B; bench/RESULTS.md);
  // kChunkAlign keeps every chunk 64-byte aligned in the arenas (units and
  // tensors are 16-float aligned).
  static constexpr int kRing = 4;
  static constexpr int64_t kChunkAlign = 4096;

  static uint64_t budget(const CudaOptions& o) {
    RT_CHECK(device_count() > 0, "[cuda] no CUDA device is visible; use --device cpu");
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    uint64_t b = free_b > (512ull << 20) ? free_b - (512ull << 20) : free_b;  // leave room for the CUDA context
    if (o.max_gpu_memory) {
      if (o.max_gpu_memory > b)
        fail("[cuda] --max-gpu-memory ", o.max_gpu_memory >> 20, " MiB is more than the ", b >> 20, " MiB the device has free");
      b = o.max_gpu_memory;
    }
    return b;
  }

  void check_shapes() {
    auto mult8 = [&](int64_t v, const char* what) {
      RT_CHECK(v % 8 == 0, "[cuda] ", what, " = ", v, " must be a multiple of 8 for the CUDA kernels; use --device cpu");
    };
    mult8(s_.hidden, "hidden_size");
    mult8(s_.intermediate, "intermediate_size");
    mult8(s_.vocab, "vocab_size");
    mult8(s_.q_dim(), "heads x head_dim");
    mult8(s_.kv_dim(), "kv heads x head_dim");
    RT_CHECK(s_.head_dim == 64 || s_.head_dim == 96 || s_.head_dim == 128 || s_.head_dim == 256, "[cuda] head_dim ",
             s_.head_dim, " is not supported by the CUDA attention kernels (64, 96, 128 or 256); use --device cpu");
  }

  void upload_batch(const Batch& b) {
    int32_t* h = host_io_.as<int32_t>();
    // the staging buffer may still be read by the previous batch's copies
    CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
    for (int64_t i = 0; i < N_; ++i) {
      h[i] = b.inputs[i];
      h[N_ + i] = b.targets[i];
    }
    batch_positions(b, h + 2 * N_);
    CUDA_CHECK(cudaMemcpyAsync(ids_.data(), h, N_ * 4, cudaMemcpyHostToDevice, compute_.get()));
    CUDA_CHECK(cudaMemcpyAsync(targets_.data(), h + N_, N_ * 4, cudaMemcpyHostToDevice, compute_.get()));
    CUDA_CHECK(cudaMemcpyAsync(pos_.data(), h + 2 * N_, N_ * 4, cudaMemcpyHostToDevice, compute_.get()));
  }

  // The update count of the weights this step computes with: all updates so
  // far, or in delayed mode all but the last (the one being applied now).
  int64_t need_version() const { return delayed_ ? std::max(step_ - 1, min_version_) : step_; }
  // The pinned shadow holding unit u at need_version().
  const uint16_t* shadow_src(size_t u) const { return shadow_[delayed_ ? need_version() % 2 : 0][u].as<uint16_t>(); }

  // Worker jobs: a job that throws marks the engine failed and wakes every
  // waiter (who then reports the job's error) instead of leaving them blocked.
  void push_job(std::function<void()> f) {
    worker_.push([this, f = std::move(f)] {
      try {
        f();
      } catch (...) {
        {
          std::lock_guard<std::mutex> lk(mu_);
          worker_failed_ = true;
        }
        cv_.notify_all();
        throw;
      }
    });
  }
  [[noreturn]] void report_worker_failure() {
    worker_.drain();  // rethrows the job's error
    fail("[engine] the optimizer failed");
  }

  // Elements [0, result) of unit u's shadow hold need_version() (mu_ held).
  int64_t ready_elems(size_t u, int64_t need) const {
    if (updated_[u] >= need) return st_.units()[u].numel;
    return progress_step_[u] == need ? progress_[u] : 0;
  }

  // Blocks until unit u holds need_version() (its shadow is current).
  void wait_updated(size_t u) {
    const int64_t need = need_version();
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return updated_[u] >= need || worker_failed_; });
    if (worker_failed_) {
      lk.unlock();
      report_worker_failure();
    }
  }

  // Queues on h2d the copy of unit u's current shadow into dst, piece by
  // piece as the optimizer's chunks of that unit finish, so the copy runs
  // under the update instead of after it.
  void copy_in_as_updated(size_t u, bf16* dst, const char* what, int layer) {
    const int64_t need = need_version(), n = st_.units()[u].numel;
    const uint16_t* src = shadow_src(u);
    int64_t issued = 0;
    Tracer::Span span;
    while (issued < n) {
      int64_t ready = 0;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return (ready = ready_elems(u, need)) > issued || worker_failed_; });
        if (worker_failed_) {
          lk.unlock();
          report_worker_failure();
        }
      }
      if (issued == 0) span = tracer_.gpu_begin(Lane::h2d, what, layer, h2d_.get());
      CUDA_CHECK(cudaMemcpyAsync(dst + issued, src + issued, static_cast<size_t>(ready - issued) * 2,
                                 cudaMemcpyHostToDevice, h2d_.get()));
      issued = ready;
    }
    tracer_.gpu_end(span, h2d_.get());
  }
  bool is_updated(size_t u) {
    std::lock_guard<std::mutex> lk(mu_);
    return updated_[u] >= need_version();
  }
  void wait_grad_zeroed(size_t u) {
    if (host_grads_) return;  // host mode zeroes its device buffers right before (layers) or after (embed, head) use
    if (step_ == 0) return;
    {  // the optimizer of the last step has queued the copy-out and zeroing of unit u
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return grad_issued_[u] >= step_ || worker_failed_; });
    }
    if (worker_failed_) report_worker_failure();
    CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), grad_zeroed_[u].get(), 0));
  }

  // Unit-resident pieces (embedding, head): reload after each update.
  void ensure_unit(size_t u, DevBuf<bf16>& dst, int64_t& have_version, Event& loaded) {
    if (have_version == need_version()) return;
    copy_in_as_updated(u, dst.data(), u == 0 ? "load embed" : "load head", -1);
    h2d_bytes_ += dst.bytes();
    CUDA_CHECK(cudaEventRecord(loaded.get(), h2d_.get()));
    CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), loaded.get(), 0));
    have_version = need_version();
  }

  // Queues the load of layer i into its slot unless it is already there.
  void load_layer(int64_t i) {
    const int s = static_cast<int>(i % S_);
    if (slot_layer_[s] == i && slot_version_[s] == need_version()) return;
    if (slot_layer_[s] >= 0) CUDA_CHECK(cudaStreamWaitEvent(h2d_.get(), slot_free_[s].get(), 0));
    copy_in_as_updated(static_cast<size_t>(i + 1), slots_[s].data(), "load", static_cast<int>(i));
    h2d_bytes_ += slots_[s].bytes();
    CUDA_CHECK(cudaEventRecord(slot_loaded_[s].get(), h2d_.get()));
    slot_layer_[s] = i;
    slot_version_[s] = need_version();
  }
  const bf16* use_layer(int64_t i) {
    const int s = static_cast<int>(i % S_);
    load_layer(i);  // no-op when prefetched
    CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), slot_loaded_[s].get(), 0));
    return slots_[s].data();
  }
  void release_layer(int64_t i) {
    CUDA_CHECK(cudaEventRecord(slot_free_[static_cast<int>(i % S_)].get(), compute_.get()));
  }

  // Layers loaded ahead of the one computing (bounded by the free slots).
  int64_t prefetch_depth() const { return std::min<int64_t>(S_, 3); }

  // Block input i: in the checkpoint array (device mode) or in one of two
  // device buffers whose contents go to / come from pinned host memory.
  bf16* ckpt(int64_t i) { return host_ckpt_ ? xbuf_[i % 2].data() : ckpt_.data() + i * N_ * s_.hidden; }
  uint16_t* host_ckpt(int64_t i) { return host_ckpt_buf_.as<uint16_t>() + i * N_ * s_.hidden; }
  void save_ckpt(int64_t i) {  // device buffer of x_i -> host, on d2h after the compute that made it
    CUDA_CHECK(cudaEventRecord(ck_made_.get(), compute_.get()));
    CUDA_CHECK(cudaStreamWaitEvent(d2h_.get(), ck_made_.get(), 0));
    CUDA_CHECK(cudaMemcpyAsync(host_ckpt(i), ckpt(i), N_ * s_.hidden * 2, cudaMemcpyDeviceToHost, d2h_.get()));
    CUDA_CHECK(cudaEventRecord(ck_out_[i % 2].get(), d2h_.get()));
    ck_out_pending_[i % 2] = true;
  }
  void load_ckpt(int64_t i) {  // host -> device buffer of x_i, on h2d
    CUDA_CHECK(cudaMemcpyAsync(ckpt(i), host_ckpt(i), N_ * s_.hidden * 2, cudaMemcpyHostToDevice, h2d_.get()));
    CUDA_CHECK(cudaEventRecord(ck_in_[i % 2].get(), h2d_.get()));
  }
  // Gradient buffer of unit u on the device.
  float* dev_grad(size_t u) {
    const bool layer = u >= 1 && u <= static_cast<size_t>(s_.n_layers);
    return host_grads_ && layer ? layer_grad_[u % 2].data() : grads_[u].data();
  }
  // Host mode: unit u's gradient leaves the device now (d2h, into a pinned
  // slab); the worker adds it to the host arena (= on the first micro-batch).
  void land(size_t u, const float* src) {
    auto& unit = st_.units()[u];
    const int r = static_cast<int>(landing_counter_++ % kSlabs);
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return slab_free_[r] != 0 || worker_failed_; });
      slab_free_[r] = 0;
    }
    if (worker_failed_) report_worker_failure();
    CUDA_CHECK(cudaEventRecord(grad_made_.get(), compute_.get()));
    CUDA_CHECK(cudaStreamWaitEvent(d2h_.get(), grad_made_.get(), 0));
    auto span = tracer_.gpu_begin(Lane::d2h, "grads", static_cast<int>(u) - 1, d2h_.get());
    CUDA_CHECK(cudaMemcpyAsync(slabs_[r].as<float>(), src, static_cast<size_t>(unit.numel) * 4, cudaMemcpyDeviceToHost,
                               d2h_.get()));
    tracer_.gpu_end(span, d2h_.get());
    CUDA_CHECK(cudaEventRecord(slab_done_[r].get(), d2h_.get()));
    const bool first = first_micro_;
    push_job([this, u, r, first] {
      CUDA_CHECK(cudaEventSynchronize(slab_done_[r].get()));
      auto& un = st_.units()[u];
      const float* g = slabs_[r].as<float>();
      float* dst = un.grad.p;
      auto span = tracer_.host_begin("land", static_cast<int>(u) - 1);
      parallel_for(un.numel, 1 << 16, [&](int64_t b, int64_t e) {
        if (first) std::memcpy(dst + b, g + b, static_cast<size_t>(e - b) * 4);
        else for (int64_t i = b; i < e; ++i) dst[i] += g[i];
      });
      tracer_.host_end(span);
      {
        std::lock_guard<std::mutex> lk(mu_);
        slab_free_[r] = 1;
      }
      cv_.notify_all();
    });
  }

  // Host embedding: the residual gradient at layer 0 (N x C bf16) leaves the
  // device; the worker scatters it into the embedding's host gradient (= on
  // the first micro-batch of the step, += after), in the CUDA kernel's order.
  void land_embedding() {
    const int64_t C = s_.hidden;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return embed_dx_free_ || worker_failed_; });
      embed_dx_free_ = false;
    }
    if (worker_failed_) report_worker_failure();
    CUDA_CHECK(cudaEventRecord(grad_made_.get(), compute_.get()));
    CUDA_CHECK(cudaStreamWaitEvent(d2h_.get(), grad_made_.get(), 0));
    auto span = tracer_.gpu_begin(Lane::d2h, "embed grads", -1, d2h_.get());
    CUDA_CHECK(cudaMemcpyAsync(embed_dx_.as<uint16_t>(), dx_.data(), static_cast<size_t>(N_ * C) * 2,
                               cudaMemcpyDeviceToHost, d2h_.get()));
    tracer_.gpu_end(span, d2h_.get());
    CUDA_CHECK(cudaEventRecord(embed_dx_done_.get(), d2h_.get()));
    // the next micro-batch's head writes dx_ again
    CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), embed_dx_done_.get(), 0));
    const int32_t* h = host_io_.as<int32_t>();
    std::vector<int32_t> ids(h, h + N_);  // host_io_ is refilled by the next micro-batch
    const bool first = first_micro_;
    push_job([this, ids = std::move(ids), first, C] {
      CUDA_CHECK(cudaEventSynchronize(embed_dx_done_.get()));
      auto span = tracer_.host_begin("land", -1);
      auto& un = st_.units()[0];
      float* dst = un.grad.p;
      if (first) parallel_for(un.numel, 1 << 16, [&](int64_t b, int64_t e) {
          std::memset(dst + b, 0, static_cast<size_t>(e - b) * 4);
        });
      std::vector<float> dx(static_cast<size_t>(N_ * C));  // bf16 -> fp32 is exact
      const uint16_t* src = embed_dx_.as<uint16_t>();
      parallel_for(N_ * C, 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) dx[static_cast<size_t>(i)] = bf16_to_f32(src[i]);
      });
      {
        std::lock_guard<std::mutex> lk(mu_);
        embed_dx_free_ = true;
      }
      cv_.notify_all();
      cpu::embedding_backward(dst, dx.data(), ids.data(), N_, C);
      tracer_.host_end(span);
    });
  }

  void forward(bool training) {
    const int64_t L = s_.n_layers, C = s_.hidden;
    auto& units = st_.units();
    if (host_embed_) {
      // Rows of the current shadow, gathered here (one thread: the pool is the
      // optimizer's), then one copy in on the compute stream. The staging
      // buffer's previous copy is done: upload_batch synchronised the stream.
      wait_updated(0);
      const uint16_t* table = shadow_src(0);
      const int32_t* ids = host_io_.as<int32_t>();
      uint16_t* rows = embed_rows_.as<uint16_t>();
      for (int64_t n = 0; n < N_; ++n) {
        RT_CHECK(ids[n] >= 0 && ids[n] < s_.vocab, "[engine] token id ", ids[n], " at position ", n,
                 " is outside the vocabulary [0, ", s_.vocab, ")");
        std::memcpy(rows + n * C, table + static_cast<int64_t>(ids[n]) * C, static_cast<size_t>(C) * 2);
      }
    } else {
      ensure_unit(0, embed_w_, embed_version_, embed_loaded_);
    }
    auto span = tracer_.gpu_begin(Lane::compute, "embed", -1, compute_.get());
    if (host_ckpt_ && ck_out_pending_[0]) CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), ck_out_[0].get(), 0));
    if (host_embed_) {
      CUDA_CHECK(cudaMemcpyAsync(ckpt(0), embed_rows_.as<uint16_t>(), static_cast<size_t>(N_ * C) * 2,
                                 cudaMemcpyHostToDevice, compute_.get()));
      h2d_bytes_ += static_cast<uint64_t>(N_ * C) * 2;
    } else {
      embedding_forward(ckpt(0), ids_.data(), embed_w_.data(), N_, C, compute_.get());
    }
    tracer_.gpu_end(span, compute_.get());
    if (host_ckpt_ && training) save_ckpt(0);
    for (int64_t i = 0; i < L; ++i) {
      // Layer i's load waits (on this thread) for its update; the layers after
      // it are loaded ahead only when their updates are already in, so that
      // queuing layer i never waits for a later layer's update (the forward
      // trails the optimizer by one layer, not by the prefetch depth).
      load_layer(i);
      for (int64_t j = i + 1; j < std::min<int64_t>(L, i + prefetch_depth()) && is_updated(static_cast<size_t>(j + 1)); ++j)
        load_layer(j);
      const bf16* w = use_layer(i);
      // host checkpoints: x_{i+1} overwrites x_{i-1}, which must have left for the host
      if (host_ckpt_ && ck_out_pending_[(i + 1) % 2])
        CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), ck_out_[(i + 1) % 2].get(), 0));
      auto sp = tracer_.gpu_begin(Lane::compute, "forward", static_cast<int>(i), compute_.get());
      block_forward(*ops_, s_, bind_weights<bf16>(units[i + 1], w), BlockDims{B_, T_}, ckpt(i), ckpt(i + 1),
                    pos_.data(), training ? acts_->of(i) : acts_->shared());
      tracer_.gpu_end(sp, compute_.get());
      if (host_ckpt_ && training && i + 1 < L) save_ckpt(i + 1);
      // the last S layers stay for the backward's turn-around
      if (i + S_ < L || !training) release_layer(i);
    }
    (void)training;
  }

  void head(bool training, float grad_scale) {
    const int64_t L = s_.n_layers, C = s_.hidden;
    auto& hu = st_.units()[L + 1];
    ensure_unit(L + 1, head_w_, head_version_, head_loaded_);
    const bf16* final_norm = head_w_.data() + entry_offset(hu, WeightKind::final_norm);
    const bf16* lm = s_.tie_embeddings ? embed_w_.data() : head_w_.data() + entry_offset(hu, WeightKind::lm_head);
    float* g_norm = grads_[L + 1].data() + entry_offset(hu, WeightKind::final_norm);
    float* g_lm = s_.tie_embeddings ? grads_[0].data() : grads_[L + 1].data() + entry_offset(hu, WeightKind::lm_head);
    if (training) {  // first writes of these gradients this step
      wait_grad_zeroed(static_cast<size_t>(L + 1));
      if (s_.tie_embeddings) wait_grad_zeroed(0);
    }
    auto span = tracer_.gpu_begin(Lane::compute, "head", -1, compute_.get());
    rms_norm_forward(hf_.data(), rstd_f_.data(), ckpt(L), final_norm, N_, C, static_cast<float>(s_.rms_eps),
                     compute_.get());
    Scratch sc{scratch_.data(), scratch_.size()};
    lm_head_cross_entropy(blas_, training ? dhf_.data() : nullptr, training ? g_lm : nullptr, totals_.data(),
                          hf_.data(), lm, targets_.data(), N_, C, s_.vocab, grad_scale, opt_.ce_chunk_rows, sc,
                          compute_.get());
    if (training)
      rms_norm_backward(dx_.data(), g_norm, dhf_.data(), ckpt(L), final_norm, rstd_f_.data(), nullptr, N_, C, sc,
                        compute_.get());
    tracer_.gpu_end(span, compute_.get());
  }

  void backward() {
    const int64_t L = s_.n_layers, C = s_.hidden;
    auto& units = st_.units();
    if (host_ckpt_) {  // both input buffers are free once the head is done; x_{L-1} must have reached the host
      CUDA_CHECK(cudaEventRecord(ck_made_.get(), compute_.get()));
      CUDA_CHECK(cudaStreamWaitEvent(h2d_.get(), ck_made_.get(), 0));
      for (auto& e : ck_out_) CUDA_CHECK(cudaStreamWaitEvent(h2d_.get(), e.get(), 0));
      load_ckpt(L - 1);
    }
    for (int64_t i = L - 1; i >= 0; --i) {
      const bf16* w = use_layer(i);
      if (host_ckpt_) {
        if (i - 1 >= 0) {  // prefetch x_{i-1} into the buffer layer i+1 used
          if (i + 1 <= L - 1) CUDA_CHECK(cudaStreamWaitEvent(h2d_.get(), ck_used_[(i + 1) % 2].get(), 0));
          load_ckpt(i - 1);
        }
        CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), ck_in_[i % 2].get(), 0));
      }
      wait_grad_zeroed(static_cast<size_t>(i + 1));
      float* g = dev_grad(static_cast<size_t>(i + 1));
      if (host_grads_) {  // the buffer's previous layer has left for the host
        const int gb = static_cast<int>((i + 1) % 2);
        if (layer_grad_pending_[gb]) CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), layer_grad_out_[gb].get(), 0));
        CUDA_CHECK(cudaMemsetAsync(g, 0, layer_grad_[gb].bytes(), compute_.get()));
      }
      BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
      auto sp = tracer_.gpu_begin(Lane::compute, "backward", static_cast<int>(i), compute_.get());
      if (!acts_->kept(i))  // recompute (a kept layer still holds its forward's activations)
        block_forward(*ops_, s_, bw, BlockDims{B_, T_}, ckpt(i), hf_.data(), pos_.data(), acts_->shared());
      block_backward(*ops_, s_, bw, BlockDims{B_, T_}, ckpt(i), dx_.data(), dx_.data(), pos_.data(), acts_->of(i),
                     *bscratch_, bind_grads(units[i + 1], g));
      tracer_.gpu_end(sp, compute_.get());
      if (host_ckpt_) CUDA_CHECK(cudaEventRecord(ck_used_[i % 2].get(), compute_.get()));
      if (host_grads_) {
        land(static_cast<size_t>(i + 1), g);
        const int gb = static_cast<int>((i + 1) % 2);
        CUDA_CHECK(cudaEventRecord(layer_grad_out_[gb].get(), d2h_.get()));
        layer_grad_pending_[gb] = true;
      }
      release_layer(i);
      if (i - S_ >= 0) load_layer(i - S_);
    }
    Scratch sc{scratch_.data(), scratch_.size()};
    if (host_embed_) {
      land_embedding();
    } else {
      wait_grad_zeroed(0);
      embedding_backward(grads_[0].data(), dx_.data(), ids_.data(), N_, C, s_.vocab, sc, compute_.get());
    }
    if (host_grads_) {  // embedding and head gradients leave too, then their buffers are zeroed for the next micro-batch
      for (size_t u : {size_t{0}, static_cast<size_t>(L + 1)}) {
        if (host_embed_ && u == 0) continue;
        land(u, grads_[u].data());
        CUDA_CHECK(cudaEventRecord(unit_grad_out_.get(), d2h_.get()));
        CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), unit_grad_out_.get(), 0));
        CUDA_CHECK(cudaMemsetAsync(grads_[u].data(), 0, grads_[u].bytes(), compute_.get()));
      }
    }
  }

  // Worker thread: grads of each unit leave the device in forward order, the
  // CPU updates master/m/v and the pinned bf16 shadow, and the device grads
  // are zeroed for the next step.
  void optimizer_phase(const OptimStep& o, float coef, bool apply, int64_t step) {
    auto& units = st_.units();
    const size_t U = units.size();
    if (host_grads_) {  // gradients are already in the host arenas
      const auto t0 = std::chrono::steady_clock::now();
      int64_t n_params = 0;
      for (size_t u = 0; u < U; ++u) {
        if (apply) {
          auto span = tracer_.host_begin("adamw", static_cast<int>(u) - 1);
          update_unit(units[u], units[u].grad.p, o, coef, shadow_[0][u].as<uint16_t>());
          tracer_.host_end(span);
          n_params += units[u].numel;
        }
        {
          std::lock_guard<std::mutex> lk(mu_);
          updated_[u] = step;
        }
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lk(mu_);
      opt_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      opt_params_ = n_params;
      return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(d2h_.get(), backward_done_.get(), 0));
    // Forward order, so that the next forward finds each unit updated as it
    // comes to it; delayed: the next step trains on older weights and its
    // backward needs the gradient buffers back first, head and embedding
    // (tied LM heads write the embedding's gradient) before the last layer.
    std::vector<size_t> order(U);
    if (!delayed_) {
      for (size_t k = 0; k < U; ++k) order[k] = k;
    } else {
      order[0] = U - 1;
      order[1] = 0;
      for (size_t k = 2; k < U; ++k) order[k] = U - k;
    }
    std::vector<PinnedBuf>& shadow = shadow_[delayed_ ? step % 2 : 0];
    // The units' gradients in chunks of at most chunk_elems_, in `order`.
    struct Chunk {
      size_t u;
      int64_t b, e;
    };
    std::vector<Chunk> chunks;
    for (size_t k = 0; k < U; ++k)
      for (int64_t b = 0; b < units[order[k]].numel; b += chunk_elems_)
        chunks.push_back({order[k], b, std::min(units[order[k]].numel, b + chunk_elems_)});
    // Chunk c goes device -> ring slot c % kRing; after a unit's last chunk its
    // device buffer is zeroed on the same stream.
    Tracer::Span d2h_span;
    auto issue = [&](size_t c) {
      const Chunk& ch = chunks[c];
      const int r = static_cast<int>(c % kRing);
      if (ch.b == 0) d2h_span = tracer_.gpu_begin(Lane::d2h, "grads", static_cast<int>(ch.u) - 1, d2h_.get());
      CUDA_CHECK(cudaMemcpyAsync(ring_[r].as<float>(), grads_[ch.u].data() + ch.b, static_cast<size_t>(ch.e - ch.b) * 4,
                                 cudaMemcpyDeviceToHost, d2h_.get()));
      CUDA_CHECK(cudaEventRecord(ring_done_[r].get(), d2h_.get()));
      if (ch.e < units[ch.u].numel) return;
      CUDA_CHECK(cudaMemsetAsync(grads_[ch.u].data(), 0, grads_[ch.u].bytes(), d2h_.get()));
      CUDA_CHECK(cudaEventRecord(grad_zeroed_[ch.u].get(), d2h_.get()));
      tracer_.gpu_end(d2h_span, d2h_.get());
      {
        std::lock_guard<std::mutex> lk(mu_);
        grad_issued_[ch.u] = step;
      }
      cv_.notify_all();
    };
    const auto t0 = std::chrono::steady_clock::now();
    int64_t n_params = 0;
    for (size_t c = 0; c < std::min<size_t>(kRing, chunks.size()); ++c) issue(c);
    Tracer::Span host_span;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Chunk& ch = chunks[c];
      StateUnit& un = units[ch.u];
      const int r = static_cast<int>(c % kRing);
      CUDA_CHECK(cudaEventSynchronize(ring_done_[r].get()));
      if (apply) {
        if (ch.b == 0) host_span = tracer_.host_begin("adamw", static_cast<int>(ch.u) - 1);
        update_unit_range(un, ch.b, ch.e, ring_[r].as<float>(), o, coef, shadow[ch.u].as<uint16_t>());
        n_params += ch.e - ch.b;
        if (ch.e == un.numel) tracer_.host_end(host_span);
      } else if (delayed_) {  // a skipped step: the other shadow must still hold the current weights
        std::memcpy(shadow[ch.u].as<uint16_t>() + ch.b, shadow_[(step + 1) % 2][ch.u].as<uint16_t>() + ch.b,
                    static_cast<size_t>(ch.e - ch.b) * 2);
      }
      if (c + kRing < chunks.size()) issue(c + kRing);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (ch.e < un.numel) {
          progress_step_[ch.u] = step;
          progress_[ch.u] = ch.e;
        } else {
          updated_[ch.u] = step;
        }
      }
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lk(mu_);
    opt_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    opt_params_ = n_params;
  }

 public:
  EngineStats stats() const override {
    EngineStats e;
    e.device_peak_bytes = alloc_.peak();
    e.h2d_bytes = last_h2d_;
    e.d2h_bytes = last_d2h_;
    std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(mu_));
    e.optimizer_seconds = opt_seconds_;
    e.optimizer_params = opt_params_;
    e.compute_busy_seconds = last_busy_;
    return e;
  }

 private:
  uint64_t h2d_bytes_ = 0, last_h2d_ = 0, last_d2h_ = 0;
  double opt_seconds_ = 0, last_busy_ = -1;
  int64_t opt_params_ = 0;
  HostState& st_;
  const ModelSpec& s_;
  int64_t B_, T_, N_;
  CudaOptions opt_;
  DeviceAllocator alloc_;
  Tracer tracer_;
  Stream h2d_, compute_, d2h_;
  Blas blas_;
  int S_ = 2;
  int64_t layer_numel_ = 0;
  std::vector<PinnedBuf> shadow_[2];     // [1] only in delayed mode
  std::vector<int64_t> updated_;         // per unit: updates applied (guarded by mu_)
  std::vector<int64_t> progress_, progress_step_;  // per unit: update progress_step_ has reached element progress_ (mu_)
  std::vector<int64_t> grad_issued_;     // per unit: steps whose gradient copy-out + zeroing is queued (mu_)
  bool delayed_ = false;
  int64_t min_version_ = 0;              // delayed: the weights of the last sync() are current
  DevBuf<bf16> embed_w_, head_w_;
  bool host_embed_ = false;         // host gradients + untied embedding: the table stays on the host
  PinnedBuf embed_rows_, embed_dx_;  // host embedding: gathered rows in, residual gradient out (N x C bf16)
  bool embed_dx_free_ = true;       // guarded by mu_
  Event embed_dx_done_;
  int64_t embed_version_ = -1, head_version_ = -1;
  Event embed_loaded_, head_loaded_, backward_done_;
  std::vector<DevBuf<bf16>> slots_;
  std::vector<int64_t> slot_layer_, slot_version_;
  std::vector<Event> slot_loaded_, slot_free_;
  std::vector<DevBuf<float>> grads_;
  std::vector<Event> grad_zeroed_, grad_ready_;
  DevBuf<bf16> ckpt_, hf_, dx_, dhf_;
  DevBuf<float> rstd_f_, inv_freq_;
  DevBuf<int32_t> ids_, targets_, pos_;
  PinnedBuf host_io_, host_small_;
  DevBuf<CrossEntropyTotals> totals_;
  DevBuf<double> norms_;
  DevBuf<uint8_t> scratch_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<LayerActs<CudaOps>> acts_;  // shared (recomputed layers) + layers L-K..L-1, forward to backward
  std::unique_ptr<BlockScratch<CudaOps>> bscratch_;
  std::vector<PinnedBuf> slabs_;  // host gradients: landing slabs of the largest unit
  std::vector<Event> slab_done_;
  std::vector<int> slab_free_;  // guarded by mu_
  std::vector<PinnedBuf> ring_;  // device gradients: the optimizer's landing chunks
  std::vector<Event> ring_done_;
  int64_t chunk_elems_ = 0;
  int64_t landing_counter_ = 0;
  bool host_grads_ = false, host_ckpt_ = false, first_micro_ = true;
  DevBuf<float> layer_grad_[2];
  Event layer_grad_out_[2], unit_grad_out_, grad_made_;
  bool layer_grad_pending_[2] = {false, false};
  PinnedBuf host_ckpt_buf_;
  DevBuf<bf16> xbuf_[2];
  Event ck_out_[2], ck_in_[2], ck_used_[2], ck_made_;
  bool ck_out_pending_[2] = {false, false};
  int64_t step_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool worker_failed_ = false;
  Worker worker_;  // last: destroyed first
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(HostState& state, int64_t micro_batch, int64_t seq_len,
                                           const CudaOptions& opt) {
  CudaOptions o = opt;
  for (;;) {
    try {
      return std::make_unique<cuda::StreamEngine>(state, micro_batch, seq_len, o);
    } catch (const cuda::DeviceBudgetError& e) {
      if (!o.fit) throw;
      // The next smaller plan, one change at a time (CudaOptions::fit).
      std::string change;
      if ((o.grads == "auto" && !o.delayed_update) || o.checkpoints == "auto") {
        if (o.grads == "auto" && !o.delayed_update) o.grads = "host";
        if (o.checkpoints == "auto") o.checkpoints = "host";
        change = "gradients and block checkpoints in host RAM";
      } else if (o.slots > 2 && !o.resident && o.fit_slots) {
        o.slots = 2;
        change = "2 weight slots";
      } else if (o.ce_chunk_rows > 256) {
        o.ce_chunk_rows = 256;
        change = "LM-head chunks of 256 rows";
      } else {
        throw cuda::DeviceBudgetError(cat(e.what(), " (this is already the smallest plan the engine has for ",
                                          micro_batch, " x ", seq_len, " tokens per micro-batch)"));
      }
      if (o.verbose) std::printf("cuda engine: the plan does not fit (%s); trying %s\n", e.what(), change.c_str());
    }
  }
}

}  // namespace rt
