// Backend: where a training step's forward, backward and optimizer run.
// The CPU backend (engine/cpu_backend.cpp) is the reference; the CUDA
// streaming engine (engine/cuda/stream_engine.cpp) streams layers through the GPU
// from the same HostState. The trainer owns data, schedule and logs and only
// talks to this interface.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "data/dataset.h"
#include "optim/unit_update.h"
#include "state/host_state.h"

namespace rt {

class Collective;
class ShardedOptimizer;

struct StepStats {
  double loss_sum = 0;   // sum of token losses over every micro-batch
  int64_t n_valid = 0;   // predicted tokens
  double grad_norm = 0;  // global L2 norm before clipping
  bool applied = false;  // false: loss or norm not finite, no update
};

// Counters of the last completed step, for logs and bench/.
struct EngineStats {
  uint64_t device_peak_bytes = 0;  // engine allocations, high-water mark
  uint64_t h2d_bytes = 0, d2h_bytes = 0;
  double optimizer_seconds = 0;  // CPU AdamW time of the last optimizer phase
  int64_t optimizer_params = 0;
  double compute_busy_seconds = -1;  // compute-stream busy time (needs --trace), -1 unknown
  // MoE models (CPU backend): tokens routed to each expert of each layer over
  // the last step's micro-batches ([layers x experts], layer-major; empty for
  // dense models), and the mean load-balancing loss (model/moe_aux.h).
  std::vector<int64_t> moe_tokens_per_expert;
  double moe_aux_loss = 0;
};

class Backend {
 public:
  virtual EngineStats stats() const { return {}; }
  virtual ~Backend() = default;
  virtual std::string describe() const = 0;
  // Forward + backward over every micro-batch (gradient = d mean loss, the
  // mean over n_valid_total tokens), exact global-norm clipping, and the
  // AdamW update of every parameter. Skips the update when the loss or the
  // norm is not finite.
  virtual StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) = 0;
  // Forward only: the sum of token losses of one batch, *n_valid tokens.
  virtual double loss_sum(const Batch& b, int64_t* n_valid) = 0;
  // Makes HostState's master weights current: waits for updates in flight
  // and, in delayed-update mode, applies the pending one (see below). A
  // data-parallel GPU rank gathers the bf16 weights of every rank's slices
  // into its weights-only state (a collective: every rank calls it at the
  // same points; it is a no-op when nothing changed since the last call).
  virtual void sync() {}
  // Data-parallel GPU ranks: HostState holds bf16 weights only, so a
  // checkpoint gathers each unit's whole fp32 master and Adam m, v from every
  // rank's slices instead. A collective: after sync(), every rank calls
  // gather_unit for every unit in unit order; rank 0 passes staging (3 x
  // numel floats: master | m | v), the others nullptr.
  virtual bool gathers_checkpoints() const { return false; }
  // Whether its optimizer walks units through the state tier (state/state_tier.h,
  // --state-dir), so that their optimizer state may live in a file between
  // updates: the CPU backend and the single-GPU CUDA engine.
  virtual bool pages_state() const { return false; }
  // Whether it may page the weights too (TierOptions::page_weights): "" when
  // it computes on a copy of its own, refreshed from each unit right after
  // its update while the unit is paged in (the CPU backend's fp32 copy; the
  // CUDA engine's device-resident layers, or its own pinned shadows with an
  // fp32 master); else why not, and the fix (the tier's refusal quotes it).
  virtual std::string weight_paging_refusal() const { return "this backend keeps the weights in RAM"; }
  // The tier will page the weights: called before it moves anything (the
  // CUDA engine unpins the state's shadows, whose buffers it will free), and
  // once it has (the CUDA engine loads every unit's weights onto the device,
  // each paged in, clean). make_state_tier (trainer.h) calls both.
  virtual void weights_will_page() {}
  virtual void weights_paged() {}
  // -1: the trainer stops on its own signal flag. 0 or 1: a data-parallel
  // GPU rank's decision, the same on every rank after each step (any rank
  // signalled before that step's totals were reduced: GpuDataParallel::stop),
  // so that all ranks stop after the same step.
  virtual int stop_agreement() const { return -1; }
  virtual void gather_unit(size_t u, float* staging) {
    (void)u;
    (void)staging;
  }
  // Test hook: forward + backward only, the fp32 gradients written into
  // HostState's gradient arenas (which must exist); no update. Returns the loss sum.
  virtual double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) = 0;
};

// Delayed-update mode (both backends): the update computed at step t is
// applied during step t+1, so step t+1's gradients are computed on the
// weights from before step t's update (one step stale), and the CPU
// optimizer overlaps the whole next step instead of only its forward.
// Step 1 and 2 both train on the initial weights. sync() applies the
// pending update, and the delay starts over: the trainer syncs before a
// checkpoint, the final evaluation and the export, so a run resumed from a
// checkpoint continues exactly like one that never stopped. A validation
// loss between those points is that of the weights the next step trains on.
// keep_activations: the last K layers keep their activations from forward to
// backward instead of being recomputed from their input (results are
// bit-identical either way); -1 (auto): every layer whose activations fit in
// a quarter of the host RAM available when the first batch arrives.
// Layer-major micro-batches (layer_major, both backends): with K > 1
// micro-batches per step, every micro-batch goes through layer i while its
// weights are on the device, so weights cross PCIe once per step, not once
// per micro-batch: forward: embed all K, then for each layer i run block i on
// every micro-batch's input (the K x (L+1) block inputs wait for the backward,
// on the device or in pinned host RAM, per the plan); the head per
// micro-batch; backward: for each layer i from L-1 down, recompute and
// back-propagate every micro-batch k = 0..K-1 in order with its own residual
// gradient, accumulating into layer i's gradient, which then leaves once
// (host gradients). Every element of every gradient receives the micro-
// batches' contributions in the same order as the micro-batch-major schedule,
// so results are bit-identical -- except with tied embeddings, where the
// shared table's gradient gets all K LM-head terms before the K embedding
// terms (micro-batch-major interleaves them): equal up to fp32 rounding, which
// is why auto leaves tied models micro-batch-major. No layer keeps all its
// activations; the last keep_attention layers keep the attention half of
// each micro-batch (selective recompute, K halves a layer), the rest are
// recomputed whole in the backward.
// The CPU backend's layer_major (auto = off: it streams nothing) is the twin.
// mlp_chunk_tokens (CudaOptions::mlp_chunk_tokens): R > 0 runs the MLP in
// chunks of R tokens; 0 and -1 (auto: nothing to fit here) run it whole.
// fold: the CPU twin of --grads fold (engine/fold_clip.h): units update in
// fold_order with the partial-norm clipping rule; not with delayed_update.
// keep_attention: the layers before the kept ones that keep only their
// attention half (selective recompute, model/block.h AttnActs; bit-identical
// results); -1 (auto): as many as fit in what keep_activations left of that
// quarter of the host RAM. Layer-major: the last keep_attention layers keep
// one half per micro-batch; auto keeps none there (the twin is tested with
// counts).
// matmul: fp8 / fp8_tensor run the projections through the FP8 twin (cpu/fp8.h).
std::unique_ptr<Backend> make_cpu_backend(HostState& state, bool delayed_update = false, int64_t keep_activations = -1,
                                          bool layer_major = false, int64_t mlp_chunk_tokens = 0, bool fold = false,
                                          int64_t keep_attention = -1, MatmulMode matmul = MatmulMode::bf16);

// Data parallelism over GPUs (docs/multi_gpu.md): this process is one rank of
// a world, one GPU each. The state is weights only (HostState::keep_weights_only);
// the rank's fp32 master, m and v are the shard's slices. Per step the rank
// trains on its share of the micro-batches (rank r: the r-th of world equal
// groups; the count must divide), then each unit's device gradient is
// reduce-scattered in place (grads: one NCCL communicator), the norm is
// formed from every rank's slice sums (exact all-reduce of one nonzero per
// slot, summed in one order on every rank), each rank updates its slices on
// its CPU, and every load of a unit's weights copies the rank's own slice
// in and all-gathers the others' on the device (weights: a second
// communicator, so the two orders of operations are independent).
// Gradients stay on the device until reduced (--grads device); no delayed
// update, Muon or quantized moments (refused by name).
struct GpuDataParallel {
  Collective* grads = nullptr;
  Collective* weights = nullptr;
  ShardedOptimizer* shard = nullptr;
  // The trainer's SIGINT/SIGTERM flag, read when each step's totals are
  // reduced: set on any rank, every rank's stop_agreement() becomes 1.
  std::atomic<bool>* stop = nullptr;
  bool on() const { return shard != nullptr; }
};

struct CudaOptions {
  GpuDataParallel dp;           // on(): this process is a data-parallel rank
  uint64_t max_gpu_memory = 0;  // bytes; 0: what the device has free
  int slots = 3;                // device weight slots (>= 2)
  bool resident = false;        // keep every layer on the device (baseline mode)
  bool delayed_update = false;  // apply step t's update during step t+1
  // Master weight storage in host RAM (state/host_state.h): fp32, or split (the
  // pinned bf16 shadow + 16-bit remainder + tie bit: bit-identical results,
  // 1.875 B/param less host RAM, ~6% fewer bytes moved per update); auto: split.
  std::string master = "auto";
  std::string checkpoints = "auto";  // auto | device | host: where block inputs wait for the backward
  std::string grads = "auto";        // auto | device | host | fold: device keeps every gradient until the norm
                                     // is known; host sends each layer's out as it is made (O(1) device
                                     // memory) into host gradient arenas (4 B/param); fold sends them out the
                                     // same way but each unit's update runs as its gradient lands, no host
                                     // gradient arena (engine/fold_clip.h: the clipping rule); auto picks fold
                                     // where host would be picked when clipping is off (then fold is exact)
                                     // and one micro-batch or layer-major makes each gradient whole at once
  bool clipping = true;              // the trainer clips the gradient norm (OptimStep::clip > 0)
  // The state's update rule is Muon (--optimizer muon | muon8bit): NS5 runs on
  // the GPU (engine/cuda/muon_gpu.h, its workspace in the plan) and each
  // unit's whole gradient must reach the optimizer at once, so grads auto picks
  // host (or fold) and device is refused. make_cuda_backend sets it from the state.
  bool muon = false;
  bool prefer_host_grads = false;    // fit's first step: grads left at auto go to the host (or fold)
  std::string trace_path;            // Chrome trace JSON, "" for none
  // Layer-major micro-batches (see make_cpu_backend above): auto | on | off.
  // auto: on when micro_batches > 1, the weights stream (fewer slots than
  // layers) and the embedding is untied. micro_batches: K, the micro-batches
  // per step the buffers are planned for (the trainer's --grad-accum); a step
  // with another count runs micro-batch-major.
  std::string layer_major = "auto";
  int64_t micro_batches = 1;
  // Layers (the last K) whose activations stay on the device from forward to
  // backward, skipping their recompute (bit-identical results); -1 (auto):
  // as many as fit in the device memory left once the rest of the plan is in.
  int64_t keep_activations = -1;
  // Layers before those that keep only their attention half (q/k/v, the
  // attention output and h: selective recompute, model/block.h AttnActs),
  // so their backward recomputes the norms and the MLP's gate/up alone
  // (bit-identical); -1 (auto): model/block_memory.h plan_kept_layers.
  int64_t keep_attention = -1;
  int64_t ce_chunk_rows = 1024;
  // MLP token chunks (model/block.h, docs/long_sequences.md): 0 off, R > 0
  // chunks of R tokens, -1 (auto): the plan picks (model/block_memory.h's
  // pick_mlp_chunk_tokens: 0 when the unchunked block fits, else the largest
  // power of two that does). Under fit_device_plan, auto stays off until the
  // fit chain's last step (mlp_chunk_held below), so every plan that fits
  // unchunked keeps its exact path and bits. Chunked results differ from
  // unchunked ones by fp32 summation order only.
  int64_t mlp_chunk_tokens = -1;
  // fit_device_plan's state: auto chunking held off (planned as 0) until
  // shrink_plan's last step releases it. Callers leave it false.
  bool mlp_chunk_held = false;
  // Device-gradient modes: the optimizer copies gradients out in chunks of
  // this many bytes through a small pinned ring and updates each chunk as it
  // lands (0: one chunk per unit, through unit-sized buffers).
  uint64_t landing_chunk_bytes = 16ull << 20;
  // Host-gradient modes (--grads host | fold): the size of the three pinned
  // slabs the layers' gradients land in (engine/device_plan.h
  // gradient_landing_slab_elems); 0 (always, outside tests): the largest
  // layer's gradient. A larger unit (the LM head, a tied embedding) lands in
  // slab-sized pieces, each added or updated as it lands. Tests set it small
  // so that every unit lands in several pieces; no command-line flag sets it.
  uint64_t landing_slab_bytes = 0;
  bool verbose = true;
  // When the plan does not fit the device budget, make_cuda_backend shrinks it
  // step by step and says so: gradients and checkpoints left at auto go to the
  // host, then 2 slots, then 256-row LM-head chunks (the --low-memory plan),
  // then layer-major left at auto goes off, then the MLP runs in token chunks
  // (mlp_chunk_tokens left at auto).
  // false: fail with the allocator's message instead. fit_slots = false keeps
  // the slot count (the CLI clears it when --slots is given).
  bool fit = true;
  bool fit_slots = true;
  // --matmul fp8: the projections' GEMMs in FP8 (cuda/fp8.h; fp8: block
  // scales, sm_90 only; fp8_tensor: per-tensor scales, sm_89 and newer;
  // make_cuda_backend refuses other cards). Its quantization workspace is
  // allocated by the ops outside the device plan (cuda/fp8.h, Fp8Linear):
  // make_cuda_backend holds fp8_reserve bytes of the budget back for it.
  MatmulMode matmul = MatmulMode::bf16;
  uint64_t fp8_reserve = 0;  // set by make_cuda_backend; callers leave it 0
};

// The low-memory setting (`--low-memory`): gradients and block checkpoints in
// host RAM (device memory flat in the layer count; an untied embedding then
// stays on the host too), two weight slots, LM-head chunks of 256 rows, and
// every layer recomputed in the backward (no kept activations).
inline void set_low_memory(CudaOptions& o) {
  o.grads = "host";
  o.checkpoints = "host";
  o.slots = 2;
  o.ce_chunk_rows = 256;
  o.keep_activations = 0;
  o.keep_attention = 0;
}

bool cuda_backend_available();  // built with CUDA and a device present
// Whether GPU 0 runs --matmul fp8 with this scaling (cuda/fp8.h: block on
// Hopper; tensor on Ada and Hopper); why not in *why.
bool cuda_fp8_supported(MatmulMode mode, std::string* why);
int cuda_device_count();        // 0 without CUDA
std::unique_ptr<Backend> make_cuda_backend(HostState& state, int64_t micro_batch, int64_t seq_len,
                                           const CudaOptions& opt);

}  // namespace rt
