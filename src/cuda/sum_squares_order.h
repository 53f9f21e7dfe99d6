// The device sum of squares in rt::sum_squares's exact order (optim/adamw.h):
// blocks of kSumSquaresBlock elements, in each kSumSquaresLanes lanes (lane =
// i mod 16) summed in double in index order and combined in lane order, the
// blocks' sums added in block order. x*x of a float is exact in double, so a
// fused multiply-add changes nothing: the device gives the CPU's double, bit
// for bit. Kernels: cuda/reduce.cu (cuda_ops.h's sum_squares_ordered); used by
// Muon's Newton-Schulz norm (cuda/newton_schulz.h) and by the gradient
// landing of units that land in pieces (engine/cuda/gradient_sink.h).
// Plain C++, so that the device plan (engine/device_plan.cpp) counts its
// scratch in CPU-only builds too; cuda/ sits below optim/, so the engine
// asserts kSumSquaresBlock == kOptimBlock.
#pragma once
#include <cstdint>

namespace rt::cuda {

inline constexpr int64_t kSumSquaresBlock = 16384;
inline constexpr int kSumSquaresLanes = 16;

// Device doubles sum_squares_ordered needs for n elements: one per block,
// then the sum and its fp32 root (+ eps).
inline uint64_t sum_squares_ordered_doubles(int64_t n) {
  return static_cast<uint64_t>((n + kSumSquaresBlock - 1) / kSumSquaresBlock) + 2;
}

}  // namespace rt::cuda
