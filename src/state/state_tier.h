// StateTier: the storage tier below RAM (--state-dir PATH, --max-host-memory
// SIZE; docs/architecture.md, "State tier"). A unit's optimizer state (fp32
// [m | v] or the quantized codes and scales, a split master's remainder and
// tie bits, a bf16-kahan compensation) has a home in one preallocated file,
// PATH/ramtrain-state.bin (core/direct_file.h); RAM keeps the weights, the
// gradients, the units whose state fits beside them, and the units in flight.
// When RAM cannot hold the weights beside three units in flight, and the
// engine computes on a copy of its own (TierOptions::page_weights: the CPU
// backend's fp32 compute copy), a paged unit's weights (the fp32 master, or a
// shadow master's bf16 shadows) page with its state: RAM keeps the gradients.
// The update walks units through for_each: the next paged unit is read on the
// tier's I/O thread while unit i updates, and unit i is written back behind it.
// Paging moves bytes, never values: a tiered run is bit-identical to the
// all-in-RAM one. The live file is never a checkpoint (checkpoints copy
// from RAM, unit by unit), so a crash mid-step loses nothing the last one had.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/direct_file.h"
#include "state/host_state.h"

namespace rt {

// One unit's host bytes: resident (weights, gradients: in RAM) and paged
// (its optimizer state: in the file, or kept in RAM when it fits; every
// buffer rounded up to kDirectAlign, as in the file). weights: the part of
// resident that pages too when the weights must (the fp32 master, a shadow
// master's shadows), as allocated; weights_paged: the same buffers rounded
// as in the file.
struct TierUnitBytes {
  uint64_t resident = 0, paged = 0;
  uint64_t weights = 0, weights_paged = 0;
};

// What lives where. In RAM: resident + kept + slots (the in-flight units);
// in the file: the paged units' state (file_bytes), read and written once
// per step (traffic_per_step).
struct TierPlan {
  std::vector<char> paged;  // per unit: its state's home is the file
  bool weights_paged = false;  // a paged unit's weights page with its state (RAM keeps the gradients)
  uint64_t resident = 0;    // every unit's resident bytes
  uint64_t kept = 0;        // the state of the units kept in RAM
  uint64_t slots = 0;       // in flight: the three largest paged units (read ahead, updating, writing back)
  uint64_t file_bytes = 0;  // the paged units' state: the file's size
  uint64_t min_bytes = 0;   // the smallest --max-host-memory the tier runs in
  uint64_t min_bytes_resident_weights = 0;  // ... with the weights in RAM (min_bytes when they do not page)
  uint64_t weight_file_bytes = 0;           // the paged units' weights (weights_paged): part of file_bytes
  bool fits = true;         // budget >= min_bytes
  int n_paged() const;
  uint64_t ram() const { return resident + kept + slots; }
  uint64_t traffic_per_step() const { return 2 * file_bytes; }  // every paged unit read and written once
  bool operator==(const TierPlan& o) const;
};

// Places units under a host budget of max_host_bytes (0: page every unit's
// optimizer state). Everything fits: nothing is paged. Else the in-flight
// slots are reserved (min_bytes: resident + the three largest units' state)
// and the rest keeps whole units' state in RAM, offered in keep order (the
// embedding, then the others spread evenly: state_tier.cpp keep_order); the
// others are paged. When even that minimum does not fit a budget > 0 and page_weights,
// the weights move from resident to paged and the same placement runs again
// (weights_paged): whole units (weights + state) kept in keep order, the rest
// paged; min_bytes is then resident (gradients) + the three largest units'
// weights and state, min_bytes_resident_weights the first placement's.
TierPlan tier_place(const std::vector<TierUnitBytes>& units, uint64_t max_host_bytes, bool page_weights = false);
// Per unit, from the spec, as a state of these storages holds them (the
// layout of HostState's constructor): `shadows` bf16 shadows (fp32 storage:
// the CUDA engine's own, 0 on the CPU backend) and fp32 gradients when host_grads.
std::vector<TierUnitBytes> tier_unit_bytes_planned(const ModelSpec& spec, MasterStorage master, int shadows,
                                                   bool host_grads, MomentStorage moments, UpdateRule rule);
// Per unit, from a live state's buffers (its optimizer state in RAM or paged).
std::vector<TierUnitBytes> tier_unit_bytes(const HostState& s);

struct TierOptions {
  std::string dir;              // --state-dir: an existing, writable directory on a local SSD
  uint64_t max_host_bytes = 0;  // --max-host-memory (0: page every unit)
  std::string where = "[train]";
  // The engine can compute without the host weights (it keeps a copy of its
  // own, refreshed from each unit right after its update): the tier may page
  // them (tier_place's page_weights). Else weights_stay says why not (and the
  // fix), quoted when the budget is below the minimum with them in RAM.
  bool page_weights = false;
  std::string weights_stay = std::string();
};

class StateTier {
 public:
  // Plans, reserves the file (a full disk fails here, naming it, with the state
  // untouched), writes the paged units' state into it and frees it from RAM.
  // Throws naming --state-dir / --max-host-memory (with the minimum) and the fix.
  StateTier(HostState& s, const TierOptions& o);
  ~StateTier();  // finishes the I/O in flight; units left paged out stay so (the state is then unusable)
  StateTier(const StateTier&) = delete;
  StateTier& operator=(const StateTier&) = delete;

  const TierPlan& plan() const { return plan_; }
  std::string describe() const;  // one line: bytes per tier, units paged (weights too?), O_DIRECT or not
  const std::string& path() const { return path_; }

  // fn(u) for each u of order with u's state in RAM: the next paged unit is
  // read ahead while fn runs; afterwards u is written back (dirty) or freed.
  void for_each(const std::vector<size_t>& order, const std::function<void(size_t)>& fn, bool dirty = true);
  // The primitives: queue u's read; wait until u's state is in RAM (queues the
  // read when not yet asked); queue u's write-back (dirty) or its release. No-ops
  // on units kept in RAM.
  void prefetch(size_t u);
  // prefetch of the first unit of order[from..] whose state is paged (none: a
  // no-op): the read ahead, past units kept in RAM.
  void prefetch_next_paged(const std::vector<size_t>& order, size_t from);
  void acquire(size_t u);
  void release(size_t u, bool dirty);
  // Every unit's state back in RAM for good (tests, tools), and the tier detached.
  void page_in_all();

  struct Stats {
    uint64_t read_bytes = 0, written_bytes = 0;
    uint64_t paged_in_peak = 0;  // the most paged state in RAM at once
    double wait_s = 0;           // the caller waited this long for reads
    double first_write_s = 0;    // writing the file at start (its rate is the SSD's, as measured here)
  };
  Stats stats() const;

 private:
  struct Buf {
    HostBuffer& (*get)(StateUnit&);  // the unit's buffer (tier_buffers in state_tier.cpp)
    size_t floats;
    uint64_t off, len;  // in the file
  };
  struct Job {
    enum Kind { read, write, drop } kind;
    size_t u;
  };
  void worker();
  void rethrow_locked();

  HostState& s_;
  TierPlan plan_;
  std::string path_;
  DirectFile file_;
  std::vector<std::vector<Buf>> bufs_;  // per unit (paged units only)
  std::vector<char> want_in_;           // main thread's view: a read is queued or done, no release after it
  std::vector<int> pending_;            // jobs queued or running, per unit
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> q_;
  bool stop_ = false;
  std::exception_ptr error_;
  Stats stats_;
  uint64_t paged_in_ = 0;
  // Buffers of units paged out, kept for the next read of the same size (the
  // layers' are all alike): no mapping and faulting in of fresh pages every
  // step. Trimmed so that paged-in + pooled bytes stay within plan_.slots.
  std::vector<HostBuffer> pool_;
  uint64_t pooled_ = 0;
  std::thread thread_;
};

// fn(u) for u in order with each unit's optimizer state in RAM: through the
// state's tier when it has one, else a plain loop.
void for_each_unit_state(HostState& s, const std::vector<size_t>& order, const std::function<void(size_t)>& fn);

}  // namespace rt
