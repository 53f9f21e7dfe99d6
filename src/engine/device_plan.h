// The CUDA engine's device plan, as pure functions of (ModelSpec, shapes,
// options, budget): no CUDA, so the CPU tests and a `ramtrain plan` command
// can call them. The engine (engine/cuda/stream_engine.cpp) makes its choices here.
//
// Placement: where gradients, block checkpoints and the embedding live, and
// how many weight slots there are. Fit (CudaOptions::fit): when the plan does
// not fit the budget, shrink_plan gives the next smaller one, one change at a
// time: gradients and checkpoints left at auto go to the host, then 2 slots,
// then 256-row LM-head chunks (the --low-memory plan), then layer-major left
// at auto goes off, then the MLP runs in token chunks (mlp_chunk_tokens left
// at auto; docs/long_sequences.md).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "model/block_memory.h"
#include "model/spec.h"

namespace rt {

struct DevicePlacement {
  int slots = 2;            // device weight slots (layer i lives in slot i % slots)
  bool host_grads = false;  // layer gradients leave per layer into host RAM
  bool fold = false;        // ... and each unit updates as it lands (--grads fold): no host gradient arenas
  bool host_ckpt = false;   // block inputs wait for the backward in pinned host RAM
  bool host_embed = false;  // host gradients + untied embedding: the table stays on the host
  // Layer-major micro-batches (backend.h): K = micro_batches sets of block
  // inputs (on the device, or pinned host RAM visiting the device through a
  // ring of kCheckpointRing buffers) and K residual gradients (on the device).
  bool layer_major = false;
  int64_t micro_batches = 1;
  // Sets of block inputs and residual gradients the engine holds (K or 1).
  int64_t sets() const { return layer_major ? micro_batches : 1; }
};

// Device buffers through which layer-major host checkpoints visit the device:
// input in use + next input prefetched + output being written + 2 outputs on
// their way out (so the compute stream never waits for a copy out).
constexpr int kCheckpointRing = 5;

// Pinned host bytes of the block checkpoints (0 when they stay on the
// device); the engine checks them against the free host RAM before pinning.
uint64_t host_checkpoint_bytes(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const DevicePlacement& p);

// The pinned host buffers the backward's weight gradients land in
// (engine/cuda/gradient_sink.h).
// Host gradients (host or fold): three slabs of gradient_landing_slab_elems
// floats, each layer's gradient copied out whole while the worker adds or
// folds the one before. A unit larger than a slab (the LM head, a tied
// embedding: 3.1 GB of fp32 at Qwen2.5-14B against ~1.1 GB per layer) lands
// in slab-sized pieces in order (grad_chunks(numel, {u}, slab),
// engine/update_order.h), each added (host) or updated (fold) as it lands;
// fold clips such a unit with its sum of squares taken on the device first,
// in rt::sum_squares's exact order (cuda/sum_squares_order.h), which lands
// beside the first piece in a pinned double per slab.
// Device gradients: a ring of four chunks of landing_chunk_bytes (rounded
// down to kGradChunkAlign elements, at most the largest unit) that the
// optimizer phase copies through.
constexpr int kGradLandingSlabs = 3;
constexpr int kGradLandingRing = 4;
constexpr int64_t kGradChunkAlign = 4096;  // elements: chunks cut units at quantization-block bounds
// elements: slabs (and so pieces) are multiples of the sum's blocks (16384 =
// kOptimBlock, a multiple of kGradChunkAlign and of the 256-element blocks of
// quantized moments), so a piece never cuts a quantization block
constexpr int64_t kGradSlabAlign = 16384;
int64_t gradient_landing_chunk_elems(const ModelSpec& s, uint64_t landing_chunk_bytes);
// The slab: o.landing_slab_bytes (tests) or the largest layer's gradient,
// rounded up to kGradSlabAlign elements, at most the largest unit. Muon
// (o.muon) updates whole units (optim/unit_update.h): the largest unit.
int64_t gradient_landing_slab_elems(const ModelSpec& s, const CudaOptions& o);
// The units that land through the slabs (host gradients: every layer, the
// head, and the embedding unless it stays on the host) and are larger than
// a slab, in unit order.
std::vector<size_t> gradient_landing_split_units(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o);
// Fold with split units: the device doubles of their sums of squares (the
// largest one's blocks + 2, cuda/sum_squares_order.h); else 0.
uint64_t gradient_landing_sum_doubles(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o);
// Pinned bytes: host gradients, the slabs (+ a double per slab when
// gradient_landing_sum_doubles > 0); device gradients, the ring.
uint64_t gradient_landing_bytes(const ModelSpec& s, const DevicePlacement& p, const CudaOptions& o);

// Elements of each unit's arena (HostState's layout: unit 0 the embedding,
// 1..L the layers, L+1 the head; every tensor padded to 16 floats).
std::vector<int64_t> unit_numels(const ModelSpec& s);

// Elements of each unit's device weight and gradient buffers: unit_numels,
// except that the unit whose last tensor the LM head reads (the head, or the
// embedding when tied) holds cuda::lm_head_rows(vocab) rows of it
// (cuda/lm_head_rows.h): a vocabulary that is not a multiple of 8 gets zero
// rows on the device only.
std::vector<int64_t> device_unit_numels(const ModelSpec& s);

// Muon (CudaOptions::muon): the largest element count and the largest
// smaller side among the model's Muon matrices (state/host_state.h's
// muon_matrix), which size the GPU Newton-Schulz workspace; and its bytes.
struct MuonMatrixDims {
  int64_t max_numel = 0, max_small = 0;
};
MuonMatrixDims muon_matrix_dims(const ModelSpec& s);
uint64_t muon_workspace_bytes(const ModelSpec& s);
// Pinned host bytes of the GPU orthogonaliser (engine/cuda/muon_gpu.h): per
// lane, U (fp32) and O (bf16) of the largest matrix and the norm's copy.
uint64_t muon_pinned_bytes(const ModelSpec& s);
// One optimizer step's Newton-Schulz on the GPU: 5 x (4 m^2 n + 2 m^3) FLOP
// per Muon matrix (m its smaller side, n the larger), and the bytes it moves
// over PCIe (U in as fp32, O out as bf16: 6 per element).
struct MuonStepWork {
  double flops = 0, bytes = 0;
};
MuonStepWork muon_step_work(const ModelSpec& s);

// Resolves the auto settings of o against the budget (bytes of device memory
// the engine may use); fails with the flag to change on a bad combination.
DevicePlacement place_on_device(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o,
                                uint64_t budget);

// --keep-activations auto: how many layers' activations (act_bytes each) fit
// in what is left of the budget once `used` bytes (the rest of the plan and
// the shared activation set) are in, 1/64 of the budget held back.
int64_t auto_kept_layers(uint64_t used, uint64_t act_bytes, uint64_t budget);

// The layers that keep all their activations and those that keep their
// attention half (selective recompute), as the engine sizes them once `used`
// bytes are allocated and before the shared activation set: o's
// --keep-activations / --keep-attention, auto filling what is left of the
// budget after the shared set and 1/64 of the budget held back
// (model/block_memory.h plan_kept_layers). Layer-major (sets = its K
// micro-batches > 1): no whole layers; attention halves only, K of them per
// layer (one per micro-batch), for --keep-attention layers or, on auto, as
// many layers as fit.
KeptLayers engine_kept_layers(const ModelSpec& s, const BlockDims& dm, const CudaOptions& o, uint64_t used,
                              uint64_t budget, int64_t sets = 1);

// The next smaller plan: changes o one step and says what changed in *change;
// false when o is already the smallest plan.
bool shrink_plan(CudaOptions& o, std::string* change);

// ---- the whole plan, byte by byte ----
// Every device allocation of the engine, in the engine's order, each rounded
// up to 256 bytes like the allocator (cuda/device_memory.h). Not counted:
// the CUDA context and cuBLASLt's workspace (outside the budget), nor the
// default workspace cuBLAS keeps for the Muon Newton-Schulz handle.
struct DevicePlanItem {
  std::string what;
  uint64_t bytes = 0;  // all `count` allocations together
  int64_t count = 1;
};
// The op scratch (the largest temporary any op of a step needs) depends on
// the CUDA kernels; the engine knows it exactly. Default: the LM head's
// chunk buffers, its largest term, as an estimate; for MoE models at least
// the MoE MLP's scratch (every expert's rows of a micro-batch, exact:
// cuda/moe_scratch.h).
using OpScratchBytes =
    std::function<uint64_t(const ModelSpec&, int64_t micro_batch, int64_t seq_len, const CudaOptions&)>;
uint64_t lm_head_scratch_estimate(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o);

struct DevicePlan {
  CudaOptions options;  // as planned (after fit_device_plan: shrunk)
  DevicePlacement place;
  int64_t mlp_chunk_tokens = 0;  // the MLP token chunk the blocks run with (0: unchunked)
  int64_t kept_layers = 0;       // layers whose activations stay forward to backward
  int64_t attn_kept_layers = 0;  // layers before those keeping their attention half (selective recompute)
  uint64_t layer_act_bytes = 0;  // what keeping one more layer costs
  uint64_t layer_attn_bytes = 0;  // what keeping one more layer's attention half costs
  std::vector<DevicePlanItem> items;
  uint64_t total = 0;  // sum of items
  uint64_t budget = 0;
  bool fits() const { return total <= budget; }
  std::vector<std::string> changes;  // fit_device_plan: the shrink steps taken, in order
};

// The MLP token chunk of a plan: o.mlp_chunk_tokens, or on auto (and not
// held) pick_mlp_chunk_tokens on the `available` bytes left for the shared
// block activations and the backward scratch; kMinMlpChunkTokens when no
// candidate fits (the plan then reports what is missing). 0: unchunked.
int64_t plan_mlp_chunk_tokens(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o,
                              uint64_t available);

DevicePlan plan_device(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o, uint64_t budget,
                       const OpScratchBytes& op_scratch = lm_head_scratch_estimate);
// The plan make_cuda_backend ends with: shrinks o while it does not fit and
// o.fit allows (the order above); the result may still not fit (fits()).
DevicePlan fit_device_plan(const ModelSpec& s, int64_t micro_batch, int64_t seq_len, const CudaOptions& o,
                           uint64_t budget, const OpScratchBytes& op_scratch = lm_head_scratch_estimate);

}  // namespace rt
