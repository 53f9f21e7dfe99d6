// Export: a model as a HF directory (config.json + safetensors, bf16 or fp32)
// that transformers, `ramtrain loss` and `ramtrain sample` all load, plus the
// source model's tokenizer files when asked (copy_files).
// The directory is written whole or not at all: files go into DIR.tmp.<pid>,
// are fsync'ed, and the directory is renamed into place (an older DIR is
// moved aside first and removed only after the rename succeeded).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "state/host_state.h"

namespace rt {

struct ExportOptions {
  DType dtype = DType::bf16;
  uint64_t max_shard_bytes = 0;             // 0: one file
  std::string tokenizer = "byte";           // "byte": writes ramtrain_tokenizer.json; "": none
  std::map<std::string, std::string> info;  // extra fields for ramtrain.json (step, loss, ...)
  // Files copied byte for byte from copy_from_dir into the export (e.g. the
  // source model's tokenizer files); a listed file that is missing throws.
  std::string copy_from_dir;
  std::vector<std::string> copy_files;
  // The model directory the run started from ("" for a preset). When its
  // config.json is a Gemma3ForConditionalGeneration (model/spec_multimodal.h),
  // the export is one again: that config.json with only its dtype updated,
  // the language model under the source's tensor names, and every other
  // tensor of the source (vision tower, projector) copied byte for byte.
  std::string source_model_dir;
};

// The tokenizer files of a HF model dir that exist there, by name, in a fixed
// order: tokenizer.json, tokenizer_config.json, tokenizer.model,
// special_tokens_map.json, added_tokens.json, vocab.json, merges.txt,
// chat_template.jinja, chat_template.json, generation_config.json.
std::vector<std::string> hf_tokenizer_files(const std::string& model_dir);

void export_hf_dir(const std::string& dir, const HostState& state, const ExportOptions& opt);

}  // namespace rt
