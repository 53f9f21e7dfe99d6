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
};

// DIR/config.json + DIR's safetensors; every mismatch reported by name.
LoadedModel load_model_dir(const std::string& dir, bool with_grads);

}  // namespace rt::cli
