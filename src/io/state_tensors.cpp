#include "io/state_tensors.h"

#include <atomic>
#include <cmath>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/weight_map.h"

namespace rt {

namespace {
// A fused tensor the checkpoint holds in MXFP4 (gpt-oss's experts, model/weight_map.h):
// its blocks and scales, or nulls.
struct Mxfp4Pair {
  const TensorInfo* blocks = nullptr;
  const TensorInfo* scales = nullptr;
};
Mxfp4Pair mxfp4_pair(const SafetensorsModel& model, const std::string& name) {
  return {model.find(name + "_blocks"), model.find(name + "_scales")};
}
}  // namespace

void load_state_check(const ModelSpec& spec, const SafetensorsModel& model, const MultimodalNames* mm) {
  std::vector<FoundTensor> found;
  std::map<std::string, std::string> mx;  // "NAME_blocks"/"NAME_scales" -> NAME, for gpt-oss's fused tensors
  for (const FusedTensor& f : fused_tensors(spec))
    if (!model.find(f.name) && spec.family == Family::gpt_oss) mx[f.name + "_blocks"] = mx[f.name + "_scales"] = f.name;
  for (const TensorInfo* t : model.all()) {
    std::string name = t->name;
    if (mm) {  // a multimodal checkpoint: its language model's tensors, named as in the text model
      const std::optional<std::string> text = mm->to_text(t->name);
      if (!text) continue;
      name = *text;
    }
    auto it = mx.find(name);
    if (it == mx.end()) {
      found.push_back({name, t->shape});
      continue;
    }
    const Mxfp4Pair p = mxfp4_pair(model, it->second);
    if (t->name != it->second + "_blocks") continue;  // reported with its blocks
    if (!p.scales || p.blocks->dtype != DType::u8 || p.scales->dtype != DType::u8 ||
        mxfp4_fused_shape(p.blocks->shape, p.scales->shape).empty())
      fail("[load] ", model.source(), ": ", it->second, "_blocks and _scales are not an MXFP4 pair (U8 blocks [E, R, ",
           "K/32, 16] and U8 scales [E, R, K/32]); export the checkpoint again");
    found.push_back({it->second, mxfp4_fused_shape(p.blocks->shape, p.scales->shape)});
  }
  std::string report = weight_map_check(spec, found);
  if (!report.empty())
    fail("[load] ", model.source(), " does not match config.json",
         mm ? cat(" (the language model's tensors, under ", mm->body, "; named here as in the text model)")
            : std::string(),
         ":\n", report);
}

std::vector<const TensorInfo*> carried_tensors(const SafetensorsModel& model, const MultimodalNames& mm) {
  std::vector<const TensorInfo*> out;
  for (const TensorInfo* t : model.all())
    if (!mm.to_text(t->name)) out.push_back(t);
  return out;
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

// Where a weight lies in the fused tensor that holds it (weight_map.h):
// the fused tensor, the element offset of the weight's rows (plain layouts),
// its index among the parts and every part's shape (the others).
struct FusedPart {
  const FusedTensor* fused;
  int64_t offset;
  size_t index;
  std::shared_ptr<const std::vector<std::vector<int64_t>>> shapes;
};
std::map<std::string, FusedPart> fused_parts(const ModelSpec& spec, const std::vector<FusedTensor>& fused) {
  std::map<std::string, const WeightEntry*> entry;
  const std::vector<WeightEntry> map = weight_map(spec);
  for (const WeightEntry& e : map) entry[e.name] = &e;
  std::map<std::string, FusedPart> out;
  for (const FusedTensor& f : fused) {
    auto shapes = std::make_shared<std::vector<std::vector<int64_t>>>();
    for (const std::string& part : f.parts) shapes->push_back(entry.at(part)->shape);
    int64_t off = 0;
    for (size_t k = 0; k < f.parts.size(); ++k) {
      out[f.parts[k]] = {&f, off, k, shapes};
      off += entry.at(f.parts[k])->numel();
    }
  }
  return out;
}

// Writes with each fused group's parts replaced by one write of the fused
// tensor, its runs pointing at the parts (no copy).
std::vector<TensorWrite> fuse_writes(const ModelSpec& spec, std::vector<TensorWrite> writes) {
  const std::vector<FusedTensor> fused = fused_tensors(spec);
  if (fused.empty()) return writes;
  const std::map<std::string, FusedPart> parts = fused_parts(spec, fused);
  std::map<std::string, const TensorWrite*> by_name;
  for (const TensorWrite& w : writes) by_name[w.name] = &w;
  std::vector<TensorWrite> out;
  for (const TensorWrite& w : writes) {
    auto it = parts.find(w.name);
    if (it == parts.end()) {
      out.push_back(w);
      continue;
    }
    const FusedTensor& f = *it->second.fused;
    if (f.parts.front() != w.name) continue;  // written with the group's first part
    TensorWrite fw{f.name, f.shape, nullptr, w.dtype, {}};
    if (!f.plain()) {  // interleaved or transposed parts (gpt-oss): made when written
      std::vector<const float*> srcs;
      for (const std::string& part : f.parts) srcs.push_back(by_name.at(part)->data);
      const FusedTensor layout{f.name, f.shape, {}, f.interleave, f.transpose};  // outlives `fused`
      fw.fill = [layout, srcs, shapes = it->second.shapes](float* out) {
        for (size_t k = 0; k < srcs.size(); ++k) fused_scatter(layout, *shapes, k, srcs[k], out);
      };
      out.push_back(std::move(fw));
      continue;
    }
    for (const std::string& part : f.parts) {
      const TensorWrite* pw = by_name.at(part);
      int64_t n = 1;
      for (int64_t d : pw->shape) n *= d;
      fw.runs.push_back({pw->data, n});
    }
    out.push_back(std::move(fw));
  }
  return out;
}

}  // namespace

void load_state(HostState& state, const SafetensorsModel& model, const MultimodalNames* mm) {
  load_state_check(state.spec(), model, mm);
  auto named = [mm](const std::string& name) { return mm ? mm->to_checkpoint(name) : name; };
  std::vector<float> scratch;  // split master storage: each tensor is encoded from fp32
  const std::vector<FusedTensor> fused = fused_tensors(state.spec());
  const std::map<std::string, FusedPart> parts = fused_parts(state.spec(), fused);
  std::vector<float> fused_buf;  // the fused tensor last read, whole
  const FusedTensor* fused_in_buf = nullptr;
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k) {
      const int64_t n = u.entries[k].numel();
      if (auto it = parts.find(u.entries[k].name); it != parts.end()) {  // rows of a fused tensor
        const FusedPart& fp = it->second;
        if (fused_in_buf != fp.fused && !model.find(fp.fused->name)) {  // MXFP4 (load_state_check said so)
          const Mxfp4Pair p = mxfp4_pair(model, fp.fused->name);
          const std::vector<int64_t>& sh = p.blocks->shape;  // [E, R, K/32, 16]
          fused_buf.resize(static_cast<size_t>(sh[0] * sh[1] * sh[2] * 32));
          mxfp4_dequantize(p.blocks->data, p.scales->data, sh[0], sh[1], sh[2] * 32, fused_buf.data());
          check_finite(*p.blocks, fused_buf.data(), static_cast<int64_t>(fused_buf.size()));
          fused_in_buf = fp.fused;
        }
        if (fused_in_buf != fp.fused) {
          const TensorInfo& t = model.get(named(fp.fused->name));
          fused_buf.resize(static_cast<size_t>(t.numel()));
          tensor_to_f32(t, fused_buf.data());
          check_finite(t, fused_buf.data(), t.numel());
          fused_in_buf = fp.fused;
        }
        if (fp.fused->plain()) {
          u.write_master(u.offsets[k], n, fused_buf.data() + fp.offset);
        } else {  // interleaved or transposed (gpt-oss's experts)
          scratch.resize(static_cast<size_t>(n));
          fused_gather(*fp.fused, *fp.shapes, fp.index, fused_buf.data(), scratch.data());
          u.write_master(u.offsets[k], n, scratch.data());
        }
        continue;
      }
      const TensorInfo& t = model.get(named(u.entries[k].name));
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
  return fuse_writes(state.spec(), std::move(out));
}

std::vector<TensorWrite> grad_tensors(const HostState& state) {
  RT_CHECK(state.has_grads(), "[host] gradients were not allocated");
  std::vector<TensorWrite> out;
  for (auto& u : state.units())
    for (size_t k = 0; k < u.entries.size(); ++k)
      out.push_back({u.entries[k].name, u.entries[k].shape, u.grad.p + u.offsets[k], DType::f32});
  return fuse_writes(state.spec(), std::move(out));
}

}  // namespace rt
