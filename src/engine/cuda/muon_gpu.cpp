// See muon_gpu.h.
#include "engine/cuda/muon_gpu.h"

#include <algorithm>
#include <cstdio>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"

namespace rt::cuda {

static_assert(kNewtonSchulzNormBlock == kOptimBlock, "the device norm sums in rt::sum_squares's blocks");
static_assert(kNewtonSchulzNormEps == kMuonNormEps, "the device norm adds Muon's epsilon");

namespace {
constexpr int64_t kGrain = 1 << 16;  // elements per thread-pool task of the copies
}

GpuOrthogonalizer::GpuOrthogonalizer(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small, int lanes)
    : max_numel_(max_numel) {
  RT_CHECK(lanes >= 1, "[cuda muon] ", lanes, " Newton-Schulz lanes");
  for (int l = 0; l < lanes; ++l) {
    auto ln = std::make_unique<Lane>();
    ln->ns = std::make_unique<NewtonSchulz>(alloc, max_numel, max_small, static_cast<float>(kMuonNsA),
                                            static_cast<float>(kMuonNsB), static_cast<float>(kMuonNsC), kMuonNsSteps);
    ln->in = PinnedBuf(static_cast<size_t>(max_numel) * 4, "the Muon Newton-Schulz input staging (fp32 U)");
    ln->out = PinnedBuf(static_cast<size_t>(max_numel) * 2, "the Muon Newton-Schulz output staging (bf16 O)");
    lanes_.push_back(std::move(ln));
  }
}

GpuOrthogonalizer::~GpuOrthogonalizer() {
  for (auto& l : lanes_)  // no copy may still read or write the pinned buffers freed below
    cudaStreamSynchronize(l->ns->stream());
}

uint64_t GpuOrthogonalizer::pinned_bytes() const {
  uint64_t b = 0;
  for (const auto& l : lanes_) b += l->in.bytes() + l->out.bytes() + sizeof(double);  // + the norm's host copy
  return b;
}

std::string GpuOrthogonalizer::describe() const {
  char b[320];
  const NewtonSchulz& ns = *lanes_[0]->ns;
  std::snprintf(b, sizeof b,
                "muon: Newton-Schulz on the GPU in bf16 (fp32 sums), %zu lanes pipelined with the optimizer thread "
                "(norm and bf16 conversion on the GPU): %.1f MiB device workspace, %.1f MiB pinned staging "
                "(U fp32 in, O bf16 out)",
                lanes_.size(),
                newton_schulz_workspace_bytes(ns.max_numel(), ns.max_small(), static_cast<int>(lanes_.size())) /
                    double(1 << 20),
                pinned_bytes() / double(1 << 20));
  return b;
}

GpuOrthogonalizer::Lane& GpuOrthogonalizer::at(int lane) {
  RT_CHECK(lane >= 0 && static_cast<size_t>(lane) < lanes_.size(), "[cuda muon] internal: lane ", lane, " of ",
           lanes_.size());
  return *lanes_[static_cast<size_t>(lane)];
}

float* GpuOrthogonalizer::input(int lane, int64_t n) {
  Lane& l = at(lane);
  RT_CHECK(!l.busy, "[cuda muon] internal: lane ", lane, " is asked for input before its result was taken");
  RT_CHECK(n >= 1 && n <= max_numel_, "[cuda muon] matrix of ", n,
           " elements is larger than the Newton-Schulz workspace was sized for (", max_numel_, " elements)");
  return l.in.as<float>();
}

void GpuOrthogonalizer::submit(int lane, int64_t rows, int64_t cols) {
  RT_CHECK(rows >= 1 && cols >= 1, "[muon] empty matrix ", rows, " x ", cols);
  Lane& l = at(lane);
  RT_CHECK(!l.busy, "[cuda muon] internal: lane ", lane, " submitted twice");
  l.ns->submit(l.in.as<float>(), l.out.as<uint16_t>(), rows, cols);
  l.busy = true;
}

const uint16_t* GpuOrthogonalizer::result(int lane) {
  Lane& l = at(lane);
  RT_CHECK(l.busy, "[cuda muon] internal: lane ", lane, " has no matrix in flight");
  l.ns->wait();
  l.busy = false;
  return l.out.as<uint16_t>();
}

void GpuOrthogonalizer::orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) {
  RT_CHECK(rows >= 1 && cols >= 1, "[muon] empty matrix ", rows, " x ", cols);
  const int64_t n = rows * cols;
  RT_CHECK(n <= max_numel_ && std::min(rows, cols) <= lanes_[0]->ns->max_small(), "[cuda muon] matrix ", rows, " x ",
           cols, " is larger than the Newton-Schulz workspace was sized for (", max_numel_, " elements, smaller side ",
           lanes_[0]->ns->max_small(), ")");
  float* in = input(0, n);
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) { std::copy(u + i0, u + i1, in + i0); });
  submit(0, rows, cols);
  const uint16_t* x = result(0);
  parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] = bf16_to_f32(x[i]);
  });
}

}  // namespace rt::cuda
