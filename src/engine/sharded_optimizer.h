// ShardedOptimizer: one rank's part of a data-parallel optimizer step with the
// optimizer state sharded over the ranks (ZeRO-1/2 style). Rank r owns, of
// every unit (state/host_state.h) of numel elements, the elements
// [r*S, min((r+1)*S, numel)) with S = shard_stride(numel, world): a
// contiguous slice, 1/world of the unit rounded up to kShardAlign elements
// (a rank's slice may be short or empty). kShardAlign is sum_squares's block
// (optim/adamw.h's kOptimBlock, 16384 = 4 x 4096): slices stay 4096-aligned
// for quantized and chunked updates (optim/unit_update.h,
// engine/update_order.h), and each rank's block partials are exactly those of
// one process's sum_squares, so the global norm is bit-identical to it.
// It keeps the fp32 master, m and v of its slices only (12 B per owned
// element) as StateUnits of the slice's size, so the existing
// update_unit_range updates them with each tensor's weight decay.
// step(): per unit, the rank's full gradient is reduce-scattered (sum over
// ranks, padded to world*S); the global norm is one process's (the block
// partials of sum_squares, each from the rank owning the block, all-reduced
// exactly and combined in one process's order: the same double on every
// rank, for LoopbackWorld and NCCL alike); clipping and the loss's finiteness are decided
// from those shared numbers, so every rank applies or skips together; each
// rank updates its slices and the updated fp32 masters are all-gathered into
// every rank's full weights for the next forward.
// Buffers are host memory: step() runs over LoopbackWorld (the CPU twin). A
// GPU rank (engine/cuda/, CudaOptions::dp) keeps only the shards here: its
// engine reduce-scatters the device gradients through NcclCollective, forms
// the norm the same way, and updates these slices with the same
// update_unit_range (docs/multi_gpu.md).
// Host bytes per rank: 12/world B/param of state + 4/world of reduced
// gradient slices + the full weights the forward reads (fp32 on the CPU, 4
// B/param; the bf16 shadow on a GPU, 2 B/param).
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "data/dataset.h"
#include "dist/collective.h"
#include "optim/adamw.h"
#include "optim/unit_update.h"
#include "state/host_state.h"

namespace rt {

inline constexpr int64_t kShardAlign = kOptimBlock;
static_assert(kShardAlign % 4096 == 0, "slices must stay 4096-aligned");

// Elements per rank's slice of a unit of numel elements (a multiple of kShardAlign).
int64_t shard_stride(int64_t numel, int world);
struct ShardRange {
  int64_t b = 0, e = 0;
};
ShardRange shard_range(int64_t numel, int world, int rank);

// Host bytes rank `rank` of `world` holds for spec's model (the unit layout of
// HostState, tensors padded to 16 floats): its slices' master, m and v (12
// B/element), its reduced gradient slices (4 B per slice element, padding
// included), and the full weights its forward reads, weight_bytes per element
// (4: the CPU twin's fp32; 2: a GPU rank's bf16 shadow). The CPU twin's
// replicas also hold a full gradient arena and unused m/v (see
// engine/data_parallel_cpu.h); a GPU rank does not.
// grad_slices false: a GPU rank, whose reduced slices land through the
// engine's small pinned ring instead (CudaOptions::dp).
uint64_t dp_rank_host_bytes(const ModelSpec& spec, int world, int rank, int weight_bytes, bool grad_slices = true);

struct ShardedStepResult {
  double loss_sum = 0;  // over every rank's micro-batches (rank order)
  double grad_norm = 0;
  bool applied = false;
};

// Rank `rank`'s share of a step's micro-batches: the rank-th of `world` equal
// contiguous groups (the count must be a multiple of world: refused by name).
// The CPU twin (engine/data_parallel_cpu.h) and a GPU rank split alike.
std::vector<Batch> rank_micro_batches(const std::vector<Batch>& batches, int world, int rank);

// A GPU rank's step totals (engine/cuda/, CudaOptions::dp), formed the same
// way on every rank: each rank's per-unit sums of squares of its slices, its
// loss, token count and stop request go into slots of their own (one nonzero
// per slot, so the all-reduce is exact in any order, NCCL's too), then every
// rank combines them in one order (units in order, each the sum of its slices
// in rank order; losses and counts in rank order): the same doubles on every
// rank, so all clip, skip and stop alike.
struct DpTotals {
  double sq = 0;  // the squared global norm
  double loss_sum = 0;
  int64_t n_valid = 0;
  bool stop = false;  // some rank asked to stop after this step
};
DpTotals dp_all_reduce_totals(Collective& c, const std::vector<double>& unit_sq, double loss_sum, int64_t n_valid,
                              bool stop);

class ShardedOptimizer {
 public:
  // Rank `rank` of `world`: its slices of init's master, m and v (fp32 or split storage).
  ShardedOptimizer(const HostState& init, int world, int rank);
  // The same, and init keeps weights only, unit by unit as its slice is taken
  // (HostState::keep_weights_only: the peak is the state plus one unit): a GPU
  // rank's state, whose bf16 weights the engine streams and all-gathers.
  // fresh: a run that starts here (not a resume), whose moments are zero: the
  // slices start with zero m, v and init's moments are not read (so init may
  // hold the smallest moment storage: a rank's start-up state, cli/train.cpp).
  struct WeightsOnly {
    bool fresh = false;
  };
  ShardedOptimizer(HostState& init, int world, int rank, WeightsOnly w);
  int rank() const { return rank_; }
  int world() const { return world_; }
  // One step. replica: this rank's full model (fp32 master storage): its
  // gradient arenas hold the rank's gradients (already scaled by 1/n_valid of
  // the global batch) and its masters receive the updated weights. loss_sum:
  // the rank's own. compute: held around CPU work that uses the global thread
  // pool (not reentrant), never around a collective.
  ShardedStepResult step(Collective& c, HostState& replica, double loss_sum, const OptimStep& o, std::mutex& compute);
  // Master, m and v of every slice this rank owns.
  uint64_t state_bytes() const;
  // Writes this rank's slices of master, m and v into s (same model).
  void write_into(HostState& s) const;
  // A GPU rank's update of unit k's elements [b, e) (unit coordinates, inside
  // the rank's slice): g[0] is element b's reduced gradient; the new weights'
  // bf16 go to unit_shadow[b..e) (the whole unit's shadow; nullable).
  void update_piece(size_t k, int64_t b, int64_t e, const float* g, const OptimStep& o, float coef,
                    uint16_t* unit_shadow);
  const std::vector<StateUnit>& shards() const { return shards_; }
  std::vector<StateUnit>& shards() { return shards_; }
  // Unit k's slice [b, e) in the full unit, and S (the slice stride).
  ShardRange range(size_t k) const { return ranges_[k]; }
  int64_t stride(size_t k) const { return stride_[k]; }
  // The reduced gradient slices of the last step (unit order; slice length each).
  const std::vector<std::vector<float>>& reduced_grads() const { return reduced_; }

 private:
  ShardedOptimizer(const HostState& init, int world, int rank, HostState* consume, bool fresh);
  int world_, rank_;
  std::vector<StateUnit> shards_;   // per unit: the slice as a unit of its own
  std::vector<ShardRange> ranges_;  // per unit: the slice's elements in the full unit
  std::vector<int64_t> stride_;     // per unit: S
  std::vector<std::vector<float>> reduced_;
  std::vector<float> stage_;  // world * max S floats
  std::vector<float> send_;   // max S floats: the all-gather's input
};

}  // namespace rt
