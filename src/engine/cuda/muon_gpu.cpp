// See muon_gpu.h.
#include "engine/cuda/muon_gpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda/newton_schulz_workspace.h"
#include "optim/adamw.h"

namespace rt::cuda {

namespace {
constexpr int64_t kGrain = 1 << 16;  // elements per thread-pool task of the conversions
}

GpuOrthogonalizer::GpuOrthogonalizer(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small)
    : ns_(alloc, max_numel, max_small, static_cast<float>(kMuonNsA), static_cast<float>(kMuonNsB),
          static_cast<float>(kMuonNsC), kMuonNsSteps),
      staging_(static_cast<size_t>(max_numel) * 2, "the Muon Newton-Schulz staging (bf16)") {}

std::string GpuOrthogonalizer::describe() const {
  char b[256];
  std::snprintf(b, sizeof b,
                "muon: Newton-Schulz on the GPU in bf16 (fp32 sums), one matrix at a time from the optimizer thread: "
                "%.1f MiB device workspace, %.1f MiB pinned staging (2 B/element each way)",
                newton_schulz_workspace_bytes(ns_.max_numel(), ns_.max_small()) / double(1 << 20),
                pinned_bytes() / double(1 << 20));
  return b;
}

void GpuOrthogonalizer::orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) {
  RT_CHECK(rows >= 1 && cols >= 1, "[muon] empty matrix ", rows, " x ", cols);
  const int64_t n = rows * cols;
  RT_CHECK(n <= ns_.max_numel() && std::min(rows, cols) <= ns_.max_small(), "[cuda muon] matrix ", rows, " x ", cols,
           " is larger than the Newton-Schulz workspace was sized for (", ns_.max_numel(), " elements, smaller side ",
           ns_.max_small(), ")");
  const float d = static_cast<float>(std::sqrt(sum_squares(u, n)) + kMuonNormEps);
  uint16_t* x = staging_.as<uint16_t>();
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) x[i] = f32_to_bf16(u[i] / d);
  });
  ns_.run(x, rows, cols);
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] = bf16_to_f32(x[i]);
  });
}

}  // namespace rt::cuda
