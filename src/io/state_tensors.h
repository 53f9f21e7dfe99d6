// HostState <-> safetensors: the master weights of a HF checkpoint in, the
// master weights or the gradients out as tensors to write (HF names,
// canonical weight-map order). Pointers into the state's arenas: no copies.
#pragma once
#include <vector>

#include "io/safetensors.h"
#include "model/spec_multimodal.h"
#include "state/host_state.h"

namespace rt {

// Loads master weights from a HF checkpoint; every missing, unexpected or
// misshapen tensor is reported by name (model/weight_map.h). With mm (a
// Gemma3ForConditionalGeneration checkpoint, model/spec_multimodal.h) the
// weights are the language model's, under mm's names; the other tensors are
// carried and not loaded.
void load_state(HostState& state, const SafetensorsModel& model, const MultimodalNames* mm = nullptr);
// The same check of names and shapes against spec alone, from the files'
// headers: call it before allocating a HostState for them.
void load_state_check(const ModelSpec& spec, const SafetensorsModel& model, const MultimodalNames* mm = nullptr);
// The tensors of a multimodal checkpoint that are not the language model's
// (the vision tower, the projector), by name.
std::vector<const TensorInfo*> carried_tensors(const SafetensorsModel& model, const MultimodalNames& mm);
// Tensors a checkpoint stores fused (Phi3's qkv_proj, gate_up_proj; see
// model/weight_map.h fused_tensors) are split by rows on load and written
// fused again by master_tensors and grad_tensors (runs over the parts).
// fp32 master weights as tensors to write, stored as dtype (split master
// storage: views of the state's decoded copy, host_state.h decode_all).
std::vector<TensorWrite> master_tensors(const HostState& state, DType dtype);
// fp32 gradients (the state must have them).
std::vector<TensorWrite> grad_tensors(const HostState& state);

}  // namespace rt
