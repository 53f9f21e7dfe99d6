// The device bytes of the Muon Newton-Schulz workspace (cuda/newton_schulz.h):
// plain C++, so that the device plan (engine/device_plan.cpp) counts it in
// CPU-only builds too. Per lane (one NewtonSchulz; the engine runs
// kNewtonSchulzLanes of them, engine/cuda/muon_gpu.h): U (max_numel fp32,
// which holds X's copy during the steps), X (max_numel bf16), A and B
// (max_small^2 bf16 each) and the norm's block sums (one double per block of
// kNewtonSchulzNormBlock elements, + 2), each rounded up to 256 bytes as the
// allocator does.
#pragma once
#include <cstdint>

#include "cuda/sum_squares_order.h"

namespace rt::cuda {

// Matrices in flight at once: one being prepared or applied on the host
// while the other runs on the GPU.
inline constexpr int kNewtonSchulzLanes = 2;
// The device norm's block (rt::sum_squares's kOptimBlock, optim/adamw.h;
// cuda/sum_squares_order.h) and its epsilon (optim/muon.h kMuonNormEps):
// cuda/ sits below optim/; engine/cuda/muon_gpu.cpp asserts they agree.
inline constexpr int64_t kNewtonSchulzNormBlock = kSumSquaresBlock;
inline constexpr double kNewtonSchulzNormEps = 1e-7;

inline uint64_t newton_schulz_norm_doubles(int64_t max_numel) { return sum_squares_ordered_doubles(max_numel); }

inline uint64_t newton_schulz_workspace_bytes(int64_t max_numel, int64_t max_small, int lanes = kNewtonSchulzLanes) {
  const auto piece = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const uint64_t n = static_cast<uint64_t>(max_numel), s = static_cast<uint64_t>(max_small);
  return static_cast<uint64_t>(lanes) *
         (piece(n * 4) + piece(n * 2) + 2 * piece(s * s * 2) + piece(newton_schulz_norm_doubles(max_numel) * 8));
}

}  // namespace rt::cuda
