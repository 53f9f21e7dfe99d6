// Loading a model directory (HF layout, or one ramtrain exported) into a
// HostState, with the checks and messages every command shares.
#pragma once
#include <memory>
#include <string>

#include "model/spec.h"
#include "state/host_state.h"

namespace rt::cli {

struct LoadedModel {
  ModelSpec spec;
  std::unique_ptr<HostState> state;
  std::string tokenizer;  // "byte" for ramtrain byte-level models, "hf" when tokenizer.json exists, "" unknown
  // A Gemma3ForConditionalGeneration directory (model/spec_multimodal.h):
  // spec and state are its language model's; the other tensors (vision
  // tower, projector) are carried: not loaded, copied from DIR by exports.
  bool multimodal = false;
  int64_t carried_tensors = 0;
  uint64_t carried_bytes = 0;
};

// DIR/config.json + DIR's safetensors; every mismatch reported by name.
// The state is made in the given storages (HostState's constructor).
LoadedModel load_model_dir(const std::string& dir, bool with_grads, MomentStorage moments = MomentStorage::fp32,
                           MasterStorage master = MasterStorage::fp32, UpdateRule rule = UpdateRule::adamw);
// For commands that do not train (loss, eval, sample): fp32 weights with the
// smallest moment storage (never used; ~5 B/param instead of 12), and a host
// RAM check whose message names the model, not training options. where: "[loss]".
LoadedModel load_model_for_inference(const std::string& dir, bool with_grads, const std::string& where);

// A --model value that is not a directory but looks like a HF model id
// ("Qwen/Qwen2.5-0.5B") is looked up in the local HF cache:
// <hub>/models--Qwen--Qwen2.5-0.5B/snapshots/<rev>/, hub = $HF_HUB_CACHE, else
// $HF_HOME/hub, else ~/.cache/huggingface/hub (the revision refs/main names,
// else the only one). loss, eval, render, sample, plan and train take it.
// Returns the directory to use, or the value unchanged when nothing matches.
std::string resolve_model_dir(const std::string& value);

// Cheap checks before anything is loaded or encoded: DIR is a directory with
// config.json and (weights = true) safetensors weights. A directory holding
// other weight formats (pytorch_model.bin, *.gguf, *.pt, ...) is refused with
// what it holds and how to convert it. where: "[train]", "[sample]", ...
void model_dir_check(const std::string& dir, bool weights, const std::string& where);

}  // namespace rt::cli
