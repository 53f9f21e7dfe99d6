// HostState: every byte of training state, in host RAM.
// The model is cut into units: unit 0 = embedding, units 1..L = decoder
// layers, unit L+1 = head (final norm + untied LM head). Each unit owns one
// contiguous arena [master | m | v] of fp32 (12 B/param) laid out in the
// canonical weight-map order (model/weight_map.h), so a unit moves in a few
// large copies; plus, for the CPU backend, an fp32 gradient arena (4 B/param).
// Views for the layer templates point into the arenas: binding is free.
// Lives below io/ (state <- io): reading and writing it as safetensors is
// io/state_tensors.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/spec.h"
#include "model/weight_map.h"

namespace rt {

// Aligned host allocation; failure throws rt::Error with bytes needed and available.
struct HostBuffer {
  HostBuffer() = default;
  HostBuffer(size_t n_floats, const std::string& what);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; o.n = 0; }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  float* p = nullptr;
  size_t n = 0;
};

uint64_t host_memory_available();  // MemAvailable from /proc/meminfo, bytes (0 if unknown)

struct StateUnit {
  std::string name;                  // "embed", "layer.3", "head"
  std::vector<WeightEntry> entries;  // canonical order
  std::vector<int64_t> offsets;      // element offset of each entry in the arena
  int64_t numel = 0;
  HostBuffer arena;                  // [master | m | v], 3 * numel floats
  HostBuffer grad;                   // numel floats (empty when grads are off)
  float* master() const { return arena.p; }
  float* m() const { return arena.p + numel; }
  float* v() const { return arena.p + 2 * numel; }
};

class HostState {
 public:
  HostState(const ModelSpec& spec, bool with_grads);

  const ModelSpec& spec() const { return spec_; }
  std::vector<StateUnit>& units() { return units_; }
  const std::vector<StateUnit>& units() const { return units_; }
  int64_t n_params() const;
  // Bytes of host memory per parameter held by this state (12 + 4 with grads).
  double bytes_per_param() const;
  uint64_t bytes_total() const;

  // HF-style init: normal(0, std) for matrices and embeddings, 1 for norms, 0
  // for biases; counter-based RNG, so identical for any thread count.
  void init_random(uint64_t seed, float std = 0.02f);
  void zero_grads();
  // Allocates the fp32 gradient arenas if the state was made without them.
  void ensure_grads();
  bool has_grads() const { return with_grads_; }
  void zero_moments();

  float* master(const std::string& name) const;  // throws when absent
  float* grad(const std::string& name) const;
  ModelWeightsT<float> weights() const;
  ModelGrads grads() const;

 private:
  struct Loc {
    size_t unit;
    int64_t offset;
  };
  const Loc& locate(const std::string& name) const;
  ModelSpec spec_;
  bool with_grads_;
  std::vector<StateUnit> units_;
  std::vector<std::pair<std::string, Loc>> index_;  // sorted by name
};

}  // namespace rt
