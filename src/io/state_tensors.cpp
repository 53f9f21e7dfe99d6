#include "io/state_tensors.h"

#include "core/error.h"
#include "model/weight_map.h"

namespace rt {

void load_state(HostState& state, const SafetensorsModel& model) {
  std::vector<FoundTensor> found;
  for (const TensorInfo* t : model.all()) found.push_back({t->name, t->shape});
  std::string report = weight_map_check(state.spec(), found);
  if (!report.empty()) fail("[load] ", model.source(), " does not match config.json:\n", report);
  std::vector<float> scratch;  // split master storage: each tensor is encoded from fp32
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k) {
      if (!u.shadow_master()) {
        tensor_to_f32(model.get(u.entries[k].name), u.master() + u.offsets[k]);
        continue;
      }
      scratch.resize(static_cast<size_t>(u.entries[k].numel()));
      tensor_to_f32(model.get(u.entries[k].name), scratch.data());
      u.write_master(u.offsets[k], u.entries[k].numel(), scratch.data());
    }
}

std::vector<TensorWrite> master_tensors(const HostState& state, DType dtype) {
  std::vector<TensorWrite> out;
  state.decode_all();  // split master storage: the views point into the decoded copy
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k)
      out.push_back({u.entries[k].name, u.entries[k].shape, state.master_view(u.entries[k].name), dtype});
  return out;
}

std::vector<TensorWrite> grad_tensors(const HostState& state) {
  RT_CHECK(state.has_grads(), "[host] gradients were not allocated");
  std::vector<TensorWrite> out;
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k)
      out.push_back({u.entries[k].name, u.entries[k].shape, u.grad.p + u.offsets[k], DType::f32});
  return out;
}

}  // namespace rt
