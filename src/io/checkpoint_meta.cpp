// The checkpoint's JSON metadata (contract in checkpoint.h): trainer.json
// (TrainerCheckpoint) and manifest.json (CheckpointManifest), written and
// strictly parsed. Parsers throw "[checkpoint] <source>: ..." naming the field.
#include "io/checkpoint.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "core/quote.h"
#include "io/checkpoint_internal.h"

namespace rt {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using checkpoint_internal::hex64;
using checkpoint_internal::hex64_parse;
using checkpoint_internal::kFormat;
using checkpoint_internal::kVersion;

constexpr const char* kSelfKey = "manifest_xxh3_64";

// text as a JSON object; bad(what) (which throws) when it is not one.
template <class Bad>
json parse_object(const std::string& text, Bad bad) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(cat("invalid JSON: ", quote_input(e.what())));
  }
  if (!j.is_object()) bad("not a JSON object");
  return j;
}

}  // namespace

std::string trainer_checkpoint_to_json(const TrainerCheckpoint& c) {
  ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = c.step;
  j["adam_t"] = c.adam_t;
  j["skipped"] = c.skipped;
  j["bad_in_a_row"] = c.bad_in_a_row;
  j["bad_since"] = c.bad_since;
  j["data_cursor"] = c.cursor.to_string();
  j["rng"] = "none: init is counter-based from seed; data order is a pure function of seed and data_cursor";
  j["seed"] = c.run.seed;
  j["data"] = {{"paths", c.run.data_paths},
               {"train_tokens", c.run.train_tokens},
               {"val_tokens", c.run.val_tokens},
               {"train_windows", c.run.train_windows},
               {"fingerprint", hex64(c.run.data_fingerprint)}};
  j["source_model_dir"] = c.run.source_model_dir;
  if (c.run.source_multimodal) j["source_multimodal"] = true;  // absent in older checkpoints: false
  j["tokenizer"] = c.run.tokenizer;
  j["run_config"] = c.run.run_config;
  return j.dump(2) + "\n";
}

TrainerCheckpoint trainer_checkpoint_parse(const std::string& text, const std::string& source) {
  auto bad = [&](const std::string& what) -> void {
    fail("[checkpoint] ", source, ": ", what, " (the checkpoint is corrupt or from another program; use another one)");
  };
  json j = parse_object(text, bad);
  auto field = [&](const json& o, const char* k) -> const json& {
    if (!o.contains(k)) bad(cat("missing field '", k, "'"));
    return o.at(k);
  };
  auto i64 = [&](const json& o, const char* k) {
    const json& v = field(o, k);
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) || v.get<int64_t>() < 0)
      bad(cat("field '", k, "' must be a non-negative integer"));
    return v.get<int64_t>();
  };
  auto u64 = [&](const json& o, const char* k) {
    const json& v = field(o, k);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      bad(cat("field '", k, "' must be a non-negative integer"));
    return v.get<uint64_t>();
  };
  auto str = [&](const json& o, const char* k) {
    const json& v = field(o, k);
    if (!v.is_string()) bad(cat("field '", k, "' must be a string"));
    return v.get<std::string>();
  };
  if (str(j, "format") != kFormat) bad("format is not ramtrain-checkpoint");
  if (i64(j, "version") != kVersion) bad(cat("version ", j["version"].dump(), " is not ", kVersion));
  TrainerCheckpoint c;
  c.step = i64(j, "step");
  c.adam_t = i64(j, "adam_t");
  c.skipped = i64(j, "skipped");
  c.bad_in_a_row = i64(j, "bad_in_a_row");
  c.bad_since = i64(j, "bad_since");
  if (c.adam_t + c.skipped != c.step) bad("adam_t + skipped != step");
  try {
    c.cursor = DataCursor::parse(str(j, "data_cursor"));
  } catch (const Error& e) {
    bad(e.what());
  }
  c.run.seed = u64(j, "seed");
  const json& d = field(j, "data");
  if (!d.is_object()) bad("field 'data' must be an object");
  const json& paths = field(d, "paths");
  if (!paths.is_array()) bad("field 'data.paths' must be an array of strings");
  for (const json& p : paths) {
    if (!p.is_string()) bad("field 'data.paths' must be an array of strings");
    c.run.data_paths.push_back(p.get<std::string>());
  }
  c.run.train_tokens = u64(d, "train_tokens");
  c.run.val_tokens = u64(d, "val_tokens");
  c.run.train_windows = u64(d, "train_windows");
  if (!hex64_parse(str(d, "fingerprint"), &c.run.data_fingerprint))
    bad("field 'data.fingerprint' must be 16 hex digits");
  c.run.source_model_dir = str(j, "source_model_dir");
  if (j.contains("source_multimodal")) {
    if (!j["source_multimodal"].is_boolean()) bad("field 'source_multimodal' must be true or false");
    c.run.source_multimodal = j["source_multimodal"].get<bool>();
  }
  c.run.tokenizer = str(j, "tokenizer");
  const json& rc = field(j, "run_config");
  if (!rc.is_object()) bad("field 'run_config' must be an object of strings");
  for (auto it = rc.begin(); it != rc.end(); ++it) {
    if (!it.value().is_string()) bad("field 'run_config' must be an object of strings");
    c.run.run_config[it.key()] = it.value().get<std::string>();
  }
  return c;
}

std::string manifest_to_json(const CheckpointManifest& m) {
  ordered_json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["step"] = m.step;
  ordered_json files = ordered_json::object();
  for (auto& [name, e] : m.files) files[name] = {{"bytes", e.bytes}, {"xxh3_64", hex64(e.xxh3_64)}};
  j["files"] = files;
  j[kSelfKey] = hex64(0);
  std::string text = j.dump(2) + "\n";
  const std::string zeros = cat('"', hex64(0), '"');
  const size_t pos = text.rfind(zeros);
  const std::string self = hex64(xxh3_64_of(text.data(), text.size()));
  text.replace(pos + 1, 16, self);
  return text;
}

CheckpointManifest manifest_parse(const std::string& text, const std::string& source) {
  auto bad = [&](const std::string& what) -> void {
    fail("[checkpoint] ", source, ": ", what, " (the checkpoint is corrupt or incomplete; use an older one)");
  };
  json j = parse_object(text, bad);
  if (!j.contains(kSelfKey) || !j[kSelfKey].is_string()) bad(cat("no '", kSelfKey, "' self-checksum"));
  uint64_t self = 0;
  const std::string self_hex = j[kSelfKey].get<std::string>();
  if (!hex64_parse(self_hex, &self)) bad(cat("'", kSelfKey, "' must be 16 lowercase hex digits"));
  // Locate the value in the raw text: exactly one occurrence of the key.
  const std::string key = cat("\"", kSelfKey, "\"");
  const size_t kpos = text.find(key);
  if (kpos == std::string::npos || text.find(key, kpos + 1) != std::string::npos)
    bad(cat("'", kSelfKey, "' must appear exactly once"));
  const size_t vpos = text.find('"', kpos + key.size());
  if (vpos == std::string::npos || text.compare(vpos + 1, 16, self_hex) != 0) bad("cannot locate the self-checksum");
  std::string zeroed = text;
  zeroed.replace(vpos + 1, 16, hex64(0));
  if (xxh3_64_of(zeroed.data(), zeroed.size()) != self) bad("checksum mismatch: manifest.json was modified or damaged");
  if (!j.contains("format") || j["format"] != kFormat) bad("format is not ramtrain-checkpoint");
  if (!j.contains("version") || j["version"] != kVersion)
    bad(cat("unsupported version (this build reads ", kVersion, ")"));
  CheckpointManifest m;
  if (!j.contains("step") || !j["step"].is_number_integer() || j["step"].get<int64_t>() < 0)
    bad("'step' must be a non-negative integer");
  m.step = j["step"].get<int64_t>();
  if (!j.contains("files") || !j["files"].is_object()) bad("'files' must be an object");
  for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
    const std::string& name = it.key();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos || name == "manifest.json")
      bad(cat("bad file name '", name, "'"));
    const json& e = it.value();
    ManifestEntry me;
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("xxh3_64") ||
        !e["xxh3_64"].is_string() || !hex64_parse(e["xxh3_64"].get<std::string>(), &me.xxh3_64))
      bad(cat("entry '", name, "' must be {\"bytes\": N, \"xxh3_64\": \"16 hex digits\"}"));
    me.bytes = e["bytes"].get<uint64_t>();
    m.files[name] = me;
  }
  return m;
}

}  // namespace rt
