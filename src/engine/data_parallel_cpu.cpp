#include "engine/data_parallel_cpu.h"

#include <cstring>

#include "core/error.h"

namespace rt {

DataParallelCpu::DataParallelCpu(HostState& state, int world, int64_t keep_activations)
    : state_(state), world_(world), loop_(world) {
  RT_CHECK(!state.spec().is_moe(), "[dp] data parallelism does not support mixture-of-experts models (",
           state.spec().architecture,
           ") yet: their load-balancing loss is a mean over each process's micro-batches; "
           "train them in one process");
  for (int r = 0; r < world; ++r) {
    shards_.push_back(std::make_unique<ShardedOptimizer>(state, world, r));
    auto rep = std::make_unique<HostState>(state.spec(), true);
    for (size_t k = 0; k < state.units().size(); ++k) {
      const StateUnit& u = state.units()[k];
      u.read_master(0, u.numel, rep->units()[k].master());
    }
    // auto (-1) would let every replica keep a quarter of the host RAM: keep none instead
    backends_.push_back(make_cpu_backend(*rep, false, keep_activations < 0 ? 0 : keep_activations));
    replicas_.push_back(std::move(rep));
  }
}

std::string DataParallelCpu::describe() const {
  return cat("cpu data parallel (", world_, " loopback ranks, optimizer state sharded; fp32 reference per rank)");
}

StepStats DataParallelCpu::train_step(const std::vector<Batch>& batches, int64_t n_valid_total, const OptimStep& o) {
  std::vector<StepStats> st(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r)
    (void)rank_micro_batches(batches, world_, r);  // refuse a bad split before any thread starts
  loop_.run([&](Collective& c) {
    const int r = c.rank();
    const std::vector<Batch> mine = rank_micro_batches(batches, world_, r);
    int64_t nv = 0;
    for (const Batch& b : mine)
      for (int32_t t : b.targets) nv += t != ignore_target;
    double loss = 0;
    {
      std::lock_guard<std::mutex> g(compute_);
      loss = backends_[static_cast<size_t>(r)]->compute_grads(mine, n_valid_total);
    }
    const ShardedStepResult s =
        shards_[static_cast<size_t>(r)]->step(c, *replicas_[static_cast<size_t>(r)], loss, o, compute_);
    StepStats& out = st[static_cast<size_t>(r)];
    out.loss_sum = s.loss_sum;
    out.grad_norm = s.grad_norm;
    out.applied = s.applied;
    std::vector<double> n{static_cast<double>(nv)};
    c.all_reduce_sum(n.data(), 1);
    out.n_valid = static_cast<int64_t>(n[0]);
  });
  for (int r = 1; r < world_; ++r)  // the twin's own check: every rank saw the same numbers
    RT_CHECK(std::memcmp(&st[r].grad_norm, &st[0].grad_norm, sizeof(double)) == 0 && st[r].applied == st[0].applied,
             "[dp] ranks disagree on the step's norm: a bug of the sharded optimizer");
  return st[0];
}

double DataParallelCpu::loss_sum(const Batch& b, int64_t* n_valid) { return backends_[0]->loss_sum(b, n_valid); }

void DataParallelCpu::sync() {
  for (auto& s : shards_) s->write_into(state_);
}

double DataParallelCpu::compute_grads(const std::vector<Batch>& batches, int64_t n_valid_total) {
  state_.ensure_grads();
  state_.zero_grads();
  double loss = 0;
  for (int r = 0; r < world_; ++r) {
    loss += backends_[static_cast<size_t>(r)]->compute_grads(rank_micro_batches(batches, world_, r), n_valid_total);
    for (size_t k = 0; k < state_.units().size(); ++k) {
      float* g = state_.units()[k].grad.p;
      const float* x = replicas_[static_cast<size_t>(r)]->units()[k].grad.p;
      for (int64_t i = 0; i < state_.units()[k].numel; ++i) g[i] += x[i];
    }
  }
  return loss;
}

}  // namespace rt
