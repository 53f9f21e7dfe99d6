#include "engine/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/weight_map.h"
#include "optim/adamw.h"

namespace rt {

int64_t shard_stride(int64_t numel, int world) {
  RT_CHECK(world >= 1 && numel >= 0, "[dp] bad shard request: ", numel, " elements over ", world, " ranks");
  const int64_t per = (numel + world - 1) / world;
  return std::max<int64_t>(1, (per + kShardAlign - 1) / kShardAlign) * kShardAlign;
}

ShardRange shard_range(int64_t numel, int world, int rank) {
  RT_CHECK(rank >= 0 && rank < world, "[dp] rank ", rank, " outside a world of ", world);
  const int64_t s = shard_stride(numel, world);
  const int64_t b = std::min(numel, rank * s), e = std::min(numel, (rank + 1) * s);
  return {b, e};
}

uint64_t dp_rank_host_bytes(const ModelSpec& spec, int world, int rank, int weight_bytes, bool grad_slices) {
  std::vector<int64_t> numel(static_cast<size_t>(spec.n_layers + 2), 0);  // HostState's units
  for (const WeightEntry& e : weight_map(spec)) {
    const size_t u = e.kind == WeightKind::embed ? 0
                     : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                                 : static_cast<size_t>(spec.n_layers + 1);
    numel[u] += (e.numel() + 15) / 16 * 16;
  }
  uint64_t b = 0;
  for (int64_t n : numel) {
    const ShardRange r = shard_range(n, world, rank);
    b += static_cast<uint64_t>(r.e - r.b) * 12 + (grad_slices ? static_cast<uint64_t>(shard_stride(n, world)) * 4 : 0) +
         static_cast<uint64_t>(n) * static_cast<uint64_t>(weight_bytes);
  }
  return b;
}

ShardedOptimizer::ShardedOptimizer(const HostState& init, int world, int rank)
    : ShardedOptimizer(init, world, rank, nullptr, false) {}

ShardedOptimizer::ShardedOptimizer(HostState& init, int world, int rank, WeightsOnly w)
    : ShardedOptimizer(init, world, rank, &init, w.fresh) {}

ShardedOptimizer::ShardedOptimizer(const HostState& init, int world, int rank, HostState* consume, bool fresh)
    : world_(world), rank_(rank) {
  const bool weights_only = consume != nullptr;
  RT_CHECK(world >= 1 && rank >= 0 && rank < world, "[dp] rank ", rank, " outside a world of ", world);
  int64_t max_s = 0;
  for (size_t ui = 0; ui < init.units().size(); ++ui) {
    const StateUnit& u = init.units()[ui];
    const ShardRange r = shard_range(u.numel, world, rank);
    const int64_t n = r.e - r.b;
    ranges_.push_back(r);
    stride_.push_back(shard_stride(u.numel, world));
    max_s = std::max(max_s, stride_.back());
    StateUnit s;
    s.name = cat(u.name, "[", r.b, ":", r.e, ")");
    s.numel = n;
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t lo = u.offsets[k], hi = lo + u.entries[k].numel();
      if (hi <= r.b || lo >= r.e) continue;
      s.entries.push_back(u.entries[k]);
      s.offsets.push_back(lo - r.b);  // may be negative: the tensor starts before the slice
    }
    if (n > 0) {
      s.arena = HostBuffer(static_cast<size_t>(3 * n),
                           cat("rank ", rank, "'s slice of the ", u.name, " master weights and Adam moments"));
      // on the pool (a 7B rank copies ~90 GB at start-up): a copy, or read_master's own parallel decode (one
      // call: the pool is not reentrant)
      if (u.shadow_master())
        u.read_master(r.b, n, s.master());
      else
        copy_parallel(s.master(), u.master() + r.b, static_cast<size_t>(n) * sizeof(float));
      if (fresh) {  // zero moments, whatever init's storage holds
        float* mv = s.m();
        parallel_for(2 * n, 1 << 18,
                     [&](int64_t b, int64_t e) { std::memset(mv + b, 0, static_cast<size_t>(e - b) * sizeof(float)); });
      } else {
        copy_parallel(s.m(), u.m() + r.b, static_cast<size_t>(n) * sizeof(float));
        copy_parallel(s.v(), u.v() + r.b, static_cast<size_t>(n) * sizeof(float));
      }
    }
    if (!weights_only) reduced_.emplace_back(static_cast<size_t>(stride_.back()));
    shards_.push_back(std::move(s));
    if (consume) consume->keep_weights_only(ui);  // its slice is taken: 2 B/param remain
  }
  if (weights_only) return;  // a GPU rank: its engine stages and reduces on the device
  stage_.resize(static_cast<size_t>(world * max_s));
  send_.resize(static_cast<size_t>(max_s));
}

uint64_t ShardedOptimizer::state_bytes() const {
  uint64_t b = 0;
  for (const StateUnit& s : shards_) b += static_cast<uint64_t>(s.numel) * 3 * sizeof(float);
  return b;
}

void ShardedOptimizer::write_into(HostState& st) const {
  auto& units = st.units();
  RT_CHECK(units.size() == shards_.size(), "[dp] the state has ", units.size(), " units, the shards ", shards_.size());
  for (size_t k = 0; k < units.size(); ++k) {
    const StateUnit& s = shards_[k];
    if (s.numel == 0) continue;
    const int64_t b = ranges_[k].b;
    units[k].write_master(b, s.numel, s.master());
    std::memcpy(units[k].m() + b, s.m(), static_cast<size_t>(s.numel) * sizeof(float));
    std::memcpy(units[k].v() + b, s.v(), static_cast<size_t>(s.numel) * sizeof(float));
  }
}

void ShardedOptimizer::update_piece(size_t k, int64_t b, int64_t e, const float* g, const OptimStep& o, float coef,
                                    uint16_t* unit_shadow) {
  const ShardRange r = ranges_[k];
  RT_CHECK(r.b <= b && b <= e && e <= r.e, "[dp] elements [", b, ", ", e, ") of unit ", k, " are outside rank ", rank_,
           "'s slice [", r.b, ", ", r.e, ")");
  if (e > b) update_unit_range(shards_[k], b - r.b, e - r.b, g, o, coef, unit_shadow ? unit_shadow + r.b : nullptr);
}

std::vector<Batch> rank_micro_batches(const std::vector<Batch>& batches, int world, int rank) {
  const size_t K = batches.size(), N = static_cast<size_t>(world), r = static_cast<size_t>(rank);
  RT_CHECK(K > 0 && K % N == 0, "[dp] ", K, " micro-batches per step cannot be split over ", world,
           " ranks: use a --grad-accum that is a multiple of the rank count");
  const size_t per = K / N;
  return {batches.begin() + static_cast<std::ptrdiff_t>(r * per),
          batches.begin() + static_cast<std::ptrdiff_t>((r + 1) * per)};
}

DpTotals dp_all_reduce_totals(Collective& c, const std::vector<double>& unit_sq, double loss_sum, int64_t n_valid,
                              bool stop) {
  const size_t U = unit_sq.size(), N = static_cast<size_t>(c.world()), r = static_cast<size_t>(c.rank());
  std::vector<double> v((U + 2) * N + 1, 0.0);
  for (size_t u = 0; u < U; ++u) v[u * N + r] = unit_sq[u];
  v[U * N + r] = loss_sum;
  v[(U + 1) * N + r] = static_cast<double>(n_valid);
  v[(U + 2) * N] = stop ? 1.0 : 0.0;  // the one shared slot: a count of the ranks asking
  c.all_reduce_sum(v.data(), static_cast<int64_t>(v.size()));
  DpTotals t;
  for (size_t u = 0; u < U; ++u) {
    double unit = 0;
    for (size_t k = 0; k < N; ++k) unit += v[u * N + k];
    t.sq += unit;
  }
  double nv = 0;
  for (size_t k = 0; k < N; ++k) {
    t.loss_sum += v[U * N + k];
    nv += v[(U + 1) * N + k];
  }
  t.n_valid = static_cast<int64_t>(nv);
  t.stop = v[(U + 2) * N] > 0;
  return t;
}

ShardedStepResult ShardedOptimizer::step(Collective& c, HostState& replica, double loss_sum, const OptimStep& o,
                                         std::mutex& compute) {
  RT_CHECK(c.world() == world_ && c.rank() == rank_, "[dp] shard of rank ", rank_, "/", world_,
           " stepped by collective rank ", c.rank(), "/", c.world());
  RT_CHECK(stage_.size() > 0, "[dp] a GPU rank's shards are stepped by its engine, not by ShardedOptimizer::step");
  auto& units = replica.units();
  RT_CHECK(units.size() == shards_.size() && replica.master_storage() == MasterStorage::fp32 && replica.has_grads(),
           "[dp] the replica must be the same model with fp32 masters and gradient arenas");
  const size_t U = units.size();
  // 1. reduce-scatter every unit's gradient (padded to world * S)
  for (size_t k = 0; k < U; ++k) {
    const int64_t S = stride_[k], n = units[k].numel;
    std::memcpy(stage_.data(), units[k].grad.p, static_cast<size_t>(n) * sizeof(float));
    std::fill(stage_.begin() + n, stage_.begin() + world_ * S, 0.0f);
    c.reduce_scatter_sum(stage_.data(), reduced_[k].data(), S);
  }
  // 2. every rank's loss (slot r) and every kShardAlign block's sum of squares
  // (the slot of each block of each unit): each slot is nonzero on one rank
  // only, so the all-reduce sums x + 0 + ... + 0 = x exactly in any order
  // (NCCL's too); every rank then combines them in the order one process
  // does: losses in rank order, blocks in block order (sum_squares), units in
  // unit order. The norm is the single-process norm, bit for bit.
  std::vector<double> stats(static_cast<size_t>(world_), 0.0);
  stats[static_cast<size_t>(rank_)] = o.inject_nan ? NAN : loss_sum;
  std::vector<size_t> first_block(U + 1);
  for (size_t k = 0; k < U; ++k) {
    first_block[k] = stats.size();
    stats.resize(stats.size() + static_cast<size_t>((units[k].numel + kShardAlign - 1) / kShardAlign), 0.0);
  }
  first_block[U] = stats.size();
  {
    std::lock_guard<std::mutex> g(compute);
    for (size_t k = 0; k < U; ++k)
      for (int64_t b = 0; b < shards_[k].numel; b += kShardAlign)
        stats[first_block[k] + static_cast<size_t>((ranges_[k].b + b) / kShardAlign)] =
            sum_squares(reduced_[k].data() + b, std::min(kShardAlign, shards_[k].numel - b));
  }
  c.all_reduce_sum(stats.data(), static_cast<int64_t>(stats.size()));
  double loss = 0, sq = 0;
  for (int r = 0; r < world_; ++r) loss += stats[static_cast<size_t>(r)];
  for (size_t k = 0; k < U; ++k) {
    double unit = 0;
    for (size_t i = first_block[k]; i < first_block[k + 1]; ++i) unit += stats[i];
    sq += unit;
  }
  ShardedStepResult res;
  res.loss_sum = loss;
  res.grad_norm = std::sqrt(sq);
  res.applied = std::isfinite(res.loss_sum) && std::isfinite(res.grad_norm);
  if (!res.applied) return res;  // every rank decides the same: nothing changes anywhere
  // 3. update the owned slices
  const float coef = clip_coefficient(res.grad_norm, o.clip);
  {
    std::lock_guard<std::mutex> g(compute);
    for (size_t k = 0; k < U; ++k)
      if (shards_[k].numel > 0)
        update_unit_range(shards_[k], 0, shards_[k].numel, reduced_[k].data(), o, coef, nullptr);
  }
  // 4. all-gather the updated masters into every rank's full weights
  for (size_t k = 0; k < U; ++k) {
    const int64_t S = stride_[k], n = shards_[k].numel;
    if (n > 0) std::memcpy(send_.data(), shards_[k].master(), static_cast<size_t>(n) * sizeof(float));
    std::fill(send_.begin() + n, send_.begin() + S, 0.0f);
    c.all_gather(send_.data(), stage_.data(), S);
    std::memcpy(units[k].master(), stage_.data(), static_cast<size_t>(units[k].numel) * sizeof(float));
  }
  return res;
}

}  // namespace rt
