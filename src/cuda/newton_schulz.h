// Muon's Newton-Schulz orthogonalisation (NS5) on the GPU, one matrix at a
// time per object, with bf16 operands and fp32 accumulation (cuBLAS GEMMs, CUBLAS_COMPUTE_32F).
// The CPU specification is optim/muon.h's muon_orthogonalize (normalisation
// and newton_schulz5); the optimizer-side wrapper (lanes, pinned staging) is
// engine/cuda/muon_gpu.h.
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
// The pipelined form (engine/cuda/muon_gpu.h runs two of these as lanes):
// submit() takes U in fp32 straight from (pinned) host memory and does the
// whole job on this object's stream: U in (4 B/element), ||U||_F and the
// division on the device, five steps, O out as bf16 (2 B/element) into host
// memory; wait() blocks until O is there. The norm is the CPU's
// rt::sum_squares (optim/adamw.cpp) in the same order, so the same double:
// blocks of 16384 elements, in each 16 lanes (lane = i mod 16) summed in
// double in index order and combined in lane order, the blocks' sums added
// in block order (one device thread per block and lane, one for the blocks:
// cuda_ops.h's sum_squares_ordered, shared with the gradient landing);
// x*x of a float is exact in double, so a fused multiply-add changes nothing.
// Then d = fp32(sqrt(sum) + 1e-7) and X = bf16_rn(U / d) (IEEE division), as
// GpuOrthogonalizer did on the host: the same bits as before.
//
// Owns its stream (non-blocking: the engine's streams never wait on it), its
// cuBLAS handle (not the engine's: it runs on the optimizer's thread) and its
// device workspace, allocated once through the engine's DeviceAllocator: U
// (max_numel fp32; its bytes hold X's copy during the steps), X (max_numel
// bf16), A, B (max_small^2 bf16 each) and the norm's block sums, each rounded
// up to 256 bytes (newton_schulz_workspace_bytes, cuda/newton_schulz_workspace.h).
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

  // u: R*C floats (U, not normalised) and o: R*C bf16 bit patterns, both in
  // pinned host memory; queues U in, the norm, X = bf16(U / d), five steps
  // and O out on this stream and returns. u and o must stay untouched until
  // wait() returns.
  void submit(const float* u, uint16_t* o, int64_t rows, int64_t cols);
  void wait();  // until the last submit's O is in host memory
  // After wait(): the device's sum of squares of the last submit's U (the
  // tests compare it with rt::sum_squares), and its timings in ms (events on
  // this stream): U in + norm + division, the five steps, O out.
  double last_sum_squares() const { return *host_sum_.as<double>(); }
  struct Times {
    float in_ms, steps_ms, out_ms;
  };
  Times last_times() const;

  cudaStream_t stream() const { return stream_.get(); }
  int64_t max_numel() const { return max_numel_; }
  int64_t max_small() const { return max_small_; }

 private:
  bf16* steps(bf16* x, int64_t rows, int64_t cols);  // the five steps on x; returns where the result is (x or X's copy)
  int64_t max_numel_, max_small_;
  float a_coef_, b_coef_, c_coef_;
  int steps_;
  Stream stream_;
  cublasContext* h_ = nullptr;
  DevBuf<float> u_;
  DevBuf<bf16> x_, a_, b_;
  DevBuf<double> norm_;  // the blocks' sums, then the total and d
  PinnedBuf host_sum_;
  Event ev_start_{true}, ev_normed_{true}, ev_stepped_{true}, ev_done_{true};
};

}  // namespace rt::cuda
