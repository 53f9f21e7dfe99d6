// The CUDA streaming engine: the schedule that streams layers through the GPU
// from host RAM. Its parts, one job each (engine/cuda/ unless named):
//   WeightSlots (weight_slots.h): pinned bf16 shadows, device slots, loads;
//   CheckpointStore (checkpoint_store.h): block inputs, device or host;
//   GradientSink (gradient_sink.h): device gradient buffers + landing ring, or
//     per-layer host slabs;
//   HostEmbedding (host_embedding.h): the --low-memory embedding on the host;
//   OptimizerPhase (optimizer_phase.h): the worker thread's CPU AdamW (and
//     Muon, whose NS5 runs on the GPU pipelined with it: GpuOrthogonalizer, muon_gpu.h);
//   UpdateTracker (engine/update_tracker.h): the worker and what it has done;
//   dp_rank.h: a data-parallel rank's reduce-scatter, totals, checkpoint gathers;
//   make_backend.cpp: make_cuda_backend, the largest plan that fits;
//   engine_report.h: the start-up report of the plan and the host RAM;
//   the plan (engine/device_plan.h): placement, auto kept layers, fit.
// This file owns the activations and the order of work.
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
//   optimizer (worker thread, CPU pool): see optimizer_phase.h; the next
//     step's load of unit u waits only on u's update.
// Layer-major (backend.h, K micro-batches planned: DevicePlacement): embed
//   all K; forward 0..L-1: layer i's weights wait once, then block i runs on
//   every micro-batch (inputs x_i^k from the CheckpointStore, which prefetches
//   the next one while this one computes); the head per micro-batch, each
//   leaving its residual gradient dx^k; backward L-1..0: for k = 0..K-1
//   recompute and back-propagate block i with dx^k into layer i's gradient
//   buffer, which then leaves once (host gradients); the embedding's backward
//   per micro-batch. Weight slots turn around and prefetch as above. A step
//   with another count of micro-batches runs micro-batch-major.
// Delayed update (backend.h): two bf16 shadows; step t's optimizer writes
//   shadow t % 2 while step t+1 trains on the weights of update t-1 (shadow
//   (t-1) % 2), and it runs in backward order (head, embedding, last layer
//   first) so that step t+1's backward finds each unit's gradient buffer
//   already copied out and zeroed.
//
// Folders: the kernels, device memory and the tracer are cuda/ (below the
// engine; they know nothing of HostState or the optimizer). This schedule and
// its parts queue work on CUDA streams and events at every step, so they are
// the engine's CUDA backend, engine/cuda/, built into ramtrain_lib with the
// CUDA runtime; what they decide without CUDA is plain engine/ (device_plan,
// update_tracker, update_order), tested on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"
#include "dist/collective.h"
#include "engine/sharded_optimizer.h"
#include "cuda/cuda_ops.h"
#include "cuda/device_info.h"
#include "engine/backend.h"
#include "engine/cuda/checkpoint_store.h"
#include "engine/cuda/dp_rank.h"
#include "engine/cuda/engine_report.h"
#include "engine/cuda/engine_device.h"
#include "engine/cuda/gradient_sink.h"
#include "engine/cuda/host_embedding.h"
#include "engine/cuda/moe_routing.h"
#include "engine/cuda/muon_gpu.h"
#include "engine/cuda/optimizer_phase.h"
#include "engine/cuda/stream_engine.h"
#include "engine/cuda/weight_slots.h"
#include "engine/device_plan.h"
#include "engine/unit_binding.h"
#include "engine/update_tracker.h"
#include "model/block.h"

namespace rt {

namespace cuda {

namespace {

class StreamEngine final : public Backend {
 public:
  StreamEngine(HostState& st, int64_t B, int64_t T, const CudaOptions& opt)
      : st_(st),
        s_(st.spec()),
        B_(B),
        T_(T),
        N_(B * T),
        opt_(opt),
        dp_(opt.dp),
        dev_(device_budget(opt), opt.trace_path),
        track_(st.units().size(), opt.delayed_update) {
    const int64_t L = s_.n_layers;
    auto& units = st_.units();
    check_cuda_shapes(s_);
    // the worker thread issues copies, memsets and (Muon) kernels on this
    // device's streams: its current device is this thread's (a data-parallel
    // rank's is not device 0)
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    track_.push([device] { CUDA_CHECK(cudaSetDevice(device)); });
    RT_CHECK(opt_.master == "auto" || opt_.master == "fp32" || opt_.master == "split" || opt_.master == "bf16-sr" ||
                 opt_.master == "bf16-kahan",
             "[cuda] --master must be auto, fp32, split, bf16-sr or bf16-kahan, got '", opt_.master, "'");
    const MasterStorage master = opt_.master == "fp32"         ? MasterStorage::fp32
                                 : opt_.master == "bf16-sr"    ? MasterStorage::bf16_sr
                                 : opt_.master == "bf16-kahan" ? MasterStorage::bf16_kahan
                                                               : MasterStorage::split;
    // a bf16 master is the one pinned shadow the update writes in place: no second one for the delayed update
    RT_CHECK(!(opt_.delayed_update && (master == MasterStorage::bf16_sr || master == MasterStorage::bf16_kahan)),
             "[cuda] --master ", opt_.master, " keeps one bf16 copy, which --delayed-update would overwrite while the "
             "step trains on it: use --master split (exact) with --delayed-update");
    if (dp_.on()) {  // GpuDataParallel (backend.h): the state is weights only, the master is in the shards
      RT_CHECK(st_.weights_only(), "[cuda] internal: a data-parallel rank's state must be weights only");
      RT_CHECK(!s_.is_moe(), "[dp] data parallelism does not support mixture-of-experts models (",
               s_.architecture, ") yet: their load-balancing loss is a mean over each process's micro-batches; "
               "train them on one GPU");
      RT_CHECK(!opt_.delayed_update && !opt_.muon && !dp_.shard->shards().empty() && dp_.grads && dp_.weights,
               "[cuda] data parallelism runs AdamW (its shards' fp32 moments), without --delayed-update");
    } else {
      st_.set_master_storage(master, opt_.delayed_update ? 2 : 1);
    }
    place_ = place_on_device(s_, B_, T_, opt_, dev_.alloc.budget());
    RT_CHECK(!dp_.on() || (!place_.host_grads && !place_.fold && !place_.host_embed),
             "[cuda] data parallelism keeps each step's gradients on the device until they are reduce-scattered, "
             "and this plan sends them to the host (device memory ",
             dev_.alloc.budget() >> 20, " MiB): use a smaller --micro-batch or a larger --max-gpu-memory");
    // device state, in the order of the plan (device_plan.h)
    weights_ = std::make_unique<WeightSlots>(st_, dev_, track_, place_.slots, place_.host_embed, dp_);
    if (place_.host_grads && !place_.fold) st_.ensure_grads();
    if (place_.fold && place_.host_embed) st_.ensure_unit_grad(0);  // the host embedding's rows scatter into it
    if (place_.host_embed) host_embed_ = std::make_unique<HostEmbedding>(st_, dev_, track_, N_);
    // the LM head's padding rows; data parallel: at least the reduce-scatter's padded length
    std::vector<int64_t> grad_numel = device_unit_numels(s_);
    if (dp_.on())
      for (size_t u = 0; u < units.size(); ++u)
        grad_numel[u] = std::max(grad_numel[u], dp_.shard->stride(u) * dp_.grads->world());
    grads_ = std::make_unique<GradientSink>(st_, dev_, track_, place_.host_grads, place_.host_embed, grad_numel);
    if (place_.fold) grads_->set_fold([this](size_t u, const float* g) { optimizer_->fold(u, g); });
    K_ = place_.sets();
    ckpt_ = std::make_unique<CheckpointStore>(dev_, L, N_ * s_.hidden, place_.host_ckpt, K_);
    hf_ = DevBuf<bf16>(dev_.alloc, N_ * s_.hidden, "final hidden states");
    dx_ = DevBuf<bf16>(dev_.alloc, K_ * N_ * s_.hidden, K_ > 1 ? "the residual gradients" : "the residual gradient");
    dhf_ = DevBuf<bf16>(dev_.alloc, N_ * s_.hidden, "the final norm gradient");
    rstd_f_ = DevBuf<float>(dev_.alloc, N_, "final norm statistics");
    ids_ = DevBuf<int32_t>(dev_.alloc, K_ * N_, "token ids");
    targets_ = DevBuf<int32_t>(dev_.alloc, K_ * N_, "targets");
    pos_ = DevBuf<int32_t>(dev_.alloc, K_ * N_, "positions");
    doc_ = DevBuf<int32_t>(dev_.alloc, K_ * N_, "document starts");
    has_doc_.assign(static_cast<size_t>(K_), false);
    host_io_ = PinnedBuf(static_cast<size_t>(4 * K_ * N_) * 4, "token staging");
    totals_ = DevBuf<CrossEntropyTotals>(dev_.alloc, 1, "loss totals");
    norms_ = DevBuf<double>(dev_.alloc, static_cast<int64_t>(units.size()), "gradient norms");
    host_small_ = PinnedBuf(sizeof(CrossEntropyTotals) + units.size() * sizeof(double), "loss staging");
    if (s_.is_moe()) {  // the routing bookkeeping on the device (engine/cuda/moe_routing.h)
      aux_ = std::make_unique<DeviceMoeAux>(dev_.alloc, s_);
      moe_stats_ = std::make_unique<DeviceMoeStats>(dev_.alloc, s_);
      if (place_.layer_major)
        for (int64_t k = 0; k < K_; ++k) lm_aux_.emplace_back(dev_.alloc, s_);
    }
    // LongRoPE: one table per run, the long one when T exceeds the original
    // context (upload_batches refuses a micro-batch the CPU would rotate with the other)
    rope_long_ = s_.rope.scaling == RopeScaling::longrope && T_ > s_.rope.original_max_positions;
    std::vector<float> inv = cpu::rope_inv_freq(s_.rope, s_.head_dim, rope_long_);
    inv_freq_ = DevBuf<float>(dev_.alloc, static_cast<int64_t>(inv.size()), "RoPE frequencies");
    CUDA_CHECK(cudaMemcpy(inv_freq_.data(), inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
    if (s_.rope_local_on) {  // Gemma 3's local layers
      std::vector<float> loc = cpu::rope_inv_freq(s_.rope_local, s_.head_dim);
      inv_freq_local_ = DevBuf<float>(dev_.alloc, static_cast<int64_t>(loc.size()), "local RoPE frequencies");
      CUDA_CHECK(cudaMemcpy(inv_freq_local_.data(), loc.data(), loc.size() * 4, cudaMemcpyHostToDevice));
    }
    const size_t sc = op_scratch_bytes(s_, B_, T_, opt_);
    scratch_ = DevBuf<uint8_t>(dev_.alloc, static_cast<int64_t>(sc), "op scratch");
    if (opt_.muon) {  // the plan's next item: NS5's workspace for the largest Muon matrix
      const MuonMatrixDims md = muon_matrix_dims(s_);
      RT_CHECK(md.max_numel > 0, "[cuda] --optimizer muon: the model has no Muon matrices");
      muon_ = std::make_unique<GpuOrthogonalizer>(dev_.alloc, md.max_numel, md.max_small);
    }
    ops_ = std::make_unique<CudaOps>(dev_.alloc, dev_.blas, dev_.compute.get(), inv_freq_.data(),
                                     Scratch{scratch_.data(), sc});
    ops_->set_matmul(opt_.matmul);
    ops_->set_norm_offset(static_cast<float>(s_.norm_offset));  // Gemma's (1 + w) norms
    if (s_.rope_local_on) ops_->set_local_rope(inv_freq_local_.data());
    ops_->set_rope(s_.rotary_dim(), static_cast<float>(s_.rope_cos_scale()));
    // the MLP token chunk (CudaOptions::mlp_chunk_tokens), as plan_device picks
    // it: on what is left for the shared block activations and this scratch
    const uint64_t left =
        dev_.alloc.budget() - std::min(dev_.alloc.budget(), dev_.alloc.used() + dev_.alloc.budget() / 64);
    dm_ = BlockDims{B_, T_, plan_mlp_chunk_tokens(s_, B_, T_, opt_, left)};
    bscratch_ = std::make_unique<BlockScratch<CudaOps>>(*ops_, s_, dm_);
    grads_->make_landing(opt_.landing_chunk_bytes);
    optimizer_ = std::make_unique<OptimizerPhase>(st_, dev_, track_, *weights_, *grads_, muon_.get(), dp_);
    // Last: the block activations, the shared set and those of the last K
    // layers, which stay from forward to backward (their recompute is
    // skipped); K as asked or, on auto, as many as fit in what the plan leaves
    // of the budget once the shared set is in (1/64 of the budget held back).
    const uint64_t act_bytes = BlockActs<CudaOps>::bytes(s_, dm_);
    RT_CHECK(opt_.keep_activations >= -1, "[cuda] --keep-activations must be auto or a layer count >= 0, got ",
             opt_.keep_activations);
    RT_CHECK(opt_.keep_attention >= -1, "[cuda] --keep-attention must be auto or a layer count >= 0, got ",
             opt_.keep_attention);
    const KeptLayers kept = place_.layer_major ? KeptLayers{}  // layer-major recomputes every block
                                               : engine_kept_layers(s_, dm_, opt_, dev_.alloc.used(),
                                                                    dev_.alloc.budget());
    const int64_t keep = std::min(kept.all, L);
    acts_ = std::make_unique<LayerActs<CudaOps>>(*ops_, s_, dm_, keep, kept.attention);
    CUDA_CHECK(cudaStreamSynchronize(dev_.compute.get()));
    dp_version_ = track_.need_version();  // data parallel: the host shadows hold the whole weights now
    if (opt_.verbose)
      print_engine_setup(EngineSetup{opt_, place_, st_, weights_->count(), weights_->pinned_bytes(), keep, act_bytes,
                                     K_, dm_, dev_.alloc, muon_.get(), dp_, acts_->attn_kept_count(),
                                     AttnActs<CudaOps>::bytes(s_, dm_)});
  }

  ~StreamEngine() override {
    try {
      track_.drain();
    } catch (...) {
    }
    cudaDeviceSynchronize();
  }

  const char* matmul_name() const {
    return opt_.matmul == MatmulMode::fp8          ? "fp8 projections + bf16"
           : opt_.matmul == MatmulMode::fp8_tensor ? "fp8 projections (per-tensor scales) + bf16"
                                                   : "bf16";
  }
  std::string describe() const override {
    return cat("cuda ", opt_.resident ? "resident" : "streaming", " (", weights_->count(), " slots, ", matmul_name(), " compute, ",
               master_storage_name(st_.master_storage()), " master + ", moment_storage_name(st_.moment_storage()),
               " on ", global_pool().size(), " CPU threads", muon_ ? ", Muon's Newton-Schulz on the GPU" : "",
               track_.delayed() ? ", delayed update" : "", dp_describe(dp_), ")");
  }

  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override {
    track_.rethrow_if_failed();
    auto& units = st_.units();
    StepStats stats;
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), dev_.compute.get()));
    for (const Batch& b : batches)
      RT_CHECK(b.B == B_ && b.T == T_, "[engine] batch ", b.B, "x", b.T, " does not match the engine's ", B_, "x", T_);
    fold_step_ = place_.fold ? &o : nullptr;
    const std::vector<Batch> mine =
        dp_.on() ? rank_micro_batches(batches, dp_.grads->world(), dp_.grads->rank()) : std::vector<Batch>{};
    const bool lm = run_micro_batches(dp_.on() ? mine : batches, 1.0f / static_cast<float>(n_valid_total));
    fold_step_ = nullptr;
    // global norm: per-unit sums of squares, summed in unit order
    std::vector<double> host_norms;
    bool fold_applied = true;
    if (place_.fold)
      host_norms = optimizer_->wait_folded(&fold_applied);  // every unit is updated (or skipped) as it landed
    else if (place_.host_grads)
      host_norms = grads_->host_norms();
    else if (dp_.on())
      dp_reduce_scatter(dp_, *grads_, dev_, units.size(), norms_.data(), Scratch{scratch_.data(), scratch_.size()},
                        dp_grads_made_, dp_reduced_);  // and the norms of this rank's slices
    else
      grads_->queue_norms(norms_.data(), Scratch{scratch_.data(), scratch_.size()});
    auto* tot = host_small_.as<CrossEntropyTotals>();
    double* nrm = reinterpret_cast<double*>(host_small_.as<uint8_t>() + sizeof(CrossEntropyTotals));
    cudaStream_t cs = dev_.compute.get();
    CUDA_CHECK(cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, cs));
    CUDA_CHECK(cudaMemcpyAsync(nrm, norms_.data(), units.size() * sizeof(double), cudaMemcpyDeviceToHost, cs));
    if (moe_stats_) moe_stats_->stage(cs);  // the routing statistics, read after the wait below
    CUDA_CHECK(cudaEventRecord(backward_done_.get(), cs));
    CUDA_CHECK(cudaStreamSynchronize(cs));
    stats.loss_sum = o.inject_nan ? NAN : tot->loss_sum;  // the test hook, as the CPU backend honours it
    stats.n_valid = tot->n_valid;
    double sq = 0;
    if (dp_.on())
      sq = dp_step_totals(dp_, nrm, units.size(), &stats, &dp_stop_agreed_);
    else
      for (size_t u = 0; u < units.size(); ++u) sq += place_.host_grads ? host_norms[u] : nrm[u];
    stats.grad_norm = std::sqrt(sq);
    const bool ok = std::isfinite(stats.loss_sum) && std::isfinite(stats.grad_norm) && fold_applied;
    const float coef = clip_coefficient(stats.grad_norm, o.clip);
    track_.next_step();
    const int64_t step = track_.step();
    dev_.tracer.flush_step(step);
    last_busy_ = dev_.tracer.lane_busy_seconds(Lane::compute, step);
    last_h2d_ = dev_.h2d_bytes;
    dev_.h2d_bytes = 0;
    last_d2h_ = 0;
    for (size_t u = 0; u < units.size(); ++u)
      last_d2h_ += place_.host_embed && u == 0
                       ? static_cast<uint64_t>(N_) * s_.hidden * 2 * batches.size()  // dx of each micro-batch
                   : dp_.on() ? static_cast<uint64_t>(dp_.shard->range(u).e - dp_.shard->range(u).b) * 4  // the slice
                              : static_cast<uint64_t>(units[u].numel) * 4 * (place_.host_grads && !lm ? batches.size() : 1);
    // optimizer phase on the worker (fold mode: done as the gradients landed)
    cudaEvent_t done = backward_done_.get();
    if (!place_.fold) track_.push([this, o, coef, ok, step, done] { optimizer_->run(o, coef, ok, step, done); });
    stats.applied = ok;
    if (place_.fold && !fold_applied && fold_gate_open_)
      std::printf(
          "warning: step %lld: a unit's gradient is not finite; it was not updated, the units folded with finite "
          "gradients were (--grads fold updates each unit as its gradient lands)\n",
          (long long)step);
    return stats;
  }

  double loss_sum(const Batch& in, int64_t* n_valid) override {
    track_.rethrow_if_failed();
    RT_CHECK(in.B <= B_ && in.T == T_, "[engine] batch ", in.B, "x", in.T, " does not fit the engine's ", B_, "x", T_);
    Batch padded;
    const Batch* bp = &in;
    if (in.B < B_) {  // a short last validation batch: pad with rows that carry no loss
      padded = in;
      padded.B = B_;
      padded.inputs.resize(static_cast<size_t>(N_), 0);
      padded.targets.resize(static_cast<size_t>(N_), ignore_target);
      if (!padded.doc_start.empty()) padded.doc_start.resize(static_cast<size_t>(N_), 0);  // one document per row
      bp = &padded;
    }
    const Batch& b = *bp;
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), dev_.compute.get()));
    upload_batches(&b, 1);
    forward(false);
    head(false, 1.0f, ckpt_->at(s_.n_layers), targets_.data(), dx(0));
    return read_totals(n_valid);
  }

  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override {
    RT_CHECK(!place_.fold, "[engine] compute_grads needs host gradient arenas, which --grads fold does not keep");
    RT_CHECK(!dp_.on(), "[engine] compute_grads is not available on a data-parallel rank (weights-only state)");
    sync();
    CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, sizeof(CrossEntropyTotals), dev_.compute.get()));
    run_micro_batches(batches, 1.0f / static_cast<float>(n_valid_total));
    if (moe_stats_) moe_stats_->stage(dev_.compute.get());  // read_totals waits for it
    int64_t n_valid = 0;
    const double loss = read_totals(&n_valid);
    if (place_.host_grads) {  // they already landed in the host arenas
      track_.drain();
      return loss;
    }
    grads_->copy_to_host();
    // the layers in the slots are still current (no update happened)
    return loss;
  }

  void sync() override {
    track_.drain();
    CUDA_CHECK(cudaDeviceSynchronize());
    track_.synced();  // delayed update: the pending update is in; the next step trains on it
    if (dp_.on() && dp_version_ != track_.need_version()) {  // every rank's slices into the host shadows
      weights_->gather_into_host();
      dp_version_ = track_.need_version();
    }
  }

  bool gathers_checkpoints() const override { return dp_.on(); }
  bool pages_state() const override { return !dp_.on(); }  // optimizer_phase.cpp pages through the state tier
  int stop_agreement() const override { return dp_.on() ? (dp_stop_agreed_ ? 1 : 0) : -1; }

  // Data parallel: a checkpoint's gather of unit u (dp_rank.h).
  void gather_unit(size_t u, float* staging) override {
    RT_CHECK(dp_.on(), "[engine] gather_unit is for data-parallel ranks");
    track_.drain();
    dp_gather_unit(dp_, *grads_, st_.units()[u].numel, u, staging);
  }

  EngineStats stats() const override {
    EngineStats e;
    e.device_peak_bytes = dev_.alloc.peak();
    e.h2d_bytes = last_h2d_;
    e.d2h_bytes = last_d2h_;
    e.optimizer_seconds = optimizer_->seconds();
    e.optimizer_params = optimizer_->params();
    e.compute_busy_seconds = last_busy_;
    if (moe_stats_) {  // staged before the last step's wait for its loss
      e.moe_tokens_per_expert = moe_stats_->host_tokens();
      e.moe_aux_loss = moe_stats_->host_aux();
    }
    return e;
  }

 private:
  // Copies the loss totals out (waits for the compute stream); *n_valid tokens.
  double read_totals(int64_t* n_valid) {
    auto* tot = host_small_.as<CrossEntropyTotals>();
    CUDA_CHECK(
        cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, dev_.compute.get()));
    CUDA_CHECK(cudaStreamSynchronize(dev_.compute.get()));
    *n_valid = tot->n_valid;
    return tot->loss_sum;
  }

  // Forward + backward of every micro-batch of a step, gradients summed in
  // micro-batch order; layer-major when planned for this many. Returns
  // whether it ran layer-major.
  bool run_micro_batches(const std::vector<Batch>& batches, float grad_scale) {
    aux_scale_ = 1.0f / static_cast<float>(batches.size());  // MoE: the load-balancing loss, mean over micro-batches
    if (moe_stats_) moe_stats_->reset(dev_.compute.get());
    if (place_.layer_major && static_cast<int64_t>(batches.size()) == K_) {
      upload_batches(batches.data(), K_);
      forward_layer_major();
      for (int64_t k = 0; k < K_; ++k) {
        const int64_t next = k + 1 < K_ ? k + 1 : 0, next_i = k + 1 < K_ ? s_.n_layers : s_.n_layers - 1;
        const bf16* xL = ckpt_->lm_in(k, s_.n_layers);
        ckpt_->lm_prefetch(next, next_i);  // the next head's input, or the backward's first
        head(true, grad_scale, xL, targets_.data() + k * N_, dx(k));
        ckpt_->lm_done(k, s_.n_layers);
      }
      open_fold_gate();
      backward_layer_major();
      return true;
    }
    for (size_t k = 0; k < batches.size(); ++k) {
      first_micro_ = k == 0;
      upload_batches(&batches[k], 1);
      forward(true);
      head(true, grad_scale, ckpt_->at(s_.n_layers), targets_.data(), dx(0));
      open_fold_gate();
      backward();
    }
    return false;
  }

  // Fold mode, between the heads and the backward of a training step: the
  // units update as their gradients land, so the loss is checked first (one
  // wait for the compute stream): a non-finite loss (or the inject_nan test
  // hook) updates no unit, as the other modes skip such a step.
  void open_fold_gate() {
    if (!fold_step_) return;
    int64_t nv = 0;
    const double loss = read_totals(&nv);
    fold_gate_open_ = std::isfinite(loss) && !fold_step_->inject_nan;
    optimizer_->begin_fold(*fold_step_, fold_gate_open_, track_.step() + 1);
  }

  bf16* dx(int64_t k) { return dx_.data() + k * N_ * s_.hidden; }
  // LongRoPE picks its short or long factors per forward from the largest
  // position (cpu::RopeTables); this engine holds the one its T implies.
  void rope_table_check(const int32_t* pos) const {
    int64_t mx = -1;
    for (int64_t n = 0; n < N_; ++n) mx = std::max<int64_t>(mx, pos[n]);
    const bool want_long = mx + 1 > s_.rope.original_max_positions;
    RT_CHECK(want_long == rope_long_, "[cuda] LongRoPE: a micro-batch's positions reach ", mx, ", so transformers (and ",
             "the CPU backend) rotate it with the ", want_long ? "long" : "short", " factors, but this run's sequence ",
             "length ", T_, " set the CUDA engine to the ", rope_long_ ? "long" : "short",
             " ones (one table per run; original_max_position_embeddings ", s_.rope.original_max_positions,
             "): use a sequence length on the same side of it as every document, or --device cpu");
  }
  // Host staging of micro-batch k's ids, targets and positions.
  int32_t* ids_h(int64_t k) { return host_io_.as<int32_t>() + k * N_; }
  int32_t* targets_h(int64_t k) { return host_io_.as<int32_t>() + (K_ + k) * N_; }
  int32_t* pos_h(int64_t k) { return host_io_.as<int32_t>() + (2 * K_ + k) * N_; }
  int32_t* doc_h(int64_t k) { return host_io_.as<int32_t>() + (3 * K_ + k) * N_; }
  // Micro-batch k's document starts on the device, or nullptr (plain causal).
  const int32_t* doc(int64_t k) const { return has_doc_[static_cast<size_t>(k)] ? doc_.data() + k * N_ : nullptr; }

  // Micro-batches b[0..count) -> ids_, targets_, pos_ (and doc_ where a
  // micro-batch has document starts) at k * N.
  void upload_batches(const Batch* b, int64_t count) {
    // the staging buffer may still be read by the previous batch's copies
    CUDA_CHECK(cudaStreamSynchronize(dev_.compute.get()));
    for (int64_t k = 0; k < count; ++k) {
      std::copy(b[k].inputs.begin(), b[k].inputs.begin() + N_, ids_h(k));
      std::copy(b[k].targets.begin(), b[k].targets.begin() + N_, targets_h(k));
      batch_positions(b[k], pos_h(k));
      if (s_.rope.scaling == RopeScaling::longrope) rope_table_check(pos_h(k));
      const int32_t* d = batch_doc_start(b[k]);
      has_doc_[static_cast<size_t>(k)] = d != nullptr;
      if (d) std::copy(d, d + N_, doc_h(k));
    }
    cudaStream_t cs = dev_.compute.get();
    const size_t bytes = static_cast<size_t>(count * N_) * 4;
    CUDA_CHECK(cudaMemcpyAsync(ids_.data(), ids_h(0), bytes, cudaMemcpyHostToDevice, cs));
    CUDA_CHECK(cudaMemcpyAsync(targets_.data(), targets_h(0), bytes, cudaMemcpyHostToDevice, cs));
    CUDA_CHECK(cudaMemcpyAsync(pos_.data(), pos_h(0), bytes, cudaMemcpyHostToDevice, cs));
    for (int64_t k = 0; k < count; ++k)
      if (has_doc_[static_cast<size_t>(k)])
        CUDA_CHECK(
            cudaMemcpyAsync(doc_.data() + k * N_, doc_h(k), static_cast<size_t>(N_) * 4, cudaMemcpyHostToDevice, cs));
  }

  // Layer i's load waits (on this thread) for its update; the layers after
  // it are loaded ahead only when their updates are already in, so that
  // queuing layer i never waits for a later layer's update (the forward
  // trails the optimizer by one layer, not by the prefetch depth).
  void load_for_forward(int64_t i) {
    weights_->load_layer(i);
    for (int64_t j = i + 1; j < std::min<int64_t>(s_.n_layers, i + weights_->prefetch_depth()) &&
                            track_.is_updated(static_cast<size_t>(j + 1), track_.need_version());
         ++j)
      weights_->load_layer(j);
  }

  void forward_layer_major() {
    const int64_t L = s_.n_layers, C = s_.hidden;
    const int S = weights_->count();
    auto& units = st_.units();
    cudaStream_t cs = dev_.compute.get();
    if (host_embed_)
      track_.wait_updated(0, track_.need_version());
    else
      weights_->ensure_embed();
    auto span = dev_.tracer.gpu_begin(Lane::compute, "embed", -1, cs);
    for (int64_t k = 0; k < K_; ++k) {
      bf16* x0 = ckpt_->lm_out(k, 0);
      if (host_embed_) {
        // one gathered block in pinned memory: the last one's copy must be done
        if (k > 0) CUDA_CHECK(cudaStreamSynchronize(cs));
        host_embed_->gather(ids_h(k), weights_->shadow_src(0));
        host_embed_->copy_in(x0);
      } else {
        embedding_forward(x0, ids_.data() + k * N_, weights_->embed(), N_, C, cs);
      }
      if (s_.embedding_multiplier != 1.0)  // Granite
        scale(x0, x0, static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
      ckpt_->lm_written(k, 0);
    }
    dev_.tracer.gpu_end(span, cs);
    ckpt_->lm_prefetch(0, 0);
    const bool moe = s_.is_moe();  // one routing record per micro-batch (model/moe_aux.h)
    if (moe) {
      for (DeviceMoeAux& a : lm_aux_) a.begin(cs);  // one per micro-batch (the constructor made K_)
    }
    for (int64_t i = 0; i < L; ++i) {
      load_for_forward(i);
      const bf16* w = weights_->use_layer(i);
      const BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
      auto sp = dev_.tracer.gpu_begin(Lane::compute, "forward", static_cast<int>(i), cs);
      const auto codes = ops_->share_weights();  // --matmul fp8: layer i's weights quantized once for the K
      for (int64_t k = 0; k < K_; ++k) {
        const bf16* x = ckpt_->lm_in(k, i);
        if (k + 1 < K_)
          ckpt_->lm_prefetch(k + 1, i);
        else if (i + 1 < L)
          ckpt_->lm_prefetch(0, i + 1);
        else
          ckpt_->lm_prefetch(0, L);  // the first head's input
        bf16* y = ckpt_->lm_out(k, i + 1);
        const MoeLayerRouting routing = moe ? lm_aux_[static_cast<size_t>(k)].forward_routing(i) : MoeLayerRouting{};
        block_forward(*ops_, s_, bw, dm_, x, y, pos_.data() + k * N_, acts_->shared(), doc(k),
                      moe ? &routing : nullptr);
        ckpt_->lm_done(k, i);
        ckpt_->lm_written(k, i + 1);
      }
      dev_.tracer.gpu_end(sp, cs);
      if (i + S < L) weights_->release_layer(i);  // the last S layers stay for the backward's turn-around
    }
    if (moe)
      for (int64_t k = 0; k < K_; ++k) count_routing(lm_aux_[static_cast<size_t>(k)]);
  }

  // MoE: a micro-batch's forward routing done: its load-balancing loss and
  // gradient factor (as ModelRunner::forward_backward), and the step's stats,
  // all queued on the compute stream (no wait).
  void count_routing(DeviceMoeAux& a) {
    a.finish(N_, s_.moe.aux_loss_on() ? s_.moe.router_aux_loss_coef * aux_scale_ : 0.0, aux_scale_, *moe_stats_,
             dev_.compute.get());
  }

  void backward_layer_major() {
    const int64_t L = s_.n_layers, C = s_.hidden;
    const int S = weights_->count();
    auto& units = st_.units();
    cudaStream_t cs = dev_.compute.get();
    for (int64_t i = L - 1; i >= 0; --i) {
      const bf16* w = weights_->use_layer(i);
      grads_->wait_zeroed(static_cast<size_t>(i + 1));
      float* g = grads_->dev_grad(static_cast<size_t>(i + 1));
      grads_->begin_layer(i);
      const BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
      const BlockGrads bg = bind_grads(units[i + 1], g);
      auto sp = dev_.tracer.gpu_begin(Lane::compute, "backward", static_cast<int>(i), cs);
      {
        const auto codes = ops_->share_weights();  // --matmul fp8: layer i's weights quantized once for the K
        // in micro-batch order: the gradient sums as micro-batch-major's do
        for (int64_t k = 0; k < K_; ++k) {
          const bf16* x = ckpt_->lm_in(k, i);
          if (k + 1 < K_)
            ckpt_->lm_prefetch(k + 1, i);
          else if (i > 0)
            ckpt_->lm_prefetch(0, i - 1);
          const int32_t* pos = pos_.data() + k * N_;
          block_forward(*ops_, s_, bw, dm_, x, nullptr, pos, acts_->shared(), doc(k));  // recompute: no output needed
          const MoeLayerRouting back = s_.is_moe() ? lm_aux_[static_cast<size_t>(k)].backward_routing()
                                                   : MoeLayerRouting{};
          block_backward(*ops_, s_, bw, dm_, x, dx(k), dx(k), pos, acts_->shared(), *bscratch_, bg, doc(k),
                         s_.is_moe() ? &back : nullptr);
          ckpt_->lm_done(k, i);
        }
      }
      dev_.tracer.gpu_end(sp, cs);
      grads_->end_layer(i, /*first_micro=*/true);  // the whole step's gradient of layer i: it leaves once
      weights_->release_layer(i);
      if (i - S >= 0) weights_->load_layer(i - S);
    }
    for (int64_t k = 0; k < K_; ++k) {
      if (s_.embedding_multiplier != 1.0)  // Granite: x0 = embed * m
        scale(dx(k), dx(k), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
      if (host_embed_) {
        host_embed_->land(dx(k), ids_h(k), k == 0);
      } else {
        grads_->wait_zeroed(0);
        Scratch sc{scratch_.data(), scratch_.size()};
        embedding_backward(grads_->dev_grad(0), dx(k), ids_.data() + k * N_, N_, C, s_.vocab, sc, cs);
      }
    }
    grads_->end_backward(/*first_micro=*/true);
  }

  void forward(bool training) {
    const int64_t L = s_.n_layers, C = s_.hidden;
    const int S = weights_->count();
    auto& units = st_.units();
    cudaStream_t cs = dev_.compute.get();
    if (host_embed_) {
      // Rows of the current shadow, gathered here, then one copy in on the
      // compute stream. The staging buffer's previous copy is done:
      // upload_batch synchronised the stream.
      track_.wait_updated(0, track_.need_version());
      host_embed_->gather(host_io_.as<int32_t>(), weights_->shadow_src(0));
    } else {
      weights_->ensure_embed();
    }
    auto span = dev_.tracer.gpu_begin(Lane::compute, "embed", -1, cs);
    ckpt_->before_write(0);
    if (host_embed_)
      host_embed_->copy_in(ckpt_->at(0));
    else
      embedding_forward(ckpt_->at(0), ids_.data(), weights_->embed(), N_, C, cs);
    if (s_.embedding_multiplier != 1.0)  // Granite
      scale(ckpt_->at(0), ckpt_->at(0), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
    dev_.tracer.gpu_end(span, cs);
    if (training) ckpt_->written(0);
    const bool moe = training && s_.is_moe();  // the training forward counts the routing (model/moe_aux.h)
    if (moe) aux_->begin(cs);
    for (int64_t i = 0; i < L; ++i) {
      load_for_forward(i);
      const bf16* w = weights_->use_layer(i);
      ckpt_->before_write(i + 1);
      auto sp = dev_.tracer.gpu_begin(Lane::compute, "forward", static_cast<int>(i), cs);
      const MoeLayerRouting routing = moe ? aux_->forward_routing(i) : MoeLayerRouting{};
      block_forward(*ops_, s_, bind_weights<bf16>(units[i + 1], w), dm_, ckpt_->at(i), ckpt_->at(i + 1), pos_.data(),
                    training ? acts_->of(i) : acts_->shared(), doc(0), moe ? &routing : nullptr);
      if (training && acts_->attn_kept(i)) acts_->attn_of(i).swap_with(acts_->shared());
      dev_.tracer.gpu_end(sp, cs);
      if (training && i + 1 < L) ckpt_->written(i + 1);
      // the last S layers stay for the backward's turn-around
      if (i + S < L || !training) weights_->release_layer(i);
    }
    if (moe) count_routing(*aux_);  // the load-balancing loss and its gradient factor
  }

  // The final norm, LM head and loss of the micro-batch whose last block
  // output is xL (targets on the device); training: its residual gradient
  // into dx_out, the head's weight gradients accumulated.
  void head(bool training, float grad_scale, const bf16* xL, const int32_t* targets, bf16* dx_out) {
    const int64_t L = s_.n_layers, C = s_.hidden;
    const size_t H = static_cast<size_t>(L + 1);
    auto& hu = st_.units()[H];
    cudaStream_t cs = dev_.compute.get();
    weights_->ensure_head();
    const bf16* final_norm = weights_->head() + entry_offset(hu, WeightKind::final_norm);
    const bf16* lm = s_.tie_embeddings ? weights_->embed() : weights_->head() + entry_offset(hu, WeightKind::lm_head);
    float* g_norm = grads_->dev_grad(H) + entry_offset(hu, WeightKind::final_norm);
    float* g_lm = s_.tie_embeddings ? grads_->dev_grad(0) : grads_->dev_grad(H) + entry_offset(hu, WeightKind::lm_head);
    if (training) {  // first writes of these gradients this step
      grads_->wait_zeroed(H);
      if (s_.tie_embeddings) grads_->wait_zeroed(0);
    }
    auto span = dev_.tracer.gpu_begin(Lane::compute, "head", -1, cs);
    const float noff = static_cast<float>(s_.norm_offset);  // Gemma: (1 + w)
    rms_norm_forward(hf_.data(), rstd_f_.data(), xL, final_norm, N_, C, static_cast<float>(s_.rms_eps), cs, noff);
    const float ls = static_cast<float>(1.0 / s_.logits_scaling);  // Granite: logits / logits_scaling
    if (ls != 1.f) scale(hf_.data(), hf_.data(), ls, N_ * C, cs);
    Scratch sc{scratch_.data(), scratch_.size()};
    lm_head_cross_entropy(dev_.blas, training ? dhf_.data() : nullptr, training ? g_lm : nullptr, totals_.data(),
                          hf_.data(), lm, targets, N_, C, s_.vocab, grad_scale, opt_.ce_chunk_rows, sc, cs,
                          static_cast<float>(s_.final_softcap));  // Gemma 2
    if (training && ls != 1.f) scale(dhf_.data(), dhf_.data(), ls, N_ * C, cs);
    if (training)
      rms_norm_backward(dx_out, g_norm, dhf_.data(), xL, final_norm, rstd_f_.data(), nullptr, N_, C, sc, cs, noff);
    dev_.tracer.gpu_end(span, cs);
  }

  void backward() {
    const int64_t L = s_.n_layers, C = s_.hidden;
    const int S = weights_->count();
    auto& units = st_.units();
    cudaStream_t cs = dev_.compute.get();
    ckpt_->begin_backward();
    // MoE: the load-balancing gradient
    const MoeLayerRouting back_routing = aux_ ? aux_->backward_routing() : MoeLayerRouting{};
    for (int64_t i = L - 1; i >= 0; --i) {
      const bf16* w = weights_->use_layer(i);
      ckpt_->before_backward(i);
      grads_->wait_zeroed(static_cast<size_t>(i + 1));
      float* g = grads_->dev_grad(static_cast<size_t>(i + 1));
      grads_->begin_layer(i);
      BlockWeightsT<bf16> bw = bind_weights<bf16>(units[i + 1], w);
      auto sp = dev_.tracer.gpu_begin(Lane::compute, "backward", static_cast<int>(i), cs);
      if (acts_->attn_kept(i))  // selective recompute: the attention half was kept
        block_recompute_mlp_half(*ops_, s_, bw, dm_, ckpt_->at(i), acts_->attn_of(i), acts_->shared());
      else if (!acts_->kept(i))  // recompute (a kept layer still holds its forward's activations); no output needed
        block_forward(*ops_, s_, bw, dm_, ckpt_->at(i), nullptr, pos_.data(), acts_->shared(), doc(0));
      block_backward(*ops_, s_, bw, dm_, ckpt_->at(i), dx_.data(), dx_.data(), pos_.data(), acts_->of(i), *bscratch_,
                     bind_grads(units[i + 1], g), doc(0), s_.is_moe() ? &back_routing : nullptr);
      dev_.tracer.gpu_end(sp, cs);
      ckpt_->after_backward(i);
      grads_->end_layer(i, first_micro_);
      weights_->release_layer(i);
      if (i - S >= 0) weights_->load_layer(i - S);
    }
    if (s_.embedding_multiplier != 1.0)  // Granite: x0 = embed * m
      scale(dx_.data(), dx_.data(), static_cast<float>(s_.embedding_multiplier), N_ * C, cs);
    if (host_embed_) {
      host_embed_->land(dx_.data(), host_io_.as<int32_t>(), first_micro_);
    } else {
      grads_->wait_zeroed(0);
      Scratch sc{scratch_.data(), scratch_.size()};
      embedding_backward(grads_->dev_grad(0), dx_.data(), ids_.data(), N_, C, s_.vocab, sc, cs);
    }
    grads_->end_backward(first_micro_);
  }

  uint64_t last_h2d_ = 0, last_d2h_ = 0;
  double last_busy_ = -1;
  HostState& st_;
  const ModelSpec& s_;
  int64_t B_, T_, N_;
  int64_t K_ = 1;  // micro-batches the buffers hold (layer-major: DevicePlacement::sets)
  CudaOptions opt_;
  GpuDataParallel dp_;  // on(): a data-parallel rank (backend.h)
  Event dp_grads_made_, dp_reduced_;
  bool dp_stop_agreed_ = false;  // data parallel: some rank asked to stop (stop_agreement)
  int64_t dp_version_ = -1;  // data parallel: the host shadows hold every rank's slices as of this version
  float aux_scale_ = 1.0f;
  EngineDevice dev_;
  DevicePlacement place_;
  bool first_micro_ = true;
  const OptimStep* fold_step_ = nullptr;  // fold mode: the step being trained (train_step)
  bool fold_gate_open_ = true;            // fold mode: the step's loss was finite
  Event backward_done_;
  std::unique_ptr<WeightSlots> weights_;
  std::unique_ptr<HostEmbedding> host_embed_;  // only with host gradients and an untied embedding
  std::unique_ptr<GradientSink> grads_;
  std::unique_ptr<CheckpointStore> ckpt_;
  std::unique_ptr<GpuOrthogonalizer> muon_;  // --optimizer muon: NS5 on the GPU (before optimizer_, which uses it)
  std::unique_ptr<OptimizerPhase> optimizer_;
  DevBuf<bf16> hf_, dx_, dhf_;
  DevBuf<float> rstd_f_, inv_freq_, inv_freq_local_;
  bool rope_long_ = false;  // LongRoPE: inv_freq_ holds the long factors' table
  DevBuf<int32_t> ids_, targets_, pos_, doc_;
  std::vector<bool> has_doc_;  // per micro-batch slot: doc_ holds its document starts
  PinnedBuf host_io_, host_small_;
  DevBuf<CrossEntropyTotals> totals_;
  DevBuf<double> norms_;
  // MoE: the routing bookkeeping of the micro-batch in flight (on the device:
  // engine/cuda/moe_routing.h), its share of the load-balancing loss, and the
  // step's statistics (after dev_: their memory is its allocator's)
  std::unique_ptr<DeviceMoeAux> aux_;
  std::vector<DeviceMoeAux> lm_aux_;  // layer-major: one per micro-batch
  std::unique_ptr<DeviceMoeStats> moe_stats_;
  DevBuf<uint8_t> scratch_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<LayerActs<CudaOps>> acts_;  // shared (recomputed layers) + layers L-K..L-1, forward to backward
  std::unique_ptr<BlockScratch<CudaOps>> bscratch_;
  BlockDims dm_{0, 0};   // B_ x T_ and the MLP token chunk (0: unchunked), for every block call
  UpdateTracker track_;  // last: its worker thread stops first
};

}  // namespace

std::unique_ptr<Backend> make_stream_engine(HostState& state, int64_t micro_batch, int64_t seq_len,
                                            const CudaOptions& opt) {
  return std::make_unique<StreamEngine>(state, micro_batch, seq_len, opt);
}

}  // namespace cuda
}  // namespace rt
