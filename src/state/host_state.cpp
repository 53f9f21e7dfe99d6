#include "state/host_state.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "state/state_tier.h"

namespace rt {

uint64_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t val;
  std::string unit;
  while (f >> key >> val >> unit)
    if (key == "MemAvailable:") return val * 1024;
  return 0;
}

HostBuffer::HostBuffer(size_t n_floats, const std::string& what, size_t align) : n(n_floats) {
  if (n == 0) return;
  size_t bytes = (n * sizeof(float) + align - 1) / align * align;
  void* q = nullptr;
  if (posix_memalign(&q, align, bytes) != 0 || !q) {
    uint64_t avail = host_memory_available();
    fail("[host] cannot allocate ", bytes, " bytes (", bytes / (1 << 20), " MiB) for ", what, "; ",
         avail ? cat(avail / (1 << 20), " MiB available") : std::string("available memory unknown"),
         ". Use a smaller model, or free host memory.");
  }
  p = static_cast<float*>(q);
}

HostBuffer::~HostBuffer() { std::free(p); }

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    std::free(p);
    p = o.p;
    n = o.n;
    o.p = nullptr;
    o.n = 0;
  }
  return *this;
}

namespace {
void zero_parallel(float* p, size_t n) {
  parallel_for(static_cast<int64_t>(n), 1 << 20,
               [&](int64_t b, int64_t e) { std::memset(p + b, 0, static_cast<size_t>(e - b) * sizeof(float)); });
}
}  // namespace

namespace {
void unit_rebuild(StateUnit& u, MasterStorage ms, int shadows, MomentStorage mo, const float* x, const float* mv);
void moments_store(StateUnit& u, const float* mv);
HostBuffer unit_moments(const StateUnit& u);
}  // namespace

namespace {
// Lays out u for rule: Muon units pack v with the other tensors' only (v_off, nv).
void unit_set_rule(StateUnit& u, UpdateRule rule) {
  u.muon = rule == UpdateRule::muon;
  u.v_off.assign(u.entries.size(), -1);
  u.nv = 0;
  if (u.muon)
    for (size_t k = 0; k < u.entries.size(); ++k)
      if (!muon_matrix(u.entries[k])) {
        u.v_off[k] = u.nv;
        u.nv += (u.entries[k].numel() + 15) / 16 * 16;  // 16-float aligned, as in the arena
      }
}
}  // namespace

HostState::HostState(const ModelSpec& spec, bool with_grads, MomentStorage moments, MasterStorage master,
                     UpdateRule rule)
    : spec_(spec), with_grads_(with_grads) {
  spec_.validate("model spec");
  std::vector<WeightEntry> all = weight_map(spec_);
  const int64_t L = spec_.n_layers;
  units_.resize(static_cast<size_t>(L + 2));
  units_[0].name = "embed";
  for (int64_t i = 0; i < L; ++i) units_[static_cast<size_t>(i + 1)].name = cat("layer.", i);
  units_[static_cast<size_t>(L + 1)].name = "head";
  for (auto& e : all) {
    size_t u = e.kind == WeightKind::embed ? 0
               : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                           : static_cast<size_t>(L + 1);
    StateUnit& su = units_[u];
    su.offsets.push_back(su.numel);
    // keep every tensor 16-float aligned inside the arena (64-byte lines)
    su.numel += (e.numel() + 15) / 16 * 16;
    su.entries.push_back(e);
  }
  const bool lean = moments != MomentStorage::fp32 || master != MasterStorage::fp32 || rule == UpdateRule::muon;
  const uint64_t need = planned_bytes(spec_, master, master == MasterStorage::fp32 ? 0 : 1, with_grads_, moments);
  uint64_t avail = host_memory_available();
  if (avail && need > avail)
    fail("[host] the training state needs ", need / (1 << 20), " MiB of host RAM (",
         static_cast<double>(need) / static_cast<double>(spec_.params_total()), " B/param) but only ",
         avail / (1 << 20),
         " MiB are available. Use a smaller model, a leaner state (--optimizer adamw8bit|adamw4bit, "
         "--master bf16-sr) or free memory.");
  for (size_t u = 0; u < units_.size(); ++u) {
    StateUnit& su = units_[u];
    su.index = static_cast<int64_t>(u);
    unit_set_rule(su, rule);
    if (lean) {  // zeros in the asked storages (peak: the state plus one unit's fp32 master and moments)
      HostBuffer zero(static_cast<size_t>(3 * su.numel), cat("the ", su.name, " initial values"));
      zero_parallel(zero.p, zero.n);
      unit_rebuild(su, master, 1, moments, zero.p, zero.p + su.numel);
    } else {
      su.arena =
          HostBuffer(static_cast<size_t>(3 * su.numel), cat("the ", su.name, " master weights and Adam moments"));
      zero_parallel(su.arena.p, su.arena.n);  // first touch on every core: large states fault in faster
    }
    if (with_grads_) {
      su.grad = HostBuffer(static_cast<size_t>(su.numel), cat("the ", su.name, " gradients"));
      zero_parallel(su.grad.p, su.grad.n);
    }
    for (size_t k = 0; k < su.entries.size(); ++k) index_.push_back({su.entries[k].name, Loc{u, su.offsets[k]}});
  }
  std::sort(index_.begin(), index_.end(), [](auto& a, auto& b) { return a.first < b.first; });
}

int64_t HostState::n_params() const {
  int64_t n = 0;
  for (auto& u : units_)
    for (auto& e : u.entries) n += e.numel();
  return n;
}

uint64_t HostState::bytes_total() const {
  uint64_t b = 0;
  for (auto& u : units_)
    b += (u.arena.n + u.grad.n + u.shadow_buf[0].n + u.shadow_buf[1].n + u.rem_buf.n + u.tie_buf.n + u.qm_buf.n +
          u.qv_buf.n + u.qscale_buf.n + u.mv_buf.n) *
         sizeof(float);
  return b;
}

double HostState::bytes_per_param() const {
  return static_cast<double>(bytes_total()) / static_cast<double>(n_params());
}

const char* master_storage_name(MasterStorage s) {
  switch (s) {
    case MasterStorage::fp32:
      return "fp32";
    case MasterStorage::split:
      return "split";
    case MasterStorage::bf16_sr:
      return "bf16-sr";
    case MasterStorage::bf16_kahan:
      return "bf16-kahan";
  }
  return "unknown";
}

namespace {
// Floats of the buffers of one split unit of n elements.
size_t shadow_floats(int64_t n) { return static_cast<size_t>(n + 1) / 2; }
size_t tie_floats(int64_t n) { return static_cast<size_t>(split_master_tie_words(n)) * 2; }
size_t code_floats(MomentStorage s, int64_t n) { return static_cast<size_t>(quant_code_bytes(s, n) + 3) / 4; }
// Bytes a HostBuffer of f floats holds (its rounding to the alignment a aside,
// as bytes_total counts: at most a page per buffer).
uint64_t buf_bytes(size_t f, uint64_t /*a*/) { return static_cast<uint64_t>(f) * 4; }
constexpr size_t kPageAlign = 4096;
}  // namespace

uint64_t HostState::planned_bytes(const ModelSpec& spec, MasterStorage storage, int shadows, bool host_grads,
                                  MomentStorage moments, UpdateRule rule) {
  // the unit layout of the constructor: every tensor padded to 16 floats; v packed under Muon
  std::vector<int64_t> numel, vlen;
  const int64_t L = spec.n_layers;
  numel.assign(static_cast<size_t>(L + 2), 0);
  vlen.assign(static_cast<size_t>(L + 2), 0);
  for (auto& e : weight_map(spec)) {
    size_t u = e.kind == WeightKind::embed ? 0
               : e.layer >= 0              ? static_cast<size_t>(e.layer + 1)
                                           : static_cast<size_t>(L + 1);
    numel[u] += (e.numel() + 15) / 16 * 16;
    if (rule == UpdateRule::adamw || !muon_matrix(e)) vlen[u] += (e.numel() + 15) / 16 * 16;
  }
  const bool in_shadow = storage != MasterStorage::fp32;
  uint64_t b = 0;
  for (size_t i = 0; i < numel.size(); ++i) {
    const int64_t n = numel[i], nv = vlen[i];
    const uint64_t un = static_cast<uint64_t>(n);
    const size_t arena = static_cast<size_t>((in_shadow ? 0 : n) + (moments == MomentStorage::fp32 ? n + nv : 0));
    b += buf_bytes(arena, 64);
    if (moments != MomentStorage::fp32)
      b += buf_bytes(code_floats(moments, n), 64) + buf_bytes(code_floats(moments, nv), 64) +
           buf_bytes(static_cast<size_t>(quant_blocks(n) + quant_blocks(nv)), 64);
    b += static_cast<uint64_t>(shadows) * (in_shadow ? buf_bytes(shadow_floats(n), kPageAlign) : un * 2);
    if (storage == MasterStorage::split) b += buf_bytes(shadow_floats(n), 64) + buf_bytes(tie_floats(n), 64);
    if (storage == MasterStorage::bf16_kahan) b += buf_bytes(shadow_floats(n), 64);
    if (host_grads) b += buf_bytes(static_cast<size_t>(n), 64);
  }
  return b;
}

void StateUnit::check_weights_in_ram() const {
  RT_CHECK(!(paged_out && weights_paged), "[host] unit ", name,
           ": its weights are in the state tier's file (--state-dir), not in RAM: page it in first (StateTier)");
}

float* StateUnit::master() const {
  RT_CHECK(!shadow_master(), "[host] unit ", name, " holds a ", master_storage_name(master_kind),
           " master: no fp32 copy to point into (use read_master)");
  check_weights_in_ram();
  return arena.p;
}

float* StateUnit::m() const {
  RT_CHECK(!weights_only, "[host] unit ", name,
           " holds weights only (a data-parallel rank's: its moments are in the rank's shards)");
  RT_CHECK(!quantized(), "[host] unit ", name, " holds ", moment_storage_name(moments),
           " (quantized) moments: no fp32 m, v to point into");
  RT_CHECK(!paged_out, "[host] unit ", name,
           ": its optimizer state is in the state tier's file (--state-dir), not "
           "in RAM: page it in first (StateTier)");
  if (moments_apart) return mv_buf.p;
  return arena.p + (shadow_master() ? 0 : numel);
}

void StateUnit::read_master(int64_t b, int64_t n, float* out) const {
  RT_CHECK(0 <= b && n >= 0 && b + n <= numel, "[host] range outside unit ", name);
  check_weights_in_ram();
  if (!shadow_master()) {
    std::memcpy(out, arena.p + b, static_cast<size_t>(n) * 4);
    return;
  }
  if (split()) {
    RT_CHECK(!paged_out, "[host] unit ", name,
             ": its master remainder is in the state tier's file (--state-dir); "
             "page it in first (StateTier)");
    return split_master_decode(split_master(cur_shadow).at(b), n, out);
  }
  const uint16_t* s = shadow(cur_shadow) + b;
  parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = bf16_to_f32(s[i]);
  });
}

void StateUnit::write_master(int64_t b, int64_t n, const float* in) {
  RT_CHECK(0 <= b && n >= 0 && b + n <= numel, "[host] range outside unit ", name);
  check_weights_in_ram();
  if (!shadow_master()) {
    std::memcpy(arena.p + b, in, static_cast<size_t>(n) * 4);
    return;
  }
  if (split()) {
    split_master_encode(in, n, split_master(cur_shadow).at(b));
  } else {  // bf16: round to nearest; Kahan: the compensation holds the rounding error (exact sum = shadow - comp)
    uint16_t* s = shadow(cur_shadow) + b;
    uint16_t* c = master_kind == MasterStorage::bf16_kahan ? comp() + b : nullptr;
    parallel_for(n, 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        s[i] = f32_to_bf16(in[i]);
        if (c) c[i] = f32_to_bf16(bf16_to_f32(s[i]) - in[i]);
      }
    });
  }
  for (int k = 0; k < n_shadows; ++k)
    if (k != cur_shadow) std::memcpy(shadow(k) + b, shadow(cur_shadow) + b, static_cast<size_t>(n) * 2);
}

namespace {

// Rebuilds u's buffers for master storage `ms` (shadows: its count) and moment
// storage `mo`, given its current master x and fp32 moments mv ([m | v], 2n);
// mv nullptr: the moments are quantized as `mo` already and stay as they are.
void unit_rebuild(StateUnit& u, MasterStorage ms, int shadows, MomentStorage mo, const float* x, const float* mv) {
  const int64_t n = u.numel;
  const bool in_shadow = ms != MasterStorage::fp32;
  const size_t arena = static_cast<size_t>((in_shadow ? 0 : n) + (mo == MomentStorage::fp32 ? n + u.v_len() : 0));
  u.arena = HostBuffer(arena, cat("the ", u.name, " master weights and Adam moments"));
  for (auto& sb : u.shadow_buf) sb = HostBuffer();
  u.rem_buf = HostBuffer();
  u.tie_buf = HostBuffer();
  u.master_kind = ms;
  u.moments = mo;
  u.n_shadows = in_shadow ? shadows : 0;
  u.cur_shadow = 0;
  for (int k = 0; k < u.n_shadows; ++k)
    u.shadow_buf[k] = HostBuffer(shadow_floats(n), cat("a bf16 shadow of ", u.name), kPageAlign);
  if (ms == MasterStorage::split || ms == MasterStorage::bf16_kahan)
    u.rem_buf =
        HostBuffer(shadow_floats(n),
                   cat("the ", u.name, ms == MasterStorage::split ? " master remainder" : " Kahan compensation"));
  if (ms == MasterStorage::split) {
    u.tie_buf = HostBuffer(tie_floats(n), cat("the ", u.name, " master tie bits"));
    zero_parallel(u.tie_buf.p, u.tie_buf.n);
  }
  u.write_master(0, n, x);
  if (!mv) return;
  u.qm_buf = HostBuffer();
  u.qv_buf = HostBuffer();
  u.qscale_buf = HostBuffer();
  if (mo != MomentStorage::fp32) {
    u.qm_buf = HostBuffer(code_floats(mo, n), cat("the ", u.name, " quantized Adam m"));
    u.qv_buf = HostBuffer(code_floats(mo, u.v_len()), cat("the ", u.name, " quantized Adam v"));
    u.qscale_buf = HostBuffer(static_cast<size_t>(quant_blocks(n) + quant_blocks(u.v_len())),
                              cat("the ", u.name, " moment scales"));
  }
  moments_store(u, mv);
}

// u's v packed (Muon units) from / into the unit layout (numel floats; a Muon matrix's v reads as 0).
void v_pack(const StateUnit& u, const float* full, float* packed) {
  std::memset(packed, 0, static_cast<size_t>(u.v_len()) * 4);
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (u.v_at(k) >= 0)
      std::memcpy(packed + u.v_at(k), full + u.offsets[k], static_cast<size_t>(u.entries[k].numel()) * 4);
}
void v_unpack(const StateUnit& u, const float* packed, float* full) {
  std::memset(full, 0, static_cast<size_t>(u.numel) * 4);
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (u.v_at(k) >= 0)
      std::memcpy(full + u.offsets[k], packed + u.v_at(k), static_cast<size_t>(u.entries[k].numel()) * 4);
}

void encode_all(MomentStorage mo, bool signed_code, const float* x, int64_t n, uint8_t* codes, float* scales,
                bool muon) {
  parallel_for(quant_blocks(n), 64, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t first = blk * kQuantBlock, k = std::min(kQuantBlock, n - first);
      quant_block_encode(mo, signed_code, QuantRounding::nearest, 0, x + first, k, codes, first, scales + blk, muon);
    }
  });
}

// Stores fp32 moments mv ([m | v], 2 numel, the unit layout) into u's moment storage (quantized: nearest).
void moments_store(StateUnit& u, const float* mv) {
  const int64_t n = u.numel, nv = u.v_len();
  const MomentStorage mo = u.moments;
  std::vector<float> packed;
  const float* v = mv + n;
  if (u.muon) {
    packed.resize(static_cast<size_t>(nv));
    v_pack(u, mv + n, packed.data());
    v = packed.data();
  }
  if (mo == MomentStorage::fp32) {
    copy_parallel(u.m(), mv, static_cast<size_t>(n) * 4);
    copy_parallel(u.v(), v, static_cast<size_t>(nv) * 4);
    return;
  }
  encode_all(mo, true, mv, n, u.qm(), u.scale_m(), u.muon);
  encode_all(mo, false, v, nv, u.qv(), u.scale_v(), u.muon);
}

// u's current moments as fp32 [m | v] (quantized: decoded).
HostBuffer unit_moments(const StateUnit& u) {
  const int64_t n = u.numel, nv = u.v_len();
  HostBuffer mv(static_cast<size_t>(2 * n), cat("a copy of the ", u.name, " Adam moments"));
  std::vector<float> packed(u.muon ? static_cast<size_t>(nv) : 0);
  float* v = u.muon ? packed.data() : mv.p + n;
  if (!u.quantized()) {
    copy_parallel(mv.p, u.m(), static_cast<size_t>(n) * 4);
    copy_parallel(v, u.v(), static_cast<size_t>(nv) * 4);
  } else {
    quant_decode(u.moments, true, u.qm(), u.scale_m(), n, mv.p, u.muon);
    quant_decode(u.moments, false, u.qv(), u.scale_v(), nv, v, u.muon);
  }
  if (u.muon) v_unpack(u, packed.data(), mv.p + n);
  return mv;
}

}  // namespace

void HostState::set_master_storage(MasterStorage s, int n_shadows) {
  RT_CHECK(!tier_, "[host] the storage of a state paged by --state-dir cannot change (convert before the tier starts)");
  RT_CHECK(s == MasterStorage::fp32 || n_shadows == 1 || n_shadows == 2, "[host] a ", master_storage_name(s),
           " master has 1 or 2 shadows, not ", n_shadows);
  decoded_.clear();
  for (StateUnit& u : units_) {
    const int want = s == MasterStorage::fp32 ? 0 : n_shadows;
    if (u.master_kind == s && u.n_shadows == want) continue;
    if (u.master_kind == s) {  // the shadow count changes: the current shadow becomes shadow 0, copied to shadow 1
      if (u.cur_shadow != 0) std::swap(u.shadow_buf[0], u.shadow_buf[u.cur_shadow]);
      u.cur_shadow = 0;
      if (want == 2 && !u.shadow_buf[1].p)
        u.shadow_buf[1] = HostBuffer(shadow_floats(u.numel), cat("a bf16 shadow of ", u.name), kPageAlign);
      if (want == 1) u.shadow_buf[1] = HostBuffer();
      if (want == 2) copy_parallel(u.shadow(1), u.shadow(0), static_cast<size_t>(u.numel) * 2);
      u.n_shadows = want;
      continue;
    }
    HostBuffer x(static_cast<size_t>(u.numel), cat("a copy of the ", u.name, " master"));
    if (u.shadow_master())
      u.read_master(0, u.numel, x.p);
    else
      copy_parallel(x.p, u.master(), static_cast<size_t>(u.numel) * 4);
    HostBuffer mv;
    if (!u.quantized()) mv = unit_moments(u);  // quantized moments stay as they are
    unit_rebuild(u, s, want, u.moments, x.p, mv.p);
  }
}

void HostState::set_moment_storage(MomentStorage s) {
  RT_CHECK(!tier_, "[host] the storage of a state paged by --state-dir cannot change (convert before the tier starts)");
  decoded_.clear();
  for (StateUnit& u : units_) {
    if (u.moments == s) continue;
    HostBuffer mv = unit_moments(u);
    HostBuffer x(static_cast<size_t>(u.numel), cat("a copy of the ", u.name, " master"));
    u.read_master(0, u.numel, x.p);
    HostBuffer comp;  // a Kahan compensation survives the rebuild
    if (u.master_kind == MasterStorage::bf16_kahan) comp = std::move(u.rem_buf);
    const int shadows = u.n_shadows;
    unit_rebuild(u, u.master_kind, shadows, s, x.p, mv.p);
    if (comp.p) u.rem_buf = std::move(comp);
  }
}

void HostState::keep_weights_only(size_t k) {
  RT_CHECK(!tier_, "[host] the storage of a state paged by --state-dir cannot change (convert before the tier starts)");
  RT_CHECK(k < units_.size(), "[host] no unit ", k);
  StateUnit& u = units_[k];
  if (u.weights_only) return;
  decoded_.clear();
  HostBuffer sh(shadow_floats(u.numel), cat("the bf16 weights of ", u.name), kPageAlign);
  uint16_t* d = reinterpret_cast<uint16_t*>(sh.p);
  if (u.shadow_master() && u.n_shadows > 0 && u.master_kind != MasterStorage::bf16_kahan) {
    // split or bf16-sr: the current shadow is the master rounded to nearest (split) or the master itself
    copy_parallel(d, u.shadow(u.cur_shadow), static_cast<size_t>(u.numel) * 2);
  } else {  // fp32, or bf16-kahan (decoded first: read_master is parallel itself, and the pool is not reentrant)
    HostBuffer x;
    const float* xs = u.shadow_master() ? nullptr : u.master();
    if (!xs) {
      x = HostBuffer(static_cast<size_t>(u.numel), cat("a copy of the ", u.name, " master"));
      u.read_master(0, u.numel, x.p);
      xs = x.p;
    }
    parallel_for(u.numel, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = f32_to_bf16(xs[i]);
    });
  }
  u.arena = HostBuffer();
  u.grad = HostBuffer();
  u.shadow_buf[1] = HostBuffer();
  u.rem_buf = HostBuffer();
  u.tie_buf = HostBuffer();
  u.qm_buf = HostBuffer();
  u.qv_buf = HostBuffer();
  u.qscale_buf = HostBuffer();
  u.shadow_buf[0] = std::move(sh);
  u.master_kind = MasterStorage::bf16_sr;
  u.moments = MomentStorage::fp32;  // none held here (the shards' are fp32); no quantized buffers to point into
  u.n_shadows = 1;
  u.cur_shadow = 0;
  u.weights_only = true;
}

const HostState::Loc& HostState::locate(const std::string& name) const {
  auto it =
      std::lower_bound(index_.begin(), index_.end(), name, [](auto& a, const std::string& n) { return a.first < n; });
  if (it == index_.end() || it->first != name) fail("[host] no tensor named ", name, " in this model");
  return it->second;
}

float* HostState::master(const std::string& name) const {
  const Loc& l = locate(name);
  return units_[l.unit].master() + l.offset;
}

void HostState::read_master(const std::string& name, float* out) const {
  const Loc& l = locate(name);
  const StateUnit& u = units_[l.unit];
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (u.offsets[k] == l.offset) return u.read_master(l.offset, u.entries[k].numel(), out);
}

void HostState::write_master(const std::string& name, const float* in) {
  const Loc& l = locate(name);
  StateUnit& u = units_[l.unit];
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (u.offsets[k] == l.offset) return u.write_master(l.offset, u.entries[k].numel(), in);
}

float* HostState::view(const std::string& name) const {
  const Loc& l = locate(name);
  const StateUnit& u = units_[l.unit];
  if (!u.shadow_master() && !(tier_ && tier_->plan().weights_paged)) return u.master() + l.offset;
  RT_CHECK(l.unit < decoded_.size() && decoded_[l.unit].p, "[host] ", name,
           ": the shadow (or paged) master was not decoded");
  return decoded_[l.unit].p + l.offset;
}

float* HostState::grad(const std::string& name) const {
  RT_CHECK(with_grads_, "[host] gradients were not allocated");
  const Loc& l = locate(name);
  return units_[l.unit].grad.p + l.offset;
}

void HostState::ensure_grads() {
  if (with_grads_) return;
  uint64_t need = 0;
  for (auto& u : units_) need += static_cast<uint64_t>(u.numel) * 4;
  uint64_t avail = host_memory_available();
  if (avail && need > avail)
    fail("[host] host gradients need ", need >> 20, " MiB more host RAM but only ", avail >> 20,
         " MiB are available. Keep gradients on the GPU (--grads device)",
         master_storage() == MasterStorage::fp32 ? ", store the master split (--master split: 1.875 B/param less)" : "",
         " or use a smaller model.");
  for (auto& u : units_) {
    u.grad = HostBuffer(static_cast<size_t>(u.numel), cat("the ", u.name, " gradients"));
    zero_parallel(u.grad.p, u.grad.n);
  }
  with_grads_ = true;
}

void HostState::ensure_unit_grad(size_t u) {
  StateUnit& un = units_.at(u);
  if (un.grad.p) return;
  const uint64_t need = static_cast<uint64_t>(un.numel) * 4, avail = host_memory_available();
  if (avail && need > avail)
    fail("[host] the ", un.name, " gradient needs ", need >> 20, " MiB of host RAM but only ", avail >> 20,
         " MiB are available; use a smaller model");
  un.grad = HostBuffer(static_cast<size_t>(un.numel), cat("the ", un.name, " gradients"));
  zero_parallel(un.grad.p, un.grad.n);
}

void HostState::zero_grads() {
  for (auto& u : units_)
    if (u.grad.p) zero_parallel(u.grad.p, u.grad.n);
}

bool muon_matrix(const WeightEntry& e) {
  switch (e.kind) {
    case WeightKind::q_proj:
    case WeightKind::k_proj:
    case WeightKind::v_proj:
    case WeightKind::o_proj:
    case WeightKind::gate_proj:
    case WeightKind::up_proj:
    case WeightKind::down_proj:
    case WeightKind::expert_gate:
    case WeightKind::expert_up:
    case WeightKind::expert_down:
      return e.shape.size() == 2;
    default:
      return false;
  }
}

const char* update_rule_name(UpdateRule r) { return r == UpdateRule::muon ? "muon" : "adamw"; }

const char* optimizer_name(UpdateRule r, MomentStorage m) {
  if (r == UpdateRule::adamw) return moment_storage_name(m);
  return m == MomentStorage::fp32 ? "muon" : m == MomentStorage::q8 ? "muon8bit" : "muon4bit";
}

void HostState::set_update_rule(UpdateRule r) {
  RT_CHECK(!tier_, "[host] the storage of a state paged by --state-dir cannot change (convert before the tier starts)");
  const bool muon = r == UpdateRule::muon;
  decoded_.clear();
  for (StateUnit& u : units_) {
    if (u.muon == muon) continue;
    HostBuffer mv = unit_moments(u);  // [m | v] in the unit layout; the matrices' zeroed
    for (size_t k = 0; k < u.entries.size(); ++k)
      if (muon_matrix(u.entries[k])) {
        const size_t n = static_cast<size_t>(u.entries[k].numel());
        zero_parallel(mv.p + u.offsets[k], n);
        zero_parallel(mv.p + u.numel + u.offsets[k], n);
      }
    unit_set_rule(u, r);
    HostBuffer x(static_cast<size_t>(u.numel), cat("a copy of the ", u.name, " master"));
    u.read_master(0, u.numel, x.p);
    HostBuffer comp;  // a Kahan compensation survives the rebuild
    if (u.master_kind == MasterStorage::bf16_kahan) comp = std::move(u.rem_buf);
    const int shadows = u.n_shadows;
    unit_rebuild(u, u.master_kind, shadows, u.moments, x.p, mv.p);
    if (comp.p) u.rem_buf = std::move(comp);
  }
}

void HostState::zero_moments() {
  for (auto& u : units_) {
    if (!u.quantized()) {
      std::memset(u.m(), 0, static_cast<size_t>(u.numel + u.v_len()) * sizeof(float));
      continue;
    }
    for (HostBuffer* b : {&u.qm_buf, &u.qv_buf, &u.qscale_buf}) std::memset(b->p, 0, b->n * sizeof(float));
  }
}

}  // namespace rt
