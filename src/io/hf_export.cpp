#include "io/hf_export.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"

namespace rt {

std::vector<std::string> hf_tokenizer_files(const std::string& model_dir) {
  static const char* const names[] = {"tokenizer.json",     "tokenizer_config.json",
                                      "tokenizer.model",    "special_tokens_map.json",
                                      "added_tokens.json",  "vocab.json",
                                      "merges.txt",         "chat_template.jinja",
                                      "chat_template.json", "generation_config.json"};
  std::vector<std::string> out;
  for (const char* n : names)
    if (file_exists(path_join(model_dir, n))) out.push_back(n);
  return out;
}

void export_hf_dir(const std::string& dir, const HostState& state, const ExportOptions& opt) {
  namespace fs = std::filesystem;
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  const std::string parent = path_dirname(clean);
  if (!parent.empty()) make_dirs(parent);
  const std::string tmp = clean + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  make_dirs(tmp);
  try {
    ModelSpec spec = state.spec();
    spec.dtype = opt.dtype == DType::bf16 ? "bfloat16" : "float32";
    write_file_atomic(path_join(tmp, "config.json"), spec_to_config_json(spec));
    safetensors_write_model(tmp, master_tensors(state, opt.dtype), opt.max_shard_bytes);
    state.release_decoded();  // split master storage: the decoded copy is not kept
    if (opt.tokenizer == "byte")
      write_file_atomic(path_join(tmp, "ramtrain_tokenizer.json"),
                        "{\"type\": \"byte\", \"vocab_size\": 258, \"bos_id\": 256, \"eos_id\": 257}\n");
    for (const std::string& name : opt.copy_files) {
      const std::string src = path_join(opt.copy_from_dir, name);
      RT_CHECK(file_exists(src), "[export] ", src, " does not exist: cannot copy it into the exported model");
      write_file_atomic(path_join(tmp, name), read_text_file(src));
    }
    nlohmann::json info = nlohmann::json::object();
    for (auto& [k, v] : opt.info) info[k] = v;
    info["written_by"] = "ramtrain 0.1.0";
    write_file_atomic(path_join(tmp, "ramtrain.json"), info.dump(2) + "\n");
    fsync_dir(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  const std::string old = clean + ".old." + std::to_string(::getpid());
  bool had_old = fs::exists(clean);
  if (had_old) fs::rename(clean, old, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    fail("[export] cannot replace ", clean, ": ", ec.message());
  }
  fs::rename(tmp, clean, ec);
  if (ec) {
    if (had_old) fs::rename(old, clean);
    fail("[export] cannot move ", tmp, " to ", clean, ": ", ec.message());
  }
  fsync_dir(parent);
  if (had_old) fs::remove_all(old, ec);
}

}  // namespace rt
