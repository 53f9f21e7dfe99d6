// Weight slots: where the bf16 weights the device computes with come from.
// Host: a pinned bf16 shadow of every unit, exact size, which the optimizer
// rewrites after each update (two per unit in delayed-update mode: step t's
// update writes shadow t % 2 while step t+1 reads the other). Device: S layer
// slots (layer i lives in slot i % S), the head and, unless it stays on the
// host, the embedding. Every load is queued on the h2d stream piece by piece
// as the optimizer's update of that unit finishes (UpdateTracker), so a load
// runs under the update instead of after it; a slot is reloaded only when
// its layer or the weights' version changed.
// Split master storage (state/host_state.h): the shadows are the state's own
// (the upper half of the master), pinned in place with cudaHostRegister for the
// engine's lifetime; shadow k of the engine is the state's shadow k.
// Paged weights (--state-dir below the minimum with the weights in RAM,
// state/state_tier.h; page_weights): the state's shadows live in the tier's
// file between updates, so no load reads them. Every layer keeps its own
// slot (S >= L, --resident), the head and the embedding theirs (a host
// embedding: an engine-owned bf16 copy), and each unit's weights cross PCIe
// once a step, from the worker, right after its update while the unit is
// paged in (upload_paged); a load then only waits for the unit's update.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/engine_device.h"
#include "engine/update_tracker.h"
#include "state/host_state.h"

namespace rt::cuda {

// Host memory pinned in place (cudaHostRegister) while this lives.
class HostRegistration {
 public:
  HostRegistration(void* p, size_t bytes, const std::string& what);
  ~HostRegistration();
  HostRegistration(HostRegistration&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  HostRegistration& operator=(HostRegistration&&) = delete;

 private:
  void* p_ = nullptr;
};

// Data parallel (GpuDataParallel, backend.h): every device buffer holds
// world * S elements of its unit (S: the shard stride), and a load copies the
// rank's own slice of the shadow (the only part its optimizer writes) to its
// place, then all-gathers the other ranks' slices in place on the weights
// communicator's stream, ordered against h2d and compute with events.
// gather_into_host() brings every unit's whole current weights back into
// the host shadows (sync(): sampling, export).
class WeightSlots {
 public:
  WeightSlots(HostState& st, EngineDevice& dev, UpdateTracker& track, int slots, bool host_embed,
              const GpuDataParallel& dp = {});
  // Data parallel: the whole current weights of every unit into the host
  // shadows (a collective; the device buffers reload afterwards).
  void gather_into_host();

  int count() const { return S_; }
  // Layers loaded ahead of the one computing (bounded by the free slots).
  int64_t prefetch_depth() const { return std::min<int64_t>(S_, 3); }

  // The pinned shadow of unit u at the version this step computes with.
  const uint16_t* shadow_src(size_t u) const;
  // Shadow k (0, or 1 in delayed mode) of unit u: what the optimizer writes.
  uint16_t* shadow(int k, size_t u) { return split_ ? st_.units()[u].shadow(k) : shadow_[k][u].as<uint16_t>(); }
  bool split() const { return split_; }
  // Pinned host bytes this owns (0 with a split master: the state holds its shadows).
  uint64_t pinned_bytes() const {
    uint64_t b = 0;
    for (auto& v : shadow_)
      for (auto& p : v) b += p.bytes();
    return b;
  }

  // ---- paged weights ----
  // "" when the tier may page the weights, else why not and the fix.
  std::string paging_refusal() const;
  // Before the tier pages the weights: the state's shadows are unpinned (the
  // tier frees their buffers) and the loads stop reading them.
  void page_weights();
  bool paged() const { return paged_; }
  // Worker (or, at start, the thread that made the engine), unit u paged in:
  // its current weights to its device buffer (or the host embedding's copy).
  // Returns when the copy is done, so the tier may free or reuse the
  // shadow's buffer right after; the unit is marked updated after this.
  void upload_paged(size_t u);
  // After the tier paged the weights out: every unit's, each read in (clean).
  void upload_all_paged();

  // Queues the load of layer i into its slot unless it is already there.
  void load_layer(int64_t i);
  // Layer i's weights, the compute stream waiting for their load.
  const bf16* use_layer(int64_t i);
  // The compute stream's last use of layer i's slot is queued.
  void release_layer(int64_t i);

  // Unit-resident pieces: reloaded after each update.
  void ensure_embed() { ensure_unit(0, embed_w_, embed_version_, embed_loaded_); }
  void ensure_head();
  const bf16* embed() const { return embed_w_.data(); }
  const bf16* head() const { return head_w_.data(); }

 private:
  void copy_in_as_updated(size_t u, bf16* dst, const char* what, int layer);
  void copy_in_gathered(size_t u, bf16* dst, const char* what, int layer);  // data parallel
  int64_t dev_numel(size_t u) const;                                        // device elements of unit u's buffers
  void zero_lm_head_padding(size_t u, bf16* dst, cudaStream_t stream);
  void ensure_unit(size_t u, DevBuf<bf16>& dst, int64_t& have_version, Event& loaded);
  HostState& st_;
  EngineDevice& dev_;
  UpdateTracker& track_;
  int S_;
  std::vector<int64_t> dev_numels_;   // device_unit_numels (engine/device_plan.h)
  bool split_ = false;                // the shadows are the state's own (split or bf16 master; registered)
  std::vector<PinnedBuf> shadow_[2];  // fp32 master storage: [1] only in delayed mode
  std::vector<HostRegistration> registered_;
  DevBuf<bf16> embed_w_, head_w_;
  int64_t embed_version_ = -1, head_version_ = -1;
  Event embed_loaded_, head_loaded_;
  std::vector<DevBuf<bf16>> slots_;
  std::vector<int64_t> slot_layer_, slot_version_;
  std::vector<Event> slot_loaded_, slot_free_;
  bool paged_ = false;                // page_weights(): uploads come from the optimizer, loads only wait
  bool host_embed_ = false;           // the embedding stays on the host (HostEmbedding)
  std::vector<uint16_t> embed_copy_;  // paged, host embedding: its bf16 table (the gathers' source)
  Stream upload_;  // paged: the uploads' own stream (the compute thread's h2d work never waits on them)
  GpuDataParallel dp_;
  Event dp_slice_in_, dp_gathered_;
};

}  // namespace rt::cuda
