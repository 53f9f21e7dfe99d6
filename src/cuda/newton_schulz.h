// Muon's Newton-Schulz orthogonalisation (NS5) on the GPU, one matrix at a
// time, with bf16 operands and fp32 accumulation (cuBLAS GEMMs, CUBLAS_COMPUTE_32F).
// The CPU specification is optim/muon.h's newton_schulz5; the optimizer-side
// wrapper (normalisation, fp32 <-> bf16) is engine/cuda/muon_gpu.h.
//
// X [R, C] row-major bf16, already normalised. With s = min(R, C), the five
// steps work on the s-row orientation (X, or X^T when R > C) without moving
// data: the row-major buffer is read as a column-major [C, R] matrix and the
// GEMMs' op flags pick the orientation. Per step:
//   A = X X^T          [s, s] bf16 (fp32 sums, rounded once)
//   B = b A + c A A    [s, s] bf16 (A copied into B, then one GEMM with beta = b)
//   X = a X + B X      [R, C] bf16 (X copied into X2, one GEMM with beta = a, then X2 is X)
// with (a, b, c) and the step count given by the caller (optim/muon.h's
// kMuonNsA/B/C and kMuonNsSteps: cuda/ sits below optim/). Deterministic: fixed cuBLAS
// algorithms on one stream, no atomics; same inputs, same bits.
//
// Owns its stream, its cuBLAS handle (not the engine's: it runs on the
// optimizer's thread) and its device workspace, allocated once through the
// engine's DeviceAllocator: X, X2 (max_numel bf16 each) and A, B (max_small^2
// bf16 each), each rounded up to 256 bytes (newton_schulz_workspace_bytes,
// cuda/newton_schulz_workspace.h).
#pragma once
#include <cstdint>

#include "cuda/device_memory.h"
#include "cuda/ops.h"

namespace rt::cuda {

class NewtonSchulz {
 public:
  // max_numel: the largest R*C; max_small: the largest min(R, C) it will see;
  // (a, b, c): the quintic's coefficients (as fp32), steps: how many.
  NewtonSchulz(DeviceAllocator& alloc, int64_t max_numel, int64_t max_small, float a, float b, float c, int steps);
  ~NewtonSchulz();
  NewtonSchulz(const NewtonSchulz&) = delete;
  NewtonSchulz& operator=(const NewtonSchulz&) = delete;

  // x: R*C bf16 bit patterns in host memory (pinned for full copy speed),
  // row-major, normalised (Frobenius norm <= 1); replaced by NS5(x).
  // Synchronous: returns when x holds the result.
  void run(uint16_t* x, int64_t rows, int64_t cols);

  // The same on a device buffer (x: R*C bf16 in device memory, in place),
  // queued on this object's stream (for the bench: no host copies).
  void run_device(bf16* x, int64_t rows, int64_t cols);
  cudaStream_t stream() const { return stream_.get(); }
  int64_t max_numel() const { return max_numel_; }
  int64_t max_small() const { return max_small_; }

 private:
  int64_t max_numel_, max_small_;
  float a_coef_, b_coef_, c_coef_;
  int steps_;
  Stream stream_;
  cublasContext* h_ = nullptr;
  DevBuf<bf16> x_, x2_, a_, b_;
};

}  // namespace rt::cuda
