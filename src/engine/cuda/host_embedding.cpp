#include "engine/cuda/host_embedding.h"
#include "engine/cuda/host_wait.h"

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/ops.h"

namespace rt::cuda {

HostEmbedding::HostEmbedding(HostState& st, EngineDevice& dev, UpdateTracker& track, int64_t n_tokens)
    : st_(st),
      dev_(dev),
      track_(track),
      N_(n_tokens),
      C_(st.spec().hidden),
      rows_(static_cast<size_t>(N_ * C_) * 2, "embedding rows of a micro-batch"),
      dx_(static_cast<size_t>(N_ * C_) * 2, "the embedding's output gradient") {}

void HostEmbedding::gather(const int32_t* ids, const uint16_t* table) {
  const int64_t V = st_.spec().vocab;
  uint16_t* rows = rows_.as<uint16_t>();
  for (int64_t n = 0; n < N_; ++n) {
    RT_CHECK(ids[n] >= 0 && ids[n] < V, "[engine] token id ", ids[n], " at position ", n,
             " is outside the vocabulary [0, ", V, ")");
    std::memcpy(rows + n * C_, table + static_cast<int64_t>(ids[n]) * C_, static_cast<size_t>(C_) * 2);
  }
}

void HostEmbedding::copy_in(bf16* dst) {
  CUDA_CHECK(cudaMemcpyAsync(dst, rows_.as<uint16_t>(), static_cast<size_t>(N_ * C_) * 2, cudaMemcpyHostToDevice,
                             dev_.compute.get()));
  dev_.h2d_bytes += static_cast<uint64_t>(N_ * C_) * 2;
}

void HostEmbedding::land(const bf16* dx, const int32_t* ids_now, bool first) {
  const int64_t N = N_, C = C_;
  {
    HostWait hw("wait: the embedding's gradient slab");
    track_.wait([&] { return dx_free_; });
  }
  track_.update([&] { dx_free_ = false; });
  CUDA_CHECK(cudaEventRecord(grad_made_.get(), dev_.compute.get()));
  CUDA_CHECK(cudaStreamWaitEvent(dev_.d2h.get(), grad_made_.get(), 0));
  auto span = dev_.tracer.gpu_begin(Lane::d2h, "embed grads", -1, dev_.d2h.get());
  CUDA_CHECK(
      cudaMemcpyAsync(dx_.as<uint16_t>(), dx, static_cast<size_t>(N * C) * 2, cudaMemcpyDeviceToHost, dev_.d2h.get()));
  dev_.tracer.gpu_end(span, dev_.d2h.get());
  CUDA_CHECK(cudaEventRecord(dx_done_.get(), dev_.d2h.get()));
  // the next micro-batch's head writes dx again
  CUDA_CHECK(cudaStreamWaitEvent(dev_.compute.get(), dx_done_.get(), 0));
  std::vector<int32_t> ids(ids_now, ids_now + N);  // the caller's staging is refilled by the next micro-batch
  track_.push([this, ids = std::move(ids), first, N, C] {
    CUDA_CHECK(cudaEventSynchronize(dx_done_.get()));
    auto span = dev_.tracer.host_begin("land", -1);
    auto& un = st_.units()[0];
    float* dst = un.grad.p;
    if (first)
      parallel_for(un.numel, 1 << 16,
                   [&](int64_t b, int64_t e) { std::memset(dst + b, 0, static_cast<size_t>(e - b) * 4); });
    // the bf16 rows scattered as they are read (bf16 -> fp32 is exact: the bits of the fp32 scatter); dx_ is
    // free for the next micro-batch's copy only after that
    cpu::embedding_backward(dst, dx_.as<uint16_t>(), ids.data(), N, C);
    track_.update([&] { dx_free_ = true; });
    dev_.tracer.host_end(span);
  });
}

}  // namespace rt::cuda
