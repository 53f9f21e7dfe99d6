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
// bf16 masters (--master bf16-sr | bf16-kahan): the master IS the bf16 shadow
// (no fp32 copy, no remainder): updates round the new fp32 value to bf16
// stochastically (bf16-sr), or to nearest with a bf16 Kahan compensation per
// element (bf16-kahan: the rem buffer holds it; the exact sum is shadow - comp).
// 2 (+2) B/param. These change the arithmetic (not bit-identical to fp32):
// the CPU backend keeps them and computes on their decoded copy.
// Moments: fp32 m, v in the arena, or block-wise quantized (state/moment_quant.h,
// --optimizer adamw8bit | adamw4bit): codes and scales in their own buffers
// and the arena holds the fp32 master only (or nothing with a shadow master).
// Update rule (--optimizer muon | muon8bit | muon4bit, optim/muon.h): Muon for
// the 2-D matrices of the layers, AdamW for the rest. A Muon matrix's momentum
// lives in its m (fp32, or the m8 / m4n codes of muon8bit / muon4bit); it has no v: a Muon unit's v
// is packed, holding only its other tensors' (v_off, nv), so fp32 matrices
// cost 4 (master) + 4 (momentum) B/param. The arena is then [master | m | v]
// with m numel and v nv floats; quantized: v codes of nv elements, scales
// [m: quant_blocks(numel) | v: quant_blocks(nv)].
// Lives below io/ (state <- io): reading and writing it as safetensors is
// io/state_tensors.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/spec.h"
#include "model/weight_map.h"
#include "state/moment_quant.h"
#include "state/split_master.h"

namespace rt {

class StateTier;  // state/state_tier.h

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

enum class MasterStorage { fp32, split, bf16_sr, bf16_kahan };
enum class UpdateRule { adamw, muon };
const char* update_rule_name(UpdateRule r);  // "adamw", "muon"
// The --optimizer value of a rule and moment storage: adamw, adamw8bit, adamw4bit, muon, muon8bit, muon4bit.
const char* optimizer_name(UpdateRule r, MomentStorage m);
// Whether Muon updates e: the q, k, v, o, gate, up, down projections (dense,
// MoE experts, a shared expert). Not the embedding, the LM head, norms,
// biases, the router or the shared-expert gate.
bool muon_matrix(const WeightEntry& e);
const char* master_storage_name(MasterStorage s);  // the --master value: fp32, split, bf16-sr, bf16-kahan
inline bool master_is_bf16(MasterStorage s) { return s == MasterStorage::bf16_sr || s == MasterStorage::bf16_kahan; }

struct StateUnit {
  std::string name;                  // "embed", "layer.3", "head"
  int64_t index = 0;                 // position in HostState::units() (a key of stochastic rounding)
  std::vector<WeightEntry> entries;  // canonical order
  std::vector<int64_t> offsets;      // element offset of each entry in the arena
  int64_t numel = 0;
  // [master (fp32 storage) | m | v (fp32 moments)]: 3 * numel floats with fp32
  // master and moments; split or bf16 master: [m | v]; quantized: [master] or empty
  HostBuffer arena;
  HostBuffer grad;  // numel floats (empty when grads are off)
  // shadow masters (split, bf16) only: bf16 shadows (page aligned, [1] only with
  // two), remainder (split) or Kahan compensation (bf16-kahan), tie bitmap (split)
  HostBuffer shadow_buf[2], rem_buf, tie_buf;
  // quantized moments only: m codes, v codes, scales [m: nb | v: nb] (moment_quant.h)
  HostBuffer qm_buf, qv_buf, qscale_buf;
  // A state tier (state/state_tier.h): fp32 moments [m | v] apart from the
  // master's arena (moments_apart), and whether the unit's optimizer state
  // is in the tier's file now (paged_out: m(), the codes, rem, tie are not here;
  // with weights_paged its weights too: the fp32 master's arena, the shadows).
  HostBuffer mv_buf;
  bool moments_apart = false, paged_out = false, weights_paged = false;
  MasterStorage master_kind = MasterStorage::fp32;
  MomentStorage moments = MomentStorage::fp32;
  bool muon = false;  // UpdateRule::muon: the unit's Muon matrices (optim/muon.h) keep their momentum in m
  // Weights only (HostState::keep_weights_only): the bf16 shadow and nothing
  // else; the optimizer state lives elsewhere (a GPU data-parallel rank's
  // shards, engine/sharded_optimizer.h). m(), v() and the update refuse it.
  bool weights_only = false;
  // Muon units: entry k's v at v_off[k] of the packed v (-1: a Muon matrix, no v), nv its length
  std::vector<int64_t> v_off;
  int64_t nv = 0;
  int64_t v_len() const { return muon ? nv : numel; }                            // elements of v
  int64_t v_at(size_t k) const { return muon ? v_off[k] : offsets[k]; }          // entry k's v offset (-1: none)
  int n_shadows = 0;                                    // 0: fp32 storage
  int cur_shadow = 0;                                   // the shadow holding the current master (split, bf16)
  bool shadow_master() const { return n_shadows > 0; }  // the master lives in the shadow(s)
  bool split() const { return master_kind == MasterStorage::split; }
  bool quantized() const { return moments != MomentStorage::fp32; }
  float* master() const;  // fp32 storage only (throws on a shadow master)
  float* m() const;       // fp32 moments only (throws on quantized ones)
  float* v() const { return m() + numel; }  // v_len() floats
  uint8_t* qm() const { return reinterpret_cast<uint8_t*>(qm_buf.p); }
  uint8_t* qv() const { return reinterpret_cast<uint8_t*>(qv_buf.p); }
  float* scale_m() const { return qscale_buf.p; }
  float* scale_v() const { return qscale_buf.p + quant_blocks(numel); }  // quant_blocks(v_len())
  uint16_t* comp() const { return rem(); }  // bf16-kahan
  uint16_t* shadow(int k) const { return reinterpret_cast<uint16_t*>(shadow_buf[k].p); }
  uint16_t* rem() const { return reinterpret_cast<uint16_t*>(rem_buf.p); }
  uint64_t* tie() const { return reinterpret_cast<uint64_t*>(tie_buf.p); }
  // The split master whose upper half is shadow k (element 0 = the unit's first).
  SplitMaster split_master(int k) const { return SplitMaster{shadow(k), rem(), tie(), 0}; }
  // Elements [b, b + n) of the current master as fp32 (split: decoded), and back
  // (split: encoded into every shadow, so all of them hold the current weights).
  void read_master(int64_t b, int64_t n, float* out) const;
  void write_master(int64_t b, int64_t n, const float* in);
  // Throws naming the unit when the state tier holds its weights (page it in first).
  void check_weights_in_ram() const;
};

class HostState {
 public:
  // Made directly in the given storages (so a model that fits only in a lean
  // mode is never allocated in fp32 first); a bf16 or split master with one
  // shadow; rule muon: laid out for Muon from the start (set_update_rule on a
  // made state rebuilds every unit).
  HostState(const ModelSpec& spec, bool with_grads, MomentStorage moments = MomentStorage::fp32,
            MasterStorage master = MasterStorage::fp32, UpdateRule rule = UpdateRule::adamw);

  const ModelSpec& spec() const { return spec_; }
  std::vector<StateUnit>& units() { return units_; }
  const std::vector<StateUnit>& units() const { return units_; }
  int64_t n_params() const;
  // Bytes of host memory per parameter held by this state (fp32: 12, split with
  // one shadow: 12.125, + 2 per extra shadow; + 4 with grads; the moments 8,
  // 2.03 or 1.03 of it, the master 4, 4.125 (split), 2 (bf16-sr) or 4 (bf16-kahan)): bytes_total() / n_params().
  double bytes_per_param() const;
  uint64_t bytes_total() const;
  // Host bytes a plan would hold for spec: state, pinned bf16 shadows (fp32
  // storage: the CUDA engine's own, `shadows` of them, 0 on the CPU backend;
  // split: the state's) and fp32 gradients when host_grads; the padding of the
  // tensors to 16 floats included, the buffers' rounding to 64 B / 4 KiB not
  // (as bytes_total).
  static uint64_t planned_bytes(const ModelSpec& spec, MasterStorage storage, int shadows, bool host_grads,
                                MomentStorage moments = MomentStorage::fp32, UpdateRule rule = UpdateRule::adamw);

  // Master storage. set_master_storage converts unit by unit (peak: the state
  // plus one unit), bit-exact both ways; split with n_shadows 1 or 2 (a change of
  // the count keeps the current master). Afterwards every shadow holds the
  // current master and it is shadow 0. Not while an update runs.
  // Converting to a bf16 master rounds to nearest (Kahan: the compensation
  // keeps the rounding error); from it, exact.
  MasterStorage master_storage() const { return units_[0].master_kind; }
  void set_master_storage(MasterStorage s, int n_shadows = 1);
  // Moment storage: fp32 or quantized (state/moment_quant.h, nearest rounding
  // when converting); quantized -> fp32 decodes exactly. Unit by unit.
  MomentStorage moment_storage() const { return units_[0].moments; }
  void set_moment_storage(MomentStorage s);

  // Update rule of every unit. A change zeroes the m (and drops or adds the v)
  // of the Muon matrices (Adam moments and Muon momentum do not convert);
  // the other tensors keep theirs. Unit by unit. Not while an update runs.
  UpdateRule update_rule() const { return units_[0].muon ? UpdateRule::muon : UpdateRule::adamw; }
  void set_update_rule(UpdateRule r);

  // HF-style init: normal(0, std) for matrices and embeddings, 1 for norms, 0
  // for biases; counter-based RNG, so identical for any thread count
  // (state/host_state_init.cpp).
  void init_random(uint64_t seed, float std = 0.02f);
  void zero_grads();
  // Allocates the fp32 gradient arenas if the state was made without them.
  void ensure_grads();
  // Only unit u's (--grads fold: the host embedding's), if it has none.
  void ensure_unit_grad(size_t u);
  bool has_grads() const { return with_grads_; }
  void zero_moments();
  // Unit u becomes weights only (StateUnit::weights_only): its current master
  // rounded to nearest bf16 in one page-aligned shadow (a bf16-sr master's
  // layout), every other buffer freed. For a data-parallel GPU rank, whose
  // fp32 master and moments live in its shards: 2 B/param remain. One way.
  void keep_weights_only(size_t u);
  bool weights_only() const { return units_[0].weights_only; }
  // The state tier that pages the units' optimizer state (state/state_tier.h;
  // nullptr: all in RAM). Set by the tier itself. The storage conversions
  // (set_master_storage, ...) refuse a tiered state.
  StateTier* tier() const { return tier_; }
  void set_tier(StateTier* t) { tier_ = t; }

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
  // A state tier that pages the weights (state_tier.h): every storage decodes,
  // each unit read in from the tier (clean).
  void decode_all() const;
  // Views of per-unit fp32 buffers laid out like the units (numel floats each):
  // an engine's own copy of the weights (the CPU backend's when the tier pages them).
  ModelWeightsT<float> weights_in(const std::vector<HostBuffer>& per_unit) const;
  const float* master_view(const std::string& name) const { return view(name); }
  ModelGrads grads() const;

 private:
  struct Loc {
    size_t unit;
    int64_t offset;
  };
  const Loc& locate(const std::string& name) const;
  ModelWeightsT<float> weights_of(const std::function<const float*(const std::string&)>& get) const;
  float* view(const std::string& name) const;  // weights(): fp32 master or its decoded copy
  ModelSpec spec_;
  bool with_grads_;
  std::vector<StateUnit> units_;
  std::vector<std::pair<std::string, Loc>> index_;  // sorted by name
  StateTier* tier_ = nullptr;                       // the tier paging this state's units, if any
  mutable std::vector<HostBuffer> decoded_;         // split: weights()' fp32 copy, per unit
};

}  // namespace rt
