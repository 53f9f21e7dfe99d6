// The CUDA engine's Orthogonalizer (optim/muon.h): Muon's NS5 of each matrix
// on the GPU (cuda/newton_schulz.h), called by the CPU optimizer on the
// engine's worker thread, one matrix at a time, synchronously. Per matrix:
//   host:   d = ||U||_F (double) + 1e-7, rounded to fp32 (as the spec);
//           X = bf16(U / d) (round to nearest even) into pinned staging
//   device: X in (2 B/param), five quintic steps in bf16 with fp32 sums, X out
//   host:   O = fp32(X)
// The result differs from the fp32 spec by bf16 rounding (measured in
// tests/gpu/muon_gpu_test.cpp); the CPU twin of this rounding is
// muon_orthogonalize_bf16 (optim/muon.h). Device workspace: NewtonSchulz's,
// sized for the model's largest Muon matrix (muon_matrix_dims) and counted
// in the device plan; pinned host staging: 2 B per element of that matrix.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/device_memory.h"
#include "cuda/newton_schulz.h"
#include "optim/muon.h"

namespace rt::cuda {

class GpuOrthogonalizer final : public Orthogonalizer {
 public:
  // Workspace for matrices of up to max_numel elements whose smaller side is <= max_small.
  GpuOrthogonalizer(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small);
  void orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) override;
  uint64_t pinned_bytes() const { return staging_.bytes(); }
  std::string describe() const;  // one line: where NS5 runs, the workspace and staging bytes

 private:
  NewtonSchulz ns_;
  PinnedBuf staging_;
};

}  // namespace rt::cuda
