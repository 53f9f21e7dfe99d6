// HostState: every byte of training state, in host RAM.
// The model is cut into units: unit 0 = embedding, units 1..L = decoder
// layers, unit L+1 = head (final norm + untied LM head). Each unit owns one
// contiguous arena [master | m | v] of fp32 (12 B/param) laid out in the
// canonical weight-map order (model/weight_map.h), so a unit moves in a few
// large copies; plus, for the CPU backend, an fp32 gradient arena (4 B/param).
// Views for the layer templates point into the arenas: binding is free.
// Master storage: fp32 (above) or split (state/split_master.h): no fp32 master
// arena; the unit's bf16 shadow (one, or two in delayed-update mode: step t
// writes shadow t % 2 from the other) is the master's upper half, plus a 16-bit
// remainder and one tie bit per element; the arena is then [m | v]. The CUDA
// engine registers the shadows as pinned memory and loads them as they are; the
// CPU backend computes on the fp32 master, so it keeps (or converts to) fp32.
// Readers of a split master decode (read_master, weights(), io/state_tensors.h).
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
#include "state/split_master.h"

namespace rt {

// Aligned host allocation; failure throws rt::Error with bytes needed and available.
struct HostBuffer {
  HostBuffer() = default;
  // align: a power of two >= 64 (4096 for memory the CUDA engine pins in place).
  HostBuffer(size_t n_floats, const std::string& what, size_t align = 64);
  ~HostBuffer();
  HostBuffer(HostBuffer&& o) noexcept : p(o.p), n(o.n) {
    o.p = nullptr;
    o.n = 0;
  }
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  float* p = nullptr;
  size_t n = 0;
};

uint64_t host_memory_available();  // MemAvailable from /proc/meminfo, bytes (0 if unknown)

enum class MasterStorage { fp32, split };
const char* master_storage_name(MasterStorage s);

struct StateUnit {
  std::string name;                  // "embed", "layer.3", "head"
  std::vector<WeightEntry> entries;  // canonical order
  std::vector<int64_t> offsets;      // element offset of each entry in the arena
  int64_t numel = 0;
  HostBuffer arena;  // fp32: [master | m | v], 3 * numel floats; split: [m | v]
  HostBuffer grad;   // numel floats (empty when grads are off)
  // split storage only: bf16 shadows (page aligned, [1] only with two), remainder, tie bitmap
  HostBuffer shadow_buf[2], rem_buf, tie_buf;
  int n_shadows = 0;   // 0: fp32 storage
  int cur_shadow = 0;  // the shadow holding the current master (split)
  bool split() const { return n_shadows > 0; }
  float* master() const;  // fp32 storage only (throws on split)
  float* m() const { return arena.p + (split() ? 0 : numel); }
  float* v() const { return m() + numel; }
  uint16_t* shadow(int k) const { return reinterpret_cast<uint16_t*>(shadow_buf[k].p); }
  uint16_t* rem() const { return reinterpret_cast<uint16_t*>(rem_buf.p); }
  uint64_t* tie() const { return reinterpret_cast<uint64_t*>(tie_buf.p); }
  // The split master whose upper half is shadow k (element 0 = the unit's first).
  SplitMaster split_master(int k) const { return SplitMaster{shadow(k), rem(), tie(), 0}; }
  // Elements [b, b + n) of the current master as fp32 (split: decoded), and back
  // (split: encoded into every shadow, so all of them hold the current weights).
  void read_master(int64_t b, int64_t n, float* out) const;
  void write_master(int64_t b, int64_t n, const float* in);
};

class HostState {
 public:
  HostState(const ModelSpec& spec, bool with_grads);

  const ModelSpec& spec() const { return spec_; }
  std::vector<StateUnit>& units() { return units_; }
  const std::vector<StateUnit>& units() const { return units_; }
  int64_t n_params() const;
  // Bytes of host memory per parameter held by this state (fp32: 12, split with
  // one shadow: 12.125, + 2 per extra shadow; + 4 with grads): bytes_total() / n_params().
  double bytes_per_param() const;
  uint64_t bytes_total() const;
  // Host bytes a plan would hold for spec: state, pinned bf16 shadows (fp32
  // storage: the CUDA engine's own, `shadows` of them, 0 on the CPU backend;
  // split: the state's) and fp32 gradients when host_grads; the padding of the
  // tensors to 16 floats included, the buffers' rounding to 64 B / 4 KiB not
  // (as bytes_total).
  static uint64_t planned_bytes(const ModelSpec& spec, MasterStorage storage, int shadows, bool host_grads);

  // Master storage. set_master_storage converts unit by unit (peak: the state
  // plus one unit), bit-exact both ways; split with n_shadows 1 or 2 (a change of
  // the count keeps the current master). Afterwards every shadow holds the
  // current master and it is shadow 0. Not while an update runs.
  MasterStorage master_storage() const { return units_[0].split() ? MasterStorage::split : MasterStorage::fp32; }
  void set_master_storage(MasterStorage s, int n_shadows = 1);

  // HF-style init: normal(0, std) for matrices and embeddings, 1 for norms, 0
  // for biases; counter-based RNG, so identical for any thread count.
  void init_random(uint64_t seed, float std = 0.02f);
  void zero_grads();
  // Allocates the fp32 gradient arenas if the state was made without them.
  void ensure_grads();
  // Only unit u's (--grads fold: the host embedding's), if it has none.
  void ensure_unit_grad(size_t u);
  bool has_grads() const { return with_grads_; }
  void zero_moments();

  float* master(const std::string& name) const;  // fp32 storage only; throws when absent
  // One tensor's current master as fp32 (numel floats), and back.
  void read_master(const std::string& name, float* out) const;
  void write_master(const std::string& name, const float* in);
  float* grad(const std::string& name) const;
  // fp32 views of the master. Split storage: decoded into a copy the state
  // keeps (4 B/param, allocated on first use; freed by release_decoded), valid
  // until the next update: call it again after training.
  ModelWeightsT<float> weights() const;
  void release_decoded() const { decoded_.clear(); }
  // What weights() does first: (re)decodes the copy (split; no-op on fp32). Then
  // master_view(name) points at a tensor's fp32 master or its decoded copy.
  void decode_all() const;
  const float* master_view(const std::string& name) const { return view(name); }
  ModelGrads grads() const;

 private:
  struct Loc {
    size_t unit;
    int64_t offset;
  };
  const Loc& locate(const std::string& name) const;
  float* view(const std::string& name) const;  // weights(): fp32 master or its decoded copy
  ModelSpec spec_;
  bool with_grads_;
  std::vector<StateUnit> units_;
  std::vector<std::pair<std::string, Loc>> index_;  // sorted by name
  mutable std::vector<HostBuffer> decoded_;         // split: weights()' fp32 copy, per unit
};

}  // namespace rt
