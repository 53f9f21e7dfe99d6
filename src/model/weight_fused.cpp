// The fused tensors of HF checkpoints (weight_map.h: fused_tensors,
// hf_weight_map). ramtrain keeps q/k/v and gate/up as separate weights (the
// layer template's contract); loading splits a fused tensor by rows and
// export concatenates the rows again (io/state_tensors.cpp), bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>

#include "core/error.h"
#include "model/weight_map.h"

namespace rt {

namespace {

// gpt-oss's four expert tensors per layer (weight_map.h).
std::vector<FusedTensor> gptoss_fused(const ModelSpec& s) {
  std::vector<FusedTensor> out;
  const int64_t E = s.moe.n_experts, fe = s.moe.expert_intermediate, d = s.hidden;
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".mlp.experts.";
    FusedTensor gu{p + "gate_up_proj", {E, d, 2 * fe}, {}, 2, true};
    FusedTensor gub{p + "gate_up_proj_bias", {E, 2 * fe}, {}, 2, false};
    FusedTensor dn{p + "down_proj", {E, fe, d}, {}, 1, true};
    FusedTensor dnb{p + "down_proj_bias", {E, d}, {}, 1, false};
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + std::to_string(e) + ".";
      gu.parts.push_back(ep + "gate_proj.weight");
      gu.parts.push_back(ep + "up_proj.weight");
      gub.parts.push_back(ep + "gate_proj.bias");
      gub.parts.push_back(ep + "up_proj.bias");
      dn.parts.push_back(ep + "down_proj.weight");
      dnb.parts.push_back(ep + "down_proj.bias");
    }
    out.push_back(std::move(gu));
    if (s.moe.expert_bias) out.push_back(std::move(gub));
    out.push_back(std::move(dn));
    if (s.moe.expert_bias) out.push_back(std::move(dnb));
  }
  return out;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return n;
}

// The elements of f's parts before part k's group.
int64_t group_base(const FusedTensor& f, const std::vector<std::vector<int64_t>>& shapes, size_t k) {
  int64_t base = 0;
  const size_t first = k - k % static_cast<size_t>(f.interleave);
  for (size_t j = 0; j < first; ++j) base += numel_of(shapes[j]);
  return base;
}

}  // namespace

int64_t fused_index(const FusedTensor& f, size_t k, const std::vector<int64_t>& part_shape, int64_t part_base,
                    int64_t i) {
  if (f.plain()) return part_base + i;
  const int64_t R = part_shape.empty() ? 1 : part_shape[0];
  const int64_t K = part_shape.size() > 1 ? part_shape[1] : 1;
  const int64_t r = i / K, c = i % K, w = static_cast<int64_t>(k) % f.interleave;
  return part_base + (f.transpose ? c * R + r : r * K + c) * f.interleave + w;
}

void fused_gather(const FusedTensor& f, const std::vector<std::vector<int64_t>>& part_shapes, size_t k,
                  const float* fused, float* part) {
  const int64_t base = group_base(f, part_shapes, k), n = numel_of(part_shapes[k]);
  if (f.plain()) {
    std::copy(fused + base, fused + base + n, part);
    return;
  }
  for (int64_t i = 0; i < n; ++i) part[i] = fused[fused_index(f, k, part_shapes[k], base, i)];
}

void fused_scatter(const FusedTensor& f, const std::vector<std::vector<int64_t>>& part_shapes, size_t k,
                   const float* part, float* fused) {
  const int64_t base = group_base(f, part_shapes, k), n = numel_of(part_shapes[k]);
  for (int64_t i = 0; i < n; ++i) fused[fused_index(f, k, part_shapes[k], base, i)] = part[i];
}

std::vector<int64_t> mxfp4_fused_shape(const std::vector<int64_t>& blocks, const std::vector<int64_t>& scales) {
  if (blocks.size() != 4 || scales.size() != 3 || blocks[3] != 16) return {};
  for (size_t i = 0; i < 3; ++i)
    if (blocks[i] != scales[i] || blocks[i] <= 0) return {};
  return {blocks[0], blocks[2] * 32, blocks[1]};
}

void mxfp4_dequantize(const uint8_t* blocks, const uint8_t* scales, int64_t E, int64_t R, int64_t K, float* out) {
  static constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  const int64_t G = K / 32;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t row = (e * R + r) * G + g;
        const int exp = static_cast<int>(scales[row]) - 127;
        const uint8_t* b = blocks + row * 16;
        for (int64_t j = 0; j < 16; ++j) {
          const int64_t k = g * 32 + 2 * j;
          out[(e * K + k) * R + r] = std::ldexp(kE2m1[b[j] & 0x0F], exp);
          out[(e * K + k + 1) * R + r] = std::ldexp(kE2m1[b[j] >> 4], exp);
        }
      }
}

std::vector<FusedTensor> fused_tensors(const ModelSpec& s) {
  if (s.family == Family::gpt_oss) return gptoss_fused(s);
  std::vector<FusedTensor> out;
  if (s.family != Family::phi3) return out;
  const int64_t d = s.hidden;
  for (int64_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "self_attn.qkv_proj.weight",
                   {s.q_dim() + 2 * s.kv_dim(), d},
                   {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"}});
    out.push_back({p + "mlp.gate_up_proj.weight",
                   {2 * s.intermediate, d},
                   {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}});
  }
  return out;
}

std::vector<WeightEntry> hf_weight_map(const ModelSpec& s) {
  std::vector<WeightEntry> m = weight_map(s);
  const std::vector<FusedTensor> fused = fused_tensors(s);
  if (fused.empty()) return m;
  std::map<std::string, std::pair<const FusedTensor*, size_t>> part_of;  // part name -> (group, index)
  for (const auto& f : fused)
    for (size_t k = 0; k < f.parts.size(); ++k) part_of[f.parts[k]] = {&f, k};
  std::vector<WeightEntry> out;
  for (auto& e : m) {
    auto it = part_of.find(e.name);
    if (it == part_of.end()) {
      out.push_back(std::move(e));
      continue;
    }
    if (it->second.second != 0) continue;  // folded into the group's first part
    const FusedTensor& f = *it->second.first;
    e.name = f.name;
    e.shape = f.shape;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace rt
