#include "cli/model_dir.h"

#include "core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"

namespace rt::cli {

LoadedModel load_model_dir(const std::string& dir, bool with_grads) {
  if (!is_directory(dir))
    fail("[model] ", dir, " is not a directory. Pass a HF model directory holding config.json and *.safetensors.");
  LoadedModel m;
  m.spec = spec_from_config_file(path_join(dir, "config.json"));
  SafetensorsModel st = SafetensorsModel::open(dir);
  m.state = std::make_unique<HostState>(m.spec, with_grads);
  load_state(*m.state, st);
  if (file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.model")))
    m.tokenizer = "hf";
  else if (file_exists(path_join(dir, "ramtrain_tokenizer.json")))
    m.tokenizer = "byte";
  return m;
}

}  // namespace rt::cli
