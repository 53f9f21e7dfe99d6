// DataParallelCpu: the CPU twin of multi-GPU data parallelism. N ranks run as
// N threads of a LoopbackWorld (dist/loopback.h); each has a full model
// replica (a HostState whose fp32 master the forward reads and whose gradient
// arenas the backward fills, through the CPU backend) and a ShardedOptimizer
// (engine/sharded_optimizer.h) holding master, m and v of its 1/N slices only.
// train_step splits the step's K micro-batches in rank order (rank r takes
// micro-batches [r*K/N, (r+1)*K/N); K must be a multiple of N); each rank's
// gradient is d(global mean loss), scaled by 1/n_valid_total of the whole
// step, so the reduced sum is the single-process gradient up to fp32
// summation order (docs/multi_gpu.md: which bound the tests hold).
// The canonical HostState passed in is the trainer's view: sync() writes every
// rank's slices (master, m, v) into it, so checkpoints, evaluation and export
// read it as for one process. The replicas' own m/v arenas are allocated but
// unused (the twin reuses HostState for the forward's views); a GPU rank
// holds only the bf16 shadow besides its slices.
// Mixture-of-experts models are refused (their load-balancing loss is a mean
// over one process's micro-batches; the split would change it).
// Forward/backward of the ranks is serialized (the global thread pool is not
// reentrant); the collectives run concurrently. Results do not depend on
// thread timing.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "dist/loopback.h"
#include "engine/backend.h"
#include "engine/sharded_optimizer.h"

namespace rt {

class DataParallelCpu final : public Backend {
 public:
  // state: fp32 or split masters; its moments seed the shards (resume).
  // keep_activations: per replica (backend.h); auto (-1) keeps none.
  DataParallelCpu(HostState& state, int world, int64_t keep_activations = 0);
  std::string describe() const override;
  StepStats train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) override;
  double loss_sum(const Batch& b, int64_t* n_valid) override;  // rank 0's replica
  void sync() override;
  // Every rank's gradients summed in rank order into state's gradient arenas; no update.
  double compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) override;

  int world() const { return world_; }
  const ShardedOptimizer& shard(int r) const { return *shards_[static_cast<size_t>(r)]; }
  const HostState& replica(int r) const { return *replicas_[static_cast<size_t>(r)]; }

 private:
  HostState& state_;
  int world_;
  LoopbackWorld loop_;
  std::mutex compute_;
  std::vector<std::unique_ptr<HostState>> replicas_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<ShardedOptimizer>> shards_;
};

}  // namespace rt
