// The fused tensors of HF checkpoints (weight_map.h: fused_tensors,
// hf_weight_map). ramtrain keeps q/k/v and gate/up as separate weights (the
// layer template's contract); loading splits a fused tensor by rows and
// export concatenates the rows again (io/state_tensors.cpp), bit for bit.
#include <map>

#include "core/error.h"
#include "model/weight_map.h"

namespace rt {

std::vector<FusedTensor> fused_tensors(const ModelSpec& s) {
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
