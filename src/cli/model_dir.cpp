#include "cli/model_dir.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "model/spec_multimodal.h"

namespace rt::cli {


void model_dir_check(const std::string& dir, bool weights, const std::string& where) {
  namespace fs = std::filesystem;
  if (file_exists(dir))
    fail(where, " ", dir, " is a file; pass the model's directory (", path_dirname(dir),
         ", holding config.json and the weights)");
  if (!is_directory(dir))
    fail(where, " ", dir, " is not a directory. Pass a HF model directory holding config.json and *.safetensors",
         dir.find('/') != std::string::npos && dir[0] != '/' && dir[0] != '.'
             ? " (a model id ORG/NAME is looked up in the local HF cache, $HF_HUB_CACHE or $HF_HOME/hub, where it is not downloaded)"
             : "",
         ".");
  bool safetensors = false;
  std::vector<std::string> other;  // weight files ramtrain cannot read
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (ext == ".safetensors" || name == "model.safetensors.index.json")
      safetensors = true;
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

std::string resolve_model_dir(const std::string& value) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(value, ec)) return value;
  // A model id: ORG/NAME with no other slash, not starting with . or /.
  const size_t slash = value.find('/');
  if (slash == std::string::npos || slash == 0 || value.find('/', slash + 1) != std::string::npos || value[0] == '.' ||
      slash + 1 == value.size())
    return value;
  std::string hub;  // as huggingface_hub: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c)
    hub = c;
  else if (const char* h = std::getenv("HF_HOME"); h && *h)
    hub = std::string(h) + "/hub";
  else if (const char* u = std::getenv("HOME"); u && *u)
    hub = std::string(u) + "/.cache/huggingface/hub";
  else
    return value;
  const std::string repo = cat(hub, "/models--", value.substr(0, slash), "--", value.substr(slash + 1));
  const std::string snaps = repo + "/snapshots";
  if (!fs::is_directory(snaps, ec)) return value;
  std::string rev;
  try {
    rev = read_text_file(repo + "/refs/main");
    while (!rev.empty() && (rev.back() == '\n' || rev.back() == '\r' || rev.back() == ' ')) rev.pop_back();
  } catch (const Error&) {
  }
  if (!rev.empty() && fs::is_directory(snaps + "/" + rev, ec)) return snaps + "/" + rev;
  std::vector<std::string> revs;
  for (auto& e : fs::directory_iterator(snaps, ec))
    if (e.is_directory()) revs.push_back(e.path().string());
  if (revs.size() == 1) return revs[0];
  if (revs.size() > 1)
    fail("[model] ", value, ": the HF cache ", snaps, " holds ", revs.size(),
         " revisions and refs/main names none of them; pass the snapshot directory itself");
  return value;
}

namespace {

// load_model_dir after model_dir_check, with config.json already parsed.
LoadedModel load_checked_model_dir(const std::string& dir, const ModelSpec& spec, bool with_grads,
                                   MomentStorage moments, MasterStorage master, UpdateRule rule) {
  LoadedModel m;
  m.spec = spec;
  SafetensorsModel st = SafetensorsModel::open(dir);
  std::optional<MultimodalNames> mm;
  if (config_file_is_multimodal(dir)) {
    std::vector<std::string> names;
    for (const TensorInfo* t : st.all()) names.push_back(t->name);
    mm = multimodal_names(names, st.source());
    m.multimodal = true;
    for (const TensorInfo* t : carried_tensors(st, *mm)) {
      ++m.carried_tensors;
      m.carried_bytes += t->nbytes;
    }
  }
  const MultimodalNames* names = mm ? &*mm : nullptr;
  load_state_check(m.spec, st, names);  // before allocating: a config.json that asks for more than the files hold
  m.state = std::make_unique<HostState>(m.spec, with_grads, moments, master, rule);
  load_state(*m.state, st, names);
  if (file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.model")))
    m.tokenizer = "hf";
  else if (file_exists(path_join(dir, "ramtrain_tokenizer.json")))
    m.tokenizer = "byte";
  return m;
}

}  // namespace

LoadedModel load_model_dir(const std::string& dir, bool with_grads, MomentStorage moments, MasterStorage master,
                           UpdateRule rule) {
  model_dir_check(dir, true, "[model]");
  return load_checked_model_dir(dir, spec_from_config_file(path_join(dir, "config.json")), with_grads, moments,
                                master, rule);
}

LoadedModel load_model_for_inference(const std::string& dir, bool with_grads, const std::string& where) {
  model_dir_check(dir, true, where);
  const ModelSpec spec = spec_from_config_file(path_join(dir, "config.json"));
  const uint64_t need = HostState::planned_bytes(spec, MasterStorage::fp32, 0, with_grads, MomentStorage::q4);
  const uint64_t avail = host_memory_available();
  if (avail && need > avail)
    fail(where, " ", path_join(dir, "config.json"), " describes a model of ", spec.params_total(),
         " parameters (hidden_size ", spec.hidden, ", intermediate_size ", spec.intermediate, ", num_hidden_layers ",
         spec.n_layers, ", vocab_size ", spec.vocab, "): its fp32 weights", with_grads ? " and gradients" : "",
         " need ", need >> 20, " MiB of host RAM, ", avail >> 20,
         " MiB are available. Check those values, or use a machine with more memory.");
  return load_checked_model_dir(dir, spec, with_grads, MomentStorage::q4, MasterStorage::fp32, UpdateRule::adamw);
}

}  // namespace rt::cli
