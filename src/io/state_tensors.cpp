#include "io/state_tensors.h"

#include <atomic>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/weight_map.h"

namespace rt {

void load_state_check(const ModelSpec& spec, const SafetensorsModel& model) {
  std::vector<FoundTensor> found;
  for (const TensorInfo* t : model.all()) found.push_back({t->name, t->shape});
  std::string report = weight_map_check(spec, found);
  if (!report.empty()) fail("[load] ", model.source(), " does not match config.json:\n", report);
}

namespace {

// Weights must be finite: a NaN or Inf in a checkpoint (a damaged download, an
// overflowed fp16 export) would train to NaN or sample garbage.
void check_finite(const TensorInfo& t, const float* x, int64_t n) {
  std::atomic<int64_t> first{n};
  parallel_for(n, int64_t{1} << 20, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      if (!std::isfinite(x[i])) {
        int64_t cur = first.load();
        while (i < cur && !first.compare_exchange_weak(cur, i)) {
        }
        return;
      }
  });
  const int64_t i = first.load();
  if (i < n)
    fail("[load] ", t.file ? *t.file : std::string("?"), ": tensor '", t.name, "' holds ",
         std::isnan(x[i]) ? "NaN" : "Inf", " (element ", i, " of ", n,
         "): the weights are damaged; download or export them again");
}

}  // namespace

void load_state(HostState& state, const SafetensorsModel& model) {
  load_state_check(state.spec(), model);
  std::vector<float> scratch;  // split master storage: each tensor is encoded from fp32
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const TensorInfo& t = model.get(u.entries[k].name);
      const int64_t n = u.entries[k].numel();
      if (!u.shadow_master()) {
        tensor_to_f32(t, u.master() + u.offsets[k]);
        check_finite(t, u.master() + u.offsets[k], n);
        continue;
      }
      scratch.resize(static_cast<size_t>(n));
      tensor_to_f32(t, scratch.data());
      check_finite(t, scratch.data(), n);
      u.write_master(u.offsets[k], n, scratch.data());
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
