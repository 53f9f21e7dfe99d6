#include "io/hf_export.h"

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "model/spec_multimodal.h"

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

namespace {

// The multimodal export's config.json and tensors (ExportOptions::source_model_dir).
// The source's safetensors stay mapped in *src while the tensors are written.
struct MultimodalExport {
  std::string config;
  std::vector<TensorWrite> tensors;
};

MultimodalExport multimodal_export(const HostState& state, const ExportOptions& opt, const std::string& source,
                                   std::optional<SafetensorsModel>* src) {
  const std::string cfg_path = path_join(source, "config.json");
  const std::string why = cat("[export] the run's model directory ", source, " (a ", kGemma3Multimodal,
                              ": its vision tower and projector are copied from there)");
  nlohmann::ordered_json cfg;
  try {
    cfg = nlohmann::ordered_json::parse(read_text_file(cfg_path));
  } catch (const std::exception& e) {
    fail(why, ": cannot read ", cfg_path, " (", e.what(), ")");
  }
  // The checkpoint must be this model's language model: the same text config, dtype aside.
  ModelSpec want = spec_from_config_file(cfg_path), have = state.spec();
  want.dtype = have.dtype = "float32";
  if (spec_to_config_json(want) != spec_to_config_json(have))
    fail(why,
         ": its text_config does not describe the trained model (the directory was changed since the run "
         "started?); restore it, or export the text model alone from a run without it");
  try {
    src->emplace(SafetensorsModel::open(source));
  } catch (const Error& e) {
    fail(why, ": its weights cannot be read: ", e.what());
  }
  std::vector<std::string> names;
  for (const TensorInfo* t : (*src)->all()) names.push_back(t->name);
  const MultimodalNames mm = multimodal_names(names, (*src)->source());
  try {
    load_state_check(state.spec(), **src, &mm);
  } catch (const Error& e) {
    fail(why, ": its language model no longer matches the trained one: ", e.what());
  }
  const std::vector<const TensorInfo*> carried = carried_tensors(**src, mm);
  if (carried.empty())
    fail(why, ": ", (*src)->source(), " holds only the language model's tensors, no vision tower or projector; ",
         "restore the full checkpoint");

  const char* dt = opt.dtype == DType::bf16 ? "bfloat16" : "float32";
  for (const char* k : {"torch_dtype", "dtype"}) {
    cfg[k] = dt;
    if (cfg.contains("text_config") && cfg["text_config"].is_object() && cfg["text_config"].contains(k))
      cfg["text_config"][k] = dt;
  }
  MultimodalExport out;
  out.config = cfg.dump(2) + "\n";
  out.tensors = master_tensors(state, opt.dtype);
  for (TensorWrite& t : out.tensors) t.name = mm.to_checkpoint(t.name);
  for (const TensorInfo* t : carried) {
    TensorWrite w{t->name, t->shape, nullptr, t->dtype, {}};
    w.raw = t->data;
    out.tensors.push_back(std::move(w));
  }
  return out;
}

}  // namespace

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
    if (!opt.source_model_dir.empty() && config_file_is_multimodal(opt.source_model_dir)) {
      std::optional<SafetensorsModel> src;  // mapped until the tensors are written
      MultimodalExport mm = multimodal_export(state, opt, opt.source_model_dir, &src);
      write_file_atomic(path_join(tmp, "config.json"), mm.config);
      safetensors_write_model(tmp, mm.tensors, opt.max_shard_bytes);
    } else {
      ModelSpec spec = state.spec();
      spec.dtype = opt.dtype == DType::bf16 ? "bfloat16" : "float32";
      write_file_atomic(path_join(tmp, "config.json"), spec_to_config_json(spec));
      safetensors_write_model(tmp, master_tensors(state, opt.dtype), opt.max_shard_bytes);
    }
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
