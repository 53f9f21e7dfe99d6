// The CUDA streaming engine's class, internal to engine/cuda/: declared here,
// defined in stream_engine.cpp (set-up, the step, the Backend calls, batch
// uploads) and stream_engine_passes.cpp (the forward, head and backward
// passes, micro-batch-major and layer-major). The way in is make_stream_engine
// (stream_engine.h); stream_engine.cpp's header comment describes the schedule.
#pragma once
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
#include "engine/cuda/weight_slots.h"
#include "engine/device_plan.h"
#include "engine/unit_binding.h"
#include "engine/update_tracker.h"
#include "model/block.h"

namespace rt::cuda {

class StreamEngine final : public Backend {
 public:
  StreamEngine(HostState& st, int64_t B, int64_t T, const CudaOptions& opt);

  ~StreamEngine() override;

  const char* matmul_name() const;
  std::string describe() const override;

  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override;

  double loss_sum(const Batch& in, int64_t* n_valid) override;

  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override;

  void sync() override;

  bool gathers_checkpoints() const override { return dp_.on(); }
  bool pages_state() const override { return !dp_.on(); }  // optimizer_phase.cpp pages through the state tier
  std::string weight_paging_refusal() const override { return weights_->paging_refusal(); }
  void weights_will_page() override;
  void weights_paged() override;
  int stop_agreement() const override { return dp_.on() ? (dp_stop_agreed_ ? 1 : 0) : -1; }

  // Data parallel: a checkpoint's gather of unit u (dp_rank.h).
  void gather_unit(size_t u, float* staging) override;

  EngineStats stats() const override;

 private:
  // Copies the loss totals out (waits for the compute stream); *n_valid tokens.
  double read_totals(int64_t* n_valid);

  // Forward + backward of every micro-batch of a step, gradients summed in
  // micro-batch order; layer-major when planned for this many. Returns
  // whether it ran layer-major.
  bool run_micro_batches(const std::vector<Batch>& batches, float grad_scale);

  // Fold mode, between the heads and the backward of a training step: the
  // units update as their gradients land, so the loss is checked first (one
  // wait for the compute stream): a non-finite loss (or the inject_nan test
  // hook) updates no unit, as the other modes skip such a step.
  void open_fold_gate();

  bf16* dx(int64_t k) { return dx_.data() + k * N_ * s_.hidden; }
  // LongRoPE picks its short or long factors per forward from the largest
  // position (cpu::RopeTables); this engine holds the one its T implies.
  void rope_table_check(const int32_t* pos) const;
  // Host staging of micro-batch k's ids, targets and positions.
  int32_t* ids_h(int64_t k) { return host_io_.as<int32_t>() + k * N_; }
  int32_t* targets_h(int64_t k) { return host_io_.as<int32_t>() + (K_ + k) * N_; }
  int32_t* pos_h(int64_t k) { return host_io_.as<int32_t>() + (2 * K_ + k) * N_; }
  int32_t* doc_h(int64_t k) { return host_io_.as<int32_t>() + (3 * K_ + k) * N_; }
  // Micro-batch k's document starts on the device, or nullptr (plain causal).
  const int32_t* doc(int64_t k) const { return has_doc_[static_cast<size_t>(k)] ? doc_.data() + k * N_ : nullptr; }

  // Micro-batches b[0..count) -> ids_, targets_, pos_ (and doc_ where a
  // micro-batch has document starts) at k * N.
  void upload_batches(const Batch* b, int64_t count);

  // Layer i's load waits (on this thread) for its update; the layers after
  // it are loaded ahead only when their updates are already in, so that
  // queuing layer i never waits for a later layer's update (the forward
  // trails the optimizer by one layer, not by the prefetch depth).
  void load_for_forward(int64_t i);

  void forward_layer_major();

  // MoE: a micro-batch's forward routing done: its load-balancing loss and
  // gradient factor (as ModelRunner::forward_backward), and the step's stats,
  // all queued on the compute stream (no wait).
  void count_routing(DeviceMoeAux& a);

  void backward_layer_major();

  void forward(bool training);

  // The final norm, LM head and loss of the micro-batch whose last block
  // output is xL (targets on the device); training: its residual gradient
  // into dx_out, the head's weight gradients accumulated.
  void head(bool training, float grad_scale, const bf16* xL, const int32_t* targets, bf16* dx_out);

  void backward();

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
  int64_t dp_version_ = -1;      // data parallel: the host shadows hold every rank's slices as of this version
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

}  // namespace rt::cuda
