// Loading a model directory (HF layout, or one ramtrain exported) into a
// HostState, with the checks and messages every command shares.
#pragma once
#include <memory>
#include <string>

#include "engine/host_state.h"
#include "model/spec.h"

namespace rt::cli {

struct LoadedModel {
  ModelSpec spec;
  std::unique_ptr<HostState> state;
  std::string tokenizer;  // "byte" for ramtrain byte-level models, "hf" when tokenizer.json exists, "" unknown
};

// DIR/config.json + DIR's safetensors; every mismatch reported by name.
LoadedModel load_model_dir(const std::string& dir, bool with_grads);

// Cheap checks before anything is loaded or encoded: DIR is a directory with
// config.json and (weights = true) safetensors weights. A directory holding
// other weight formats (pytorch_model.bin, *.gguf, *.pt, ...) is refused with
// what it holds and how to convert it. where: "[train]", "[sample]", ...
void model_dir_check(const std::string& dir, bool weights, const std::string& where);

}  // namespace rt::cli
