// The device bytes of NewtonSchulz's workspace (cuda/newton_schulz.h): plain
// C++, so that the device plan (engine/device_plan.cpp) counts it in CPU-only
// builds too. X and its copy (max_numel bf16 each), A and B (max_small^2 bf16
// each), each rounded up to 256 bytes as the allocator does.
#pragma once
#include <cstdint>

namespace rt::cuda {

inline uint64_t newton_schulz_workspace_bytes(int64_t max_numel, int64_t max_small) {
  const auto piece = [](uint64_t n) { return (n * 2 + 255) / 256 * 256; };
  return 2 * piece(static_cast<uint64_t>(max_numel)) +
         2 * piece(static_cast<uint64_t>(max_small) * static_cast<uint64_t>(max_small));
}

}  // namespace rt::cuda
