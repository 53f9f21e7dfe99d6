#include "cli/model_dir.h"

#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"

namespace rt::cli {

void model_dir_check(const std::string& dir, bool weights, const std::string& where) {
  namespace fs = std::filesystem;
  if (!is_directory(dir))
    fail(where, " ", dir, " is not a directory. Pass a HF model directory holding config.json and *.safetensors",
         dir.find('/') != std::string::npos && dir[0] != '/' && dir[0] != '.'
             ? " (a model id ORG/NAME is looked up in the local HF cache, $HF_HOME/hub, where it is not downloaded)"
             : "",
         ".");
  bool safetensors = false;
  std::vector<std::string> other;  // weight files ramtrain cannot read
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (ext == ".safetensors" || name == "model.safetensors.index.json") safetensors = true;
    else if (ext == ".bin" || ext == ".gguf" || ext == ".pt" || ext == ".pth" || ext == ".ckpt" || ext == ".h5" ||
             ext == ".msgpack")
      other.push_back(name);
  }
  if (weights && !safetensors && !other.empty()) {
    std::string list;
    for (size_t i = 0; i < other.size() && i < 4; ++i) list += (i ? ", " : "") + other[i];
    if (other.size() > 4) list += cat(" and ", other.size() - 4, " more");
    bool gguf = false;
    for (auto& o : other) gguf |= o.size() > 5 && o.substr(o.size() - 5) == ".gguf";
    fail(where, " ", dir, " holds ", list, " but no *.safetensors: ramtrain reads only safetensors weights. ",
         gguf ? "A GGUF file is llama.cpp's format; get the original HF checkpoint, or convert with transformers: "
                "AutoModelForCausalLM.from_pretrained(DIR, gguf_file=FILE).save_pretrained(OUT)."
              : "Convert them once with transformers: AutoModelForCausalLM.from_pretrained(DIR)"
                ".save_pretrained(OUT, safe_serialization=True), and pass OUT.");
  }
  if (!file_exists(path_join(dir, "config.json")))
    fail(where, " ", dir, " has no config.json: pass a HF model directory (config.json + *.safetensors)");
  if (weights && !safetensors)
    fail(where, " ", dir, " holds no weights (*.safetensors or model.safetensors.index.json)",
         where == "[train]" ? "; to start from random weights with its config.json pass --init random" : "");
}

LoadedModel load_model_dir(const std::string& dir, bool with_grads) {
  model_dir_check(dir, true, "[model]");
  LoadedModel m;
  m.spec = spec_from_config_file(path_join(dir, "config.json"));
  SafetensorsModel st = SafetensorsModel::open(dir);
  m.state = std::make_unique<HostState>(m.spec, with_grads);
  m.state->load(st);
  if (file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.model")))
    m.tokenizer = "hf";
  else if (file_exists(path_join(dir, "ramtrain_tokenizer.json")))
    m.tokenizer = "byte";
  return m;
}

}  // namespace rt::cli
