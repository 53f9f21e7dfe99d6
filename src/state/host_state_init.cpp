// HostState::init_random (state/host_state.h): HF-style random init from a
// counter-based RNG, so every element depends only on (seed, tensor, index)
// and never on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/thread_pool.h"
#include "state/host_state.h"

namespace rt {

namespace {

// splitmix64: counter-based, so any element's value depends only on (seed, tensor, index).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// normal(0, std) in pairs (2c, 2c+1), Marsaglia's polar method (no sine or
// cosine: one logarithm per pair): points (a, b) uniform in [-1, 1)^2 drawn
// from the counter stream of pair c until one lies inside the unit circle
// (s = a^2 + b^2 in (0, 1); 1.27 draws on average), then a*f, b*f with
// f = sqrt(-2 ln s / s) are two independent standard normals. Counter-based:
// element i depends only on (base, i), never on the thread count.
void init_normal(float* p, int64_t n, uint64_t base, float std) {
  const int64_t pairs = (n + 1) / 2;
  parallel_for(pairs, 1 << 15, [&](int64_t b, int64_t end) {
    for (int64_t c = b; c < end; ++c) {
      const uint64_t key = mix64(base ^ mix64(static_cast<uint64_t>(c)));
      double x = 0, y = 0, s = 0;
      for (uint64_t j = 0;; j += 2) {
        x = static_cast<double>(static_cast<int64_t>(mix64(key + j)) >> 11) * 0x1.0p-52;  // [-1, 1)
        y = static_cast<double>(static_cast<int64_t>(mix64(key + j + 1)) >> 11) * 0x1.0p-52;
        s = x * x + y * y;
        if (s < 1.0 && s > 0.0) break;
      }
      const double f = std::sqrt(-2.0 * std::log(s) / s) * std;
      p[2 * c] = static_cast<float>(x * f);
      if (2 * c + 1 < n) p[2 * c + 1] = static_cast<float>(y * f);
    }
  });
}

}  // namespace

void HostState::init_random(uint64_t seed, float std) {
  decoded_.clear();
  // Shadow storage (split, bf16) draws each tensor in fp32 first: one scratch
  // of the largest such tensor serves them all (a buffer per tensor would
  // fault in and zero 4 B/param of fresh pages again for every tensor).
  int64_t scratch_n = 0;
  for (const auto& u : units_)
    if (u.shadow_master())
      for (const auto& e : u.entries) scratch_n = std::max(scratch_n, e.numel());
  HostBuffer scratch;  // uninitialised: init_normal / fill write every element (on every core)
  if (scratch_n) scratch = HostBuffer(static_cast<size_t>(scratch_n), "the fp32 copy of one tensor at init");
  uint64_t tensor_id = 0;
  for (auto& u : units_) {
    for (size_t k = 0; k < u.entries.size(); ++k, ++tensor_id) {
      const WeightEntry& e = u.entries[k];
      const int64_t n = e.numel();
      float* p = u.shadow_master() ? scratch.p : u.master() + u.offsets[k];
      const bool is_norm = e.kind == WeightKind::attn_norm || e.kind == WeightKind::mlp_norm ||
                           e.kind == WeightKind::final_norm || e.kind == WeightKind::q_norm ||
                           e.kind == WeightKind::k_norm || e.kind == WeightKind::attn_post_norm ||
                           e.kind == WeightKind::mlp_post_norm;
      // norms start as the identity: w = 1, or 0 where they scale by (1 + w) (Gemma)
      const float one = 1.0f - static_cast<float>(spec_.norm_offset);
      if (e.is_norm_or_bias)
        std::fill(p, p + n, is_norm ? one : 0.0f);  // small tensors
      else
        init_normal(p, n, mix64(seed ^ mix64(tensor_id + 0x1234567ull)), std);
      if (u.shadow_master()) u.write_master(u.offsets[k], n, p);  // shadow storage: encode the tensor once made
    }
  }
}

}  // namespace rt
