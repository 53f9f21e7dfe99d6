#include "state/host_state.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"

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

HostBuffer::HostBuffer(size_t n_floats, const std::string& what) : n(n_floats) {
  if (n == 0) return;
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  void* q = nullptr;
  if (posix_memalign(&q, 64, bytes) != 0 || !q) {
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
  parallel_for(static_cast<int64_t>(n), 1 << 20, [&](int64_t b, int64_t e) {
    std::memset(p + b, 0, static_cast<size_t>(e - b) * sizeof(float));
  });
}
}  // namespace

HostState::HostState(const ModelSpec& spec, bool with_grads) : spec_(spec), with_grads_(with_grads) {
  spec_.validate("model spec");
  std::vector<WeightEntry> all = weight_map(spec_);
  const int64_t L = spec_.n_layers;
  units_.resize(static_cast<size_t>(L + 2));
  units_[0].name = "embed";
  for (int64_t i = 0; i < L; ++i) units_[static_cast<size_t>(i + 1)].name = cat("layer.", i);
  units_[static_cast<size_t>(L + 1)].name = "head";
  for (auto& e : all) {
    size_t u = e.kind == WeightKind::embed ? 0 : e.layer >= 0 ? static_cast<size_t>(e.layer + 1) : static_cast<size_t>(L + 1);
    StateUnit& su = units_[u];
    su.offsets.push_back(su.numel);
    // keep every tensor 16-float aligned inside the arena (64-byte lines)
    su.numel += (e.numel() + 15) / 16 * 16;
    su.entries.push_back(e);
  }
  uint64_t need = 0;
  for (auto& u : units_) need += static_cast<uint64_t>(u.numel) * 4 * (3 + (with_grads_ ? 1 : 0));
  uint64_t avail = host_memory_available();
  if (avail && need > avail)
    fail("[host] the training state needs ", need / (1 << 20), " MiB of host RAM (", bytes_per_param(),
         " B/param) but only ", avail / (1 << 20), " MiB are available. Use a smaller model or free memory.");
  for (size_t u = 0; u < units_.size(); ++u) {
    StateUnit& su = units_[u];
    su.arena = HostBuffer(static_cast<size_t>(3 * su.numel), cat("the ", su.name, " master weights and Adam moments"));
    zero_parallel(su.arena.p, su.arena.n);  // first touch on every core: large states fault in faster
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
  for (auto& u : units_) b += (u.arena.n + u.grad.n) * sizeof(float);
  return b;
}

double HostState::bytes_per_param() const { return 12.0 + (with_grads_ ? 4.0 : 0.0); }

const HostState::Loc& HostState::locate(const std::string& name) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), name, [](auto& a, const std::string& n) { return a.first < n; });
  if (it == index_.end() || it->first != name) fail("[host] no tensor named ", name, " in this model");
  return it->second;
}

float* HostState::master(const std::string& name) const {
  const Loc& l = locate(name);
  return units_[l.unit].master() + l.offset;
}

float* HostState::grad(const std::string& name) const {
  RT_CHECK(with_grads_, "[host] gradients were not allocated");
  const Loc& l = locate(name);
  return units_[l.unit].grad.p + l.offset;
}

namespace {

// splitmix64: counter-based, so any element's value depends only on (seed, tensor, index).
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline double uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

void HostState::init_random(uint64_t seed, float std) {
  uint64_t tensor_id = 0;
  for (auto& u : units_) {
    for (size_t k = 0; k < u.entries.size(); ++k, ++tensor_id) {
      const WeightEntry& e = u.entries[k];
      float* p = u.master() + u.offsets[k];
      const int64_t n = e.numel();
      const bool is_norm = e.kind == WeightKind::attn_norm || e.kind == WeightKind::mlp_norm ||
                           e.kind == WeightKind::final_norm || e.kind == WeightKind::q_norm ||
                           e.kind == WeightKind::k_norm;
      if (e.is_norm_or_bias) {
        std::fill(p, p + n, is_norm ? 1.0f : 0.0f);
        continue;
      }
      const uint64_t base = mix64(seed ^ mix64(tensor_id + 0x1234567ull));
      // Box-Muller on pairs (2j, 2j+1): element i uses counter i/2.
      parallel_for(n, 1 << 16, [&](int64_t b, int64_t end) {
        for (int64_t i = b; i < end; ++i) {
          uint64_t c = static_cast<uint64_t>(i >> 1);
          double u1 = uniform01(mix64(base + 2 * c)), u2 = uniform01(mix64(base + 2 * c + 1));
          double r = std::sqrt(-2.0 * std::log(u1));
          double z = (i & 1) ? r * std::sin(2 * M_PI * u2) : r * std::cos(2 * M_PI * u2);
          p[i] = static_cast<float>(z * std);
        }
      });
    }
  }
}

void HostState::ensure_grads() {
  if (with_grads_) return;
  uint64_t need = 0;
  for (auto& u : units_) need += static_cast<uint64_t>(u.numel) * 4;
  uint64_t avail = host_memory_available();
  if (avail && need > avail)
    fail("[host] host gradients need ", need >> 20, " MiB more host RAM but only ", avail >> 20,
         " MiB are available. Keep gradients on the GPU (--grads device) or use a smaller model.");
  for (auto& u : units_) {
    u.grad = HostBuffer(static_cast<size_t>(u.numel), cat("the ", u.name, " gradients"));
    zero_parallel(u.grad.p, u.grad.n);
  }
  with_grads_ = true;
}

void HostState::zero_grads() {
  for (auto& u : units_)
    if (u.grad.p) zero_parallel(u.grad.p, u.grad.n);
}

void HostState::zero_moments() {
  for (auto& u : units_) std::memset(u.m(), 0, 2 * static_cast<size_t>(u.numel) * sizeof(float));
}

namespace {

template <class P>
BlockWeightsT<float> block_view(const ModelSpec& s, int64_t i, P get) {
  auto name = [&](const char* suffix) { return cat("model.layers.", i, ".", suffix); };
  BlockWeightsT<float> w{};
  w.attn_norm = get(name("input_layernorm.weight"));
  w.q_proj = get(name("self_attn.q_proj.weight"));
  w.k_proj = get(name("self_attn.k_proj.weight"));
  w.v_proj = get(name("self_attn.v_proj.weight"));
  if (s.qkv_bias) {
    w.q_bias = get(name("self_attn.q_proj.bias"));
    w.k_bias = get(name("self_attn.k_proj.bias"));
    w.v_bias = get(name("self_attn.v_proj.bias"));
  }
  if (s.qk_norm) {
    w.q_norm = get(name("self_attn.q_norm.weight"));
    w.k_norm = get(name("self_attn.k_norm.weight"));
  }
  w.o_proj = get(name("self_attn.o_proj.weight"));
  w.mlp_norm = get(name("post_attention_layernorm.weight"));
  w.gate_proj = get(name("mlp.gate_proj.weight"));
  w.up_proj = get(name("mlp.up_proj.weight"));
  w.down_proj = get(name("mlp.down_proj.weight"));
  return w;
}

}  // namespace

ModelWeightsT<float> HostState::weights() const {
  ModelWeightsT<float> w;
  auto get = [&](const std::string& n) -> const float* { return master(n); };
  w.embed = get("model.embed_tokens.weight");
  for (int64_t i = 0; i < spec_.n_layers; ++i) w.layers.push_back(block_view(spec_, i, get));
  w.final_norm = get("model.norm.weight");
  w.lm_head = spec_.tie_embeddings ? w.embed : get("lm_head.weight");
  return w;
}

ModelGrads HostState::grads() const {
  ModelGrads g;
  auto get = [&](const std::string& n) -> const float* { return grad(n); };
  auto mut = [](const float* p) { return const_cast<float*>(p); };
  g.embed = grad("model.embed_tokens.weight");
  for (int64_t i = 0; i < spec_.n_layers; ++i) {
    BlockWeightsT<float> v = block_view(spec_, i, get);
    g.layers.push_back(BlockGrads{mut(v.attn_norm), mut(v.q_proj), mut(v.q_bias), mut(v.k_proj), mut(v.k_bias),
                                  mut(v.v_proj), mut(v.v_bias), mut(v.q_norm), mut(v.k_norm), mut(v.o_proj),
                                  mut(v.mlp_norm), mut(v.gate_proj), mut(v.up_proj), mut(v.down_proj)});
  }
  g.final_norm = grad("model.norm.weight");
  g.lm_head = spec_.tie_embeddings ? g.embed : grad("lm_head.weight");
  return g;
}

}  // namespace rt
