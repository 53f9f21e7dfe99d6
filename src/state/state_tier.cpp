#include "state/state_tier.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"
#include "model/weight_map.h"

namespace rt {

namespace {

std::string mib(uint64_t b) { return cat((b + (1 << 20) - 1) >> 20, " MiB"); }

using BufGet = HostBuffer& (*)(StateUnit&);

// The buffers of u that hold its optimizer state, with their lengths in floats;
// with weights, its weights' too (the fp32 master, after moments_apart the
// whole arena; a shadow master's shadows), which the forward and backward read.
std::vector<std::pair<BufGet, size_t>> state_buffers(const StateUnit& u, bool weights = false) {
  std::vector<std::pair<BufGet, size_t>> b;
  if (u.weights_only) return b;
  const size_t n = static_cast<size_t>(u.numel);
  if (weights) {
    if (!u.shadow_master()) b.push_back({[](StateUnit& x) -> HostBuffer& { return x.arena; }, n});
    if (u.n_shadows > 0) b.push_back({[](StateUnit& x) -> HostBuffer& { return x.shadow_buf[0]; }, (n + 1) / 2});
    if (u.n_shadows > 1) b.push_back({[](StateUnit& x) -> HostBuffer& { return x.shadow_buf[1]; }, (n + 1) / 2});
  }
  if (u.quantized()) {
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.qm_buf; },
                 static_cast<size_t>(quant_code_bytes(u.moments, u.numel) + 3) / 4});
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.qv_buf; },
                 static_cast<size_t>(quant_code_bytes(u.moments, u.v_len()) + 3) / 4});
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.qscale_buf; },
                 static_cast<size_t>(quant_blocks(u.numel) + quant_blocks(u.v_len()))});
  } else {
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.mv_buf; }, static_cast<size_t>(u.numel + u.v_len())});
  }
  if (u.master_kind == MasterStorage::split || u.master_kind == MasterStorage::bf16_kahan)
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.rem_buf; }, static_cast<size_t>(u.numel + 1) / 2});
  if (u.master_kind == MasterStorage::split)
    b.push_back({[](StateUnit& x) -> HostBuffer& { return x.tie_buf; },
                 static_cast<size_t>(split_master_tie_words(u.numel)) * 2});
  return b;
}

// Moves u's fp32 [m | v] out of the master's arena into mv_buf (page aligned).
void moments_apart(StateUnit& u) {
  if (u.quantized() || u.moments_apart || u.weights_only) return;
  const size_t n = static_cast<size_t>(u.numel), nmv = n + static_cast<size_t>(u.v_len());
  HostBuffer mv(nmv, cat("the ", u.name, " Adam moments"), kDirectAlign);
  std::memcpy(mv.p, u.m(), nmv * 4);
  if (u.shadow_master()) {
    u.arena = HostBuffer();
  } else {
    HostBuffer a(n, cat("the ", u.name, " master weights"));
    std::memcpy(a.p, u.arena.p, n * 4);
    u.arena = std::move(a);
  }
  u.mv_buf = std::move(mv);
  u.moments_apart = true;
}

}  // namespace

int TierPlan::n_paged() const { return static_cast<int>(std::count(paged.begin(), paged.end(), 1)); }

bool TierPlan::operator==(const TierPlan& o) const {
  return paged == o.paged && weights_paged == o.weights_paged && resident == o.resident && kept == o.kept &&
         slots == o.slots && file_bytes == o.file_bytes && min_bytes == o.min_bytes &&
         min_bytes_resident_weights == o.min_bytes_resident_weights && weight_file_bytes == o.weight_file_bytes &&
         fits == o.fits;
}

namespace {

// The order in which units are offered a place in RAM: the embedding (unit 0)
// first, then the others in bit-reversed order of their index (1, then the
// middle, then the quarters, ...), so that whatever number fits, the units kept
// are spread evenly over the update order and the paged ones between them: the
// SSD then reads and writes while the kept units' gradients land, where a
// block of paged units would leave it idle for one part of the backward and
// stall the other (measured on 14B, docs/architecture.md "State tier").
std::vector<size_t> keep_order(size_t n) {
  std::vector<size_t> order;
  if (n == 0) return order;
  order.push_back(0);
  size_t bits = 0;
  while ((size_t{1} << bits) < n - 1) ++bits;
  for (size_t i = 0; i < (size_t{1} << bits); ++i) {
    size_t r = 0;
    for (size_t b = 0; b < bits; ++b)
      if (i >> b & 1) r |= size_t{1} << (bits - 1 - b);
    if (r < n - 1) order.push_back(r + 1);
  }
  return order;
}

// tier_place with each unit's resident and paged bytes as given.
TierPlan place(const std::vector<TierUnitBytes>& units, uint64_t budget) {
  TierPlan p;
  p.paged.assign(units.size(), 0);
  uint64_t all = 0;
  std::vector<uint64_t> sizes;
  for (const TierUnitBytes& u : units) {
    p.resident += u.resident;
    all += u.paged;
    sizes.push_back(u.paged);
  }
  std::sort(sizes.rbegin(), sizes.rend());
  auto top3 = [](const std::vector<uint64_t>& v) {
    uint64_t t = 0;
    for (size_t i = 0; i < v.size() && i < 3; ++i) t += v[i];
    return t;
  };
  p.min_bytes = p.resident + top3(sizes);
  if (budget && budget >= p.resident + all) {  // everything fits: nothing is paged
    p.kept = all;
    p.min_bytes = std::min(p.min_bytes, p.resident + all);
    return p;
  }
  p.fits = budget == 0 || budget >= p.min_bytes;
  uint64_t left = budget && p.fits ? budget - p.min_bytes : 0;
  std::vector<uint64_t> paged_sizes;
  for (size_t u : keep_order(units.size())) {
    const uint64_t b = units[u].paged;
    if (b == 0 || (budget && p.fits && b <= left)) {
      p.kept += b;
      left -= std::min(left, b);
      continue;
    }
    p.paged[u] = 1;
    p.file_bytes += b;
    paged_sizes.push_back(b);
  }
  std::sort(paged_sizes.rbegin(), paged_sizes.rend());
  p.slots = top3(paged_sizes);
  // the slots reserved for the three largest units of all may be more than the paged ones need: what is left
  // keeps more units (each kept unit leaves the slots as large or smaller)
  if (budget && p.fits)
    for (size_t u : keep_order(units.size())) {
      const uint64_t used = p.resident + p.kept + p.slots;
      if (!p.paged[u] || used + units[u].paged > budget) continue;
      p.paged[u] = 0;
      p.kept += units[u].paged;
      p.file_bytes -= units[u].paged;
      paged_sizes.erase(std::find(paged_sizes.begin(), paged_sizes.end(), units[u].paged));
      p.slots = top3(paged_sizes);
    }
  return p;
}

}  // namespace

TierPlan tier_place(const std::vector<TierUnitBytes>& units, uint64_t budget, bool page_weights) {
  TierPlan p = place(units, budget);
  p.min_bytes_resident_weights = p.min_bytes;
  if (p.fits || budget == 0 || !page_weights) return p;
  std::vector<TierUnitBytes> moved = units;  // the weights page too: RAM keeps the gradients
  for (TierUnitBytes& u : moved) {
    u.resident -= u.weights;
    u.paged += u.weights_paged;
    u.weights = 0;
  }
  TierPlan w = place(moved, budget);
  w.weights_paged = true;
  w.min_bytes_resident_weights = p.min_bytes;
  for (size_t u = 0; u < units.size(); ++u)
    if (w.paged[u]) w.weight_file_bytes += units[u].weights_paged;
  return w;
}

std::vector<TierUnitBytes> tier_unit_bytes_planned(const ModelSpec& spec, MasterStorage master, int shadows,
                                                   bool host_grads, MomentStorage moments, UpdateRule rule) {
  // the unit layout of HostState's constructor: every tensor padded to 16 floats; v packed under Muon
  const int64_t L = spec.n_layers;
  std::vector<int64_t> numel(static_cast<size_t>(L + 2), 0), vlen(static_cast<size_t>(L + 2), 0);
  for (const WeightEntry& e : weight_map(spec)) {
    const size_t u = e.kind == WeightKind::embed ? 0
                     : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                                 : static_cast<size_t>(L + 1);
    numel[u] += (e.numel() + 15) / 16 * 16;
    if (rule == UpdateRule::adamw || !muon_matrix(e)) vlen[u] += (e.numel() + 15) / 16 * 16;
  }
  auto rnd = [](int64_t floats) { return direct_round(static_cast<uint64_t>(floats) * 4); };
  std::vector<TierUnitBytes> out;
  for (size_t i = 0; i < numel.size(); ++i) {
    const int64_t n = numel[i], nv = vlen[i];
    TierUnitBytes b;
    const uint64_t un = static_cast<uint64_t>(n);
    if (master == MasterStorage::fp32) {
      b.resident += 4 * un + static_cast<uint64_t>(shadows) * 2 * un;  // the engine's own shadows: n uint16
      b.weights = 4 * un;                                              // the master (the engine's shadows stay)
      b.weights_paged = rnd(n);
    } else {
      b.resident += b.weights = static_cast<uint64_t>(shadows) * 4 * static_cast<uint64_t>((n + 1) / 2);
      b.weights_paged = static_cast<uint64_t>(shadows) * rnd((n + 1) / 2);
    }
    if (host_grads) b.resident += 4 * un;
    if (moments == MomentStorage::fp32)
      b.paged += rnd(n + nv);
    else
      b.paged += rnd((quant_code_bytes(moments, n) + 3) / 4) + rnd((quant_code_bytes(moments, nv) + 3) / 4) +
                 rnd(quant_blocks(n) + quant_blocks(nv));
    if (master == MasterStorage::split || master == MasterStorage::bf16_kahan) b.paged += rnd((n + 1) / 2);
    if (master == MasterStorage::split) b.paged += rnd(split_master_tie_words(n) * 2);
    out.push_back(b);
  }
  return out;
}

std::vector<TierUnitBytes> tier_unit_bytes(const HostState& s) {
  std::vector<TierUnitBytes> out;
  for (const StateUnit& u : s.units()) {
    TierUnitBytes b;
    size_t arena = u.arena.n;
    if (!u.quantized() && !u.moments_apart && !u.weights_only) arena -= static_cast<size_t>(u.numel + u.v_len());
    b.resident = 4 * static_cast<uint64_t>(arena + u.grad.n + u.shadow_buf[0].n + u.shadow_buf[1].n);
    for (auto& [get, floats] : state_buffers(u)) b.paged += direct_round(static_cast<uint64_t>(floats) * 4);
    if (!u.weights_only) {  // the weights' buffers, as allocated (the fp32 master: the arena less its moments)
      b.weights = 4 * static_cast<uint64_t>(u.shadow_master() ? u.shadow_buf[0].n + u.shadow_buf[1].n : arena);
      for (auto& [get, floats] : state_buffers(u, true))
        b.weights_paged += direct_round(static_cast<uint64_t>(floats) * 4);
      b.weights_paged -= b.paged;
    }
    out.push_back(b);
  }
  return out;
}

StateTier::StateTier(HostState& s, const TierOptions& o) : s_(s) {
  const std::string& w = o.where;
  RT_CHECK(!o.dir.empty(), w, " --state-dir: empty path");
  RT_CHECK(!s.tier(), w, " internal: the state already has a tier");
  if (!is_directory(o.dir))
    fail(w, " --state-dir ", o.dir, ": ", file_exists(o.dir) ? "not a directory" : "no such directory",
         "; create it on a local SSD (mkdir -p) or give another");
  plan_ = tier_place(tier_unit_bytes(s), o.max_host_bytes, o.page_weights);
  // Paged-in buffers come and go every step: glibc's dynamic mmap threshold
  // would move them onto the heap after the first free, where freed memory is
  // not returned and RSS grows step by step. A fixed threshold keeps every
  // large buffer in its own mapping, unmapped when freed.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  const auto mega = [](uint64_t b) { return (b + (1 << 20) - 1) >> 20; };
  if (!plan_.fits && plan_.weights_paged)
    fail(w, " --max-host-memory ", mib(o.max_host_bytes), " is below the ", mib(plan_.min_bytes),
         " the state tier needs with the weights paged too: ", mib(plan_.resident),
         " of gradients stay in RAM, plus the ",
         "weights and optimizer state of the three units in flight (read ahead, updating, writing back); give ",
         "--max-host-memory ", mega(plan_.min_bytes), "M or more");
  if (!plan_.fits)
    fail(w, " --max-host-memory ", mib(o.max_host_bytes), " is below the ", mib(plan_.min_bytes),
         " the state tier needs: ", mib(plan_.resident), " of weights and gradients stay in RAM, plus the optimizer ",
         "state of the three units in flight (read ahead, updating, writing back); give --max-host-memory ",
         mega(plan_.min_bytes), "M or more",
         o.page_weights || o.max_host_bytes == 0
             ? std::string()
             : cat(" (the weights stay in RAM: ", o.weights_stay.empty() ? "this engine keeps them" : o.weights_stay,
                   "; paging them too, the tier would need ",
                   mib(tier_place(tier_unit_bytes(s), o.max_host_bytes, true).min_bytes), ")"));
  path_ = path_join(o.dir, "ramtrain-state.bin");
  file_ = DirectFile(path_, plan_.file_bytes, w, "--state-dir");  // reserved: a full disk fails here, nothing moved
  const size_t U = s.units().size();
  bufs_.resize(U);
  want_in_.assign(U, 0);
  pending_.assign(U, 0);
  uint64_t off = 0, biggest = 0;
  for (size_t u = 0; u < U; ++u) {
    if (!plan_.paged[u]) continue;
    for (auto& [get, floats] : state_buffers(s.units()[u], plan_.weights_paged)) {
      const uint64_t len = direct_round(static_cast<uint64_t>(floats) * 4);
      bufs_[u].push_back(Buf{get, floats, off, len});
      off += len;
      biggest = std::max(biggest, len);
    }
  }
  RT_CHECK(off == plan_.file_bytes, "[host] internal: the state tier's layout (", off, " bytes) is not its plan's (",
           plan_.file_bytes, ")");
  HostBuffer staging(static_cast<size_t>(biggest / 4), "the state tier's write staging", kDirectAlign);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t u = 0; u < U; ++u) {
    if (!plan_.paged[u]) continue;
    StateUnit& su = s.units()[u];
    moments_apart(su);
    for (const Buf& b : bufs_[u]) {
      HostBuffer& hb = b.get(su);
      RT_CHECK(hb.n == b.floats, "[host] internal: unit ", su.name, " holds a buffer of ", hb.n, " floats, not ",
               b.floats);
      std::memcpy(staging.p, hb.p, b.floats * 4);
      std::memset(reinterpret_cast<char*>(staging.p) + b.floats * 4, 0, b.len - b.floats * 4);
      file_.write(b.off, staging.p, b.len);
    }
    for (const Buf& b : bufs_[u]) b.get(su) = HostBuffer();
    su.paged_out = true;
    su.weights_paged = plan_.weights_paged;
  }
  stats_.written_bytes = plan_.file_bytes;
  stats_.first_write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.set_tier(this);
  thread_ = std::thread([this] { worker(); });
}

StateTier::~StateTier() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (s_.tier() == this) s_.set_tier(nullptr);
}

std::string StateTier::describe() const {
  const int n = plan_.n_paged();
  return cat("state tier: ", path_, ": the ", plan_.weights_paged ? "weights and optimizer state" : "optimizer state",
             " of ", n, " of ", plan_.paged.size(), " units (", mib(plan_.file_bytes),
             plan_.weights_paged ? cat(", the weights ", mib(plan_.weight_file_bytes)) : std::string(),
             ") lives there, read and written once a step (", mib(plan_.traffic_per_step()), " of traffic); RAM holds ",
             mib(plan_.ram()), " = ", plan_.weights_paged ? "gradients " : "weights and gradients ",
             mib(plan_.resident), " + the state kept in RAM ", mib(plan_.kept), " + 3 units in flight ",
             mib(plan_.slots), "; ", file_.direct() ? "O_DIRECT" : file_.note(),
             stats_.first_write_s > 0 && plan_.file_bytes >= (uint64_t(64) << 20)
                 ? cat("; written at start at ", static_cast<double>(plan_.file_bytes) / stats_.first_write_s / 1e9,
                       " GB/s (plan --ssd-gbs)")
                 : std::string());
}

void StateTier::rethrow_locked() {
  if (error_) std::rethrow_exception(error_);
}

void StateTier::worker() {
  for (;;) {
    Job j;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      j = q_.front();
      q_.pop_front();
    }
    StateUnit& u = s_.units()[j.u];
    uint64_t bytes = 0;
    for (const Buf& b : bufs_[j.u]) bytes += b.len;
    try {
      if (j.kind == Job::read) {
        std::vector<HostBuffer> got;
        uint64_t reading = 0;  // this unit's bytes so far
        for (const Buf& b : bufs_[j.u]) {
          HostBuffer hb;
          reading += b.len;
          {
            std::lock_guard<std::mutex> l(mu_);
            for (size_t i = 0; i < pool_.size(); ++i)
              if (pool_[i].n == b.floats) {
                hb = std::move(pool_[i]);
                pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
                pooled_ -= b.len;
                break;
              }
            while (!hb.p && !pool_.empty() && paged_in_ + pooled_ + reading > plan_.slots) {  // room for a new one
              pooled_ -= direct_round(static_cast<uint64_t>(pool_.front().n) * 4);
              pool_.erase(pool_.begin());
            }
          }
          if (!hb.p) hb = HostBuffer(b.floats, cat("the ", u.name, " optimizer state paged in"), kDirectAlign);
          file_.read(b.off, hb.p, b.len);
          got.push_back(std::move(hb));
        }
        std::lock_guard<std::mutex> l(mu_);
        for (size_t i = 0; i < got.size(); ++i) bufs_[j.u][i].get(u) = std::move(got[i]);
        u.paged_out = false;
        paged_in_ += bytes;
        stats_.paged_in_peak = std::max(stats_.paged_in_peak, paged_in_);
        stats_.read_bytes += bytes;
      } else {
        if (j.kind == Job::write)
          for (const Buf& b : bufs_[j.u]) file_.write(b.off, b.get(u).p, b.len);
        std::lock_guard<std::mutex> l(mu_);
        for (const Buf& b : bufs_[j.u]) {
          pool_.push_back(std::move(b.get(u)));
          b.get(u) = HostBuffer();
          pooled_ += b.len;
        }
        u.paged_out = true;
        paged_in_ -= bytes;
        while (!pool_.empty() && paged_in_ + pooled_ > plan_.slots) {  // the oldest go first
          pooled_ -= direct_round(static_cast<uint64_t>(pool_.front().n) * 4);
          pool_.erase(pool_.begin());
        }
        if (j.kind == Job::write) stats_.written_bytes += bytes;
      }
    } catch (...) {
      std::lock_guard<std::mutex> l(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      --pending_[j.u];
    }
    cv_.notify_all();
  }
}

void StateTier::prefetch(size_t u) {
  RT_CHECK(u < plan_.paged.size(), "[host] no unit ", u);
  if (!plan_.paged[u]) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    rethrow_locked();
    if (want_in_[u]) return;
    want_in_[u] = 1;
    ++pending_[u];
    q_.push_back(Job{Job::read, u});
  }
  cv_.notify_all();
}

void StateTier::acquire(size_t u) {
  if (u < plan_.paged.size() && !plan_.paged[u]) return;
  prefetch(u);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return pending_[u] == 0 || error_; });
  rethrow_locked();
  stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RT_CHECK(!s_.units()[u].paged_out, "[host] internal: unit ", u, " not paged in");
}

void StateTier::release(size_t u, bool dirty) {
  RT_CHECK(u < plan_.paged.size(), "[host] no unit ", u);
  if (!plan_.paged[u]) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    rethrow_locked();
    RT_CHECK(want_in_[u], "[host] internal: unit ", u, " released but not paged in");
    want_in_[u] = 0;
    ++pending_[u];
    q_.push_back(Job{dirty ? Job::write : Job::drop, u});
  }
  cv_.notify_all();
}

void StateTier::prefetch_next_paged(const std::vector<size_t>& order, size_t from) {
  while (from < order.size() && !(order[from] < plan_.paged.size() && plan_.paged[order[from]])) ++from;
  if (from < order.size()) prefetch(order[from]);
}

void StateTier::for_each(const std::vector<size_t>& order, const std::function<void(size_t)>& fn, bool dirty) {
  if (order.empty()) return;
  // one paged unit read ahead, past the kept ones: in RAM at most the one updating, the one read ahead and the
  // one writing back (the plan's three slots)
  prefetch_next_paged(order, 0);
  for (size_t k = 0; k < order.size(); ++k) {
    prefetch_next_paged(order, k + 1);
    acquire(order[k]);
    fn(order[k]);
    release(order[k], dirty);
  }
}

void StateTier::page_in_all() {
  for (size_t u = 0; u < plan_.paged.size(); ++u) acquire(u);
  std::fill(plan_.paged.begin(), plan_.paged.end(), 0);
  for (StateUnit& u : s_.units()) u.weights_paged = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    pool_.clear();
    pooled_ = 0;
  }
  if (s_.tier() == this) s_.set_tier(nullptr);
}

StateTier::Stats StateTier::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void for_each_unit_state(HostState& s, const std::vector<size_t>& order, const std::function<void(size_t)>& fn) {
  if (StateTier* t = s.tier()) return t->for_each(order, fn);
  for (size_t u : order) fn(u);
}

}  // namespace rt
