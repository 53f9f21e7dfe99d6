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
#include "engine/cuda/stream_engine.h"

#include <chrono>

#include "engine/cuda/stream_engine_impl.h"

namespace rt::cuda {

StreamEngine::StreamEngine(HostState& st, int64_t B, int64_t T, const CudaOptions& opt)
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
           "[cuda] --master ", opt_.master,
           " keeps one bf16 copy, which --delayed-update would overwrite while the "
           "step trains on it: use --master split (exact) with --delayed-update");
  if (dp_.on()) {  // GpuDataParallel (backend.h): the state is weights only, the master is in the shards
    RT_CHECK(st_.weights_only(), "[cuda] internal: a data-parallel rank's state must be weights only");
    RT_CHECK(!s_.is_moe(), "[dp] data parallelism does not support mixture-of-experts models (", s_.architecture,
             ") yet: their load-balancing loss is a mean over each process's micro-batches; "
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
  if (place_.fold)
    grads_->set_fold([this](size_t u, int64_t b, int64_t e, const float* g, const double* sumsq) {
      optimizer_->fold(u, b, e, g, sumsq);
    });
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
  grads_->make_landing(opt_);
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
  // layer-major: no whole layers, the attention halves of each micro-batch of the last layers
  const int64_t sets = place_.layer_major ? K_ : 1;
  const KeptLayers kept = engine_kept_layers(s_, dm_, opt_, dev_.alloc.used(), dev_.alloc.budget(), sets);
  const int64_t keep = std::min(kept.all, L);
  acts_ = std::make_unique<LayerActs<CudaOps>>(*ops_, s_, dm_, keep, kept.attention, sets);
  CUDA_CHECK(cudaStreamSynchronize(dev_.compute.get()));
  dp_version_ = track_.need_version();  // data parallel: the host shadows hold the whole weights now
  // Fold: the first units' updates under the next forward (OptimizerPhase::
  // enable_fold_defer), last of the host allocations, in at most half of
  // what the kernel reports available less 2 GiB
  uint64_t defer_bytes = 0;
  if (place_.fold) {
    const uint64_t avail = host_memory_available(), reserve = 2ull << 30;
    defer_bytes = optimizer_->enable_fold_defer(fold_defer_share(), avail > reserve ? (avail - reserve) / 2 : 0);
  }
  if (opt_.verbose)
    print_engine_setup(EngineSetup{opt_, place_, st_, weights_->count(), weights_->pinned_bytes(), keep, act_bytes, K_,
                                   dm_, dev_.alloc, muon_.get(), dp_, acts_->attn_kept_count(),
                                   AttnActs<CudaOps>::bytes(s_, dm_) * static_cast<uint64_t>(sets)});
  if (opt_.verbose && defer_bytes > 0)
    std::printf(
        "fold: the updates of the first %zu units in fold order (head, last layers) run under the next "
        "forward, their gradients held aside in %.2f GiB of host RAM\n",
        optimizer_->fold_deferred_units(), defer_bytes / double(1ull << 30));
}

StreamEngine::~StreamEngine() {
  try {
    track_.drain();
  } catch (...) {
  }
  cudaDeviceSynchronize();
}

const char* StreamEngine::matmul_name() const {
  return opt_.matmul == MatmulMode::fp8          ? "fp8 projections + bf16"
         : opt_.matmul == MatmulMode::fp8_tensor ? "fp8 projections (per-tensor scales) + bf16"
                                                 : "bf16";
}

std::string StreamEngine::describe() const {
  return cat("cuda ", opt_.resident ? "resident" : "streaming", " (", weights_->count(), " slots, ", matmul_name(),
             " compute, ", master_storage_name(st_.master_storage()), " master + ",
             moment_storage_name(st_.moment_storage()), " on ", global_pool().size(), " CPU threads",
             muon_ ? ", Muon's Newton-Schulz on the GPU" : "", track_.delayed() ? ", delayed update" : "",
             dp_describe(dp_), ")");
}

StepStats StreamEngine::train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) {
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
                 : dp_.on()
                     ? static_cast<uint64_t>(dp_.shard->range(u).e - dp_.shard->range(u).b) * 4  // the slice
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

double StreamEngine::loss_sum(const Batch& in, int64_t* n_valid) {
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

double StreamEngine::compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) {
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

void StreamEngine::sync() {
  track_.drain();
  CUDA_CHECK(cudaDeviceSynchronize());
  track_.synced();  // delayed update: the pending update is in; the next step trains on it
  if (dp_.on() && dp_version_ != track_.need_version()) {  // every rank's slices into the host shadows
    weights_->gather_into_host();
    dp_version_ = track_.need_version();
  }
}

void StreamEngine::weights_will_page() {
  track_.drain();
  weights_->page_weights();
}

void StreamEngine::weights_paged() {
  if (!weights_->paged()) {  // fp32 master: the master pages, the device loads the engine's own shadows
    if (opt_.verbose)
      std::printf(
          "cuda engine: the fp32 master pages with the optimizer state (--state-dir); the device loads the "
          "engine's own pinned bf16 shadows\n");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  weights_->upload_all_paged();
  if (opt_.verbose) {
    uint64_t bytes = 0;
    for (const StateUnit& u : st_.units()) bytes += static_cast<uint64_t>(u.numel) * 2;
    std::printf(
        "cuda engine: the weights page (--state-dir): the device holds every layer (%d slots for %lld layers), the "
        "head and %s; each unit's weights cross PCIe once a step, right after its update (%.1f MiB uploaded at "
        "start in %.2f s)\n",
        weights_->count(), (long long)s_.n_layers,
        host_embed_ ? "the host embedding an engine-owned bf16 copy of its table (outside --max-host-memory)"
                    : "the embedding",
        bytes / double(1 << 20), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

void StreamEngine::gather_unit(size_t u, float* staging) {
  RT_CHECK(dp_.on(), "[engine] gather_unit is for data-parallel ranks");
  track_.drain();
  dp_gather_unit(dp_, *grads_, st_.units()[u].numel, u, staging);
}

EngineStats StreamEngine::stats() const {
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

double StreamEngine::read_totals(int64_t* n_valid) {
  auto* tot = host_small_.as<CrossEntropyTotals>();
  CUDA_CHECK(
      cudaMemcpyAsync(tot, totals_.data(), sizeof(CrossEntropyTotals), cudaMemcpyDeviceToHost, dev_.compute.get()));
  CUDA_CHECK(cudaStreamSynchronize(dev_.compute.get()));
  *n_valid = tot->n_valid;
  return tot->loss_sum;
}

bool StreamEngine::run_micro_batches(const std::vector<Batch>& batches, float grad_scale) {
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
    grads_->land_head(/*first_micro=*/true);  // host / fold gradients: the head's leaves under the backward
    backward_layer_major();
    return true;
  }
  for (size_t k = 0; k < batches.size(); ++k) {
    first_micro_ = k == 0;
    upload_batches(&batches[k], 1);
    forward(true);
    head(true, grad_scale, ckpt_->at(s_.n_layers), targets_.data(), dx(0));
    open_fold_gate();
    grads_->land_head(first_micro_);  // host / fold gradients: the head's leaves under the backward
    backward();
  }
  return false;
}

void StreamEngine::open_fold_gate() {
  if (!fold_step_) return;
  int64_t nv = 0;
  const double loss = read_totals(&nv);
  fold_gate_open_ = std::isfinite(loss) && !fold_step_->inject_nan;
  optimizer_->begin_fold(*fold_step_, fold_gate_open_, track_.step() + 1);
}

void StreamEngine::rope_table_check(const int32_t* pos) const {
  int64_t mx = -1;
  for (int64_t n = 0; n < N_; ++n) mx = std::max<int64_t>(mx, pos[n]);
  const bool want_long = mx + 1 > s_.rope.original_max_positions;
  RT_CHECK(want_long == rope_long_, "[cuda] LongRoPE: a micro-batch's positions reach ", mx, ", so transformers (and ",
           "the CPU backend) rotate it with the ", want_long ? "long" : "short", " factors, but this run's sequence ",
           "length ", T_, " set the CUDA engine to the ", rope_long_ ? "long" : "short",
           " ones (one table per run; original_max_position_embeddings ", s_.rope.original_max_positions,
           "): use a sequence length on the same side of it as every document, or --device cpu");
}

void StreamEngine::upload_batches(const Batch* b, int64_t count) {
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

std::unique_ptr<Backend> make_stream_engine(HostState& state, int64_t micro_batch, int64_t seq_len,
                                            const CudaOptions& opt) {
  return std::make_unique<StreamEngine>(state, micro_batch, seq_len, opt);
}

}  // namespace rt::cuda
