#include "engine/cuda/dp_rank.h"

#include <vector>

#include "core/error.h"
#include "cuda/cuda_ops.h"
#include "dist/collective.h"
#include "engine/sharded_optimizer.h"

namespace rt::cuda {

std::string dp_describe(const GpuDataParallel& dp) {
  if (!dp.on()) return "";
  return cat(", data-parallel rank ", dp.grads->rank(), " of ", dp.grads->world(),
             ": fp32 master + Adam m, v of its slices, NCCL reduce-scatter and all-gather");
}

void dp_reduce_scatter(const GpuDataParallel& dp, GradientSink& grads, EngineDevice& dev, size_t n_units, double* norms,
                       Scratch sc, Event& made, Event& reduced) {
  cudaStream_t cs = dev.compute.get();
  auto gs = static_cast<cudaStream_t>(dp.grads->device_stream());
  const int64_t rank = dp.grads->rank();
  CUDA_CHECK(cudaEventRecord(made.get(), cs));
  CUDA_CHECK(cudaStreamWaitEvent(gs, made.get(), 0));
  auto span = dev.tracer.gpu_begin(Lane::d2h, "reduce-scatter", -1, gs);
  for (size_t u = 0; u < n_units; ++u) {
    const int64_t S = dp.shard->stride(u);
    float* g = grads.dev_grad(u);
    dp.grads->reduce_scatter_sum(g, g + rank * S, S);
  }
  dev.tracer.gpu_end(span, gs);
  CUDA_CHECK(cudaEventRecord(reduced.get(), gs));
  CUDA_CHECK(cudaStreamWaitEvent(cs, reduced.get(), 0));
  CUDA_CHECK(cudaMemsetAsync(norms, 0, n_units * sizeof(double), cs));
  for (size_t u = 0; u < n_units; ++u) {
    const ShardRange r = dp.shard->range(u);
    if (r.e > r.b) sum_squares(norms + u, grads.dev_grad(u) + r.b, r.e - r.b, sc, cs);
  }
}

double dp_step_totals(const GpuDataParallel& dp, const double* nrm, size_t n_units, StepStats* stats,
                      bool* stop_agreed) {
  const std::vector<double> sq(nrm, nrm + n_units);
  const DpTotals t = dp_all_reduce_totals(*dp.grads, sq, stats->loss_sum, stats->n_valid, dp.stop && dp.stop->load());
  *stop_agreed = t.stop;
  stats->loss_sum = t.loss_sum;
  stats->n_valid = t.n_valid;
  return t.sq;
}

void dp_gather_unit(const GpuDataParallel& dp, GradientSink& grads, int64_t numel, size_t u, float* staging) {
  const StateUnit& sh = dp.shard->shards()[u];
  const ShardRange r = dp.shard->range(u);
  const int64_t S = dp.shard->stride(u), rank = dp.grads->rank();
  auto gs = static_cast<cudaStream_t>(dp.grads->device_stream());
  float* buf = grads.dev_grad(u);
  CUDA_CHECK(cudaDeviceSynchronize());
  const float* parts[3] = {sh.numel > 0 ? sh.master() : nullptr, sh.numel > 0 ? sh.m() : nullptr,
                           sh.numel > 0 ? sh.v() : nullptr};
  for (int k = 0; k < 3; ++k) {
    if (r.e > r.b)
      CUDA_CHECK(cudaMemcpy(buf + rank * S, parts[k], static_cast<size_t>(r.e - r.b) * 4, cudaMemcpyHostToDevice));
    dp.grads->all_gather(buf + rank * S, buf, S);
    CUDA_CHECK(cudaStreamSynchronize(gs));
    if (staging)
      CUDA_CHECK(cudaMemcpy(staging + k * numel, buf, static_cast<size_t>(numel) * 4, cudaMemcpyDeviceToHost));
  }
  CUDA_CHECK(cudaMemset(buf, 0, static_cast<size_t>(S * dp.grads->world()) * 4));
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace rt::cuda
