// The CUDA engine's Orthogonalizer (optim/muon.h): Muon's NS5 of each matrix
// on the GPU (cuda/newton_schulz.h), called by the CPU optimizer on the
// engine's worker thread. Pipelined (Orthogonalizer::lanes): two lanes,
// each a NewtonSchulz with its own non-blocking stream, cuBLAS handle and
// device workspace, and its own pinned host buffers: U in (fp32, 4 B per
// element, written by the optimizer's momentum pass) and O out (bf16, 2 B).
// Per matrix, all on the lane's stream:
//   U in; d = fp32(sqrt(sum_squares(U)) + 1e-7) (rt::sum_squares's order, in
//   double: the same d as the CPU spec); X = bf16_rn(U / d); five quintic
//   steps in bf16 with fp32 sums; O = X out.
// While one lane runs, the optimizer thread applies the other lane's last O
// and makes the next U (optim/muon_unit.cpp), and a second small matrix
// (k_proj, v_proj) can run beside it. orthogonalize() (one matrix,
// synchronous: the tests' and the bench's) runs the same job on lane 0, so
// both forms give the same bits. The result differs from the fp32 spec by
// bf16 rounding (measured in tests/gpu/muon_gpu_test.cpp); its CPU twin is
// muon_orthogonalize_bf16 (optim/muon.h). Device workspace: per lane, sized
// for the model's largest Muon matrix (muon_matrix_dims) and counted in the
// device plan (cuda/newton_schulz_workspace.h); pinned host: 6 B per element
// of that matrix per lane.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device_memory.h"
#include "cuda/newton_schulz.h"
#include "cuda/newton_schulz_workspace.h"
#include "optim/muon.h"

namespace rt::cuda {

class GpuOrthogonalizer final : public Orthogonalizer {
 public:
  // Workspace for matrices of up to max_numel elements whose smaller side is <= max_small.
  GpuOrthogonalizer(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small, int lanes = kNewtonSchulzLanes);
  ~GpuOrthogonalizer() override;
  void orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) override;
  int lanes() const override { return pipelined_ ? static_cast<int>(lanes_.size()) : 0; }
  float* input(int lane, int64_t n) override;
  void submit(int lane, int64_t rows, int64_t cols) override;
  const uint16_t* result(int lane) override;

  // false: lanes() == 0, so muon_unit_update calls orthogonalize() one matrix
  // at a time (the tests' and the bench's comparison)
  void set_pipelined(bool on) { pipelined_ = on; }
  // the lane's NewtonSchulz (timings, the device norm): for tests and the bench
  const NewtonSchulz& lane(int l) const { return *lanes_.at(static_cast<size_t>(l))->ns; }
  uint64_t pinned_bytes() const;
  std::string describe() const;  // one line: where NS5 runs, the workspace and staging bytes

 private:
  struct Lane {
    std::unique_ptr<NewtonSchulz> ns;
    PinnedBuf in, out;  // U (fp32), O (bf16)
    bool busy = false;  // submitted, result not taken
  };
  Lane& at(int lane);
  int64_t max_numel_;
  bool pipelined_ = true;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace rt::cuda
