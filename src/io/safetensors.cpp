// safetensors reader and writer (contract in safetensors.h).
// File layout: u64 little-endian header length N, N bytes of JSON header
// (padded with spaces), then the data section; data_offsets are relative to
// the start of the data section.
// Reader rules beyond the header comment: duplicate JSON keys (tensor names or
// keys inside an entry) are errors, found with a parser callback because
// nlohmann silently keeps one; holes between tensors and trailing bytes are
// accepted, overlaps are not; zero-byte tensors never overlap anything.
// tensors() is in data-offset order. Tensor data may be unaligned (the format
// only aligns the data section start), so it is read with memcpy.
// Writer rules: offsets are contiguous in the given order (the reference
// reader rejects holes), so only the data section start is 8-byte aligned.
// Conversion uses rt::parallel_for: do not call these from inside a pool task.
#include "io/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian; so is this reader");

namespace rt {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr int64_t kConvertGrain = 1 << 18;         // elements per parallel task (fixed)
constexpr int64_t kWriteChunk = 1 << 20;           // elements converted per write() call
const char* const kSupported = "supported: F32, BF16, F16";
const char* const kTruncatedHint = "the file is truncated or not a safetensors file; re-download or re-export it";
const char* const kCorruptHint = "the header is corrupt; re-download or re-export the file";

[[noreturn]] void file_fail(const std::string& path, const std::string& what, const std::string& hint) {
  fail("[safetensors] ", path, ": ", what, " (", hint, ")");
}

[[noreturn]] void tensor_fail(const std::string& path, const std::string& name, const std::string& what,
                              const std::string& hint) {
  fail("[safetensors] ", path, ": tensor '", name, "': ", what, " (", hint, ")");
}

bool dtype_parse(const std::string& s, DType* d) {
  if (s == "F32")
    *d = DType::f32;
  else if (s == "BF16")
    *d = DType::bf16;
  else if (s == "F16")
    *d = DType::f16;
  else if (s == "U8")
    *d = DType::u8;
  else
    return false;
  return true;
}

// numel of a shape of non-negative dims; false on int64 overflow. A zero dim
// makes numel 0 whatever the other dims are.
bool shape_numel(const std::vector<int64_t>& shape, int64_t* out) {
  for (int64_t d : shape)
    if (d == 0) {
      *out = 0;
      return true;
    }
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  *out = n;
  return true;
}

// Parses JSON and reports the first duplicate key: nlohmann keeps only one.
// On success returns the value; on a parse error or duplicate, fails naming `path`.
// `what` names the document ("header"), `top_noun` its top-level keys ("tensor").
json json_parse_strict(const char* begin, const char* end, const std::string& path, const char* what,
                       const char* top_noun) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string top_key, dup;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (keys.size() == 1) top_key = k;
      if (!keys.back().insert(k).second && dup.empty())
        dup = keys.size() == 1 ? cat(top_noun, " '", k, "' appears twice")
                               : cat("key '", k, "' appears twice inside '", top_key, "'");
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, cb);
  } catch (const json::exception& e) {
    file_fail(path, cat(what, " is not valid JSON: ", e.what()),
              "the file is truncated or corrupt; re-download or re-export it");
  }
  if (!dup.empty()) file_fail(path, cat(what, ": ", dup), "each key must appear once; re-export the file");
  return j;
}

// A JSON integer >= 0 that fits int64, or false.
bool json_nonneg_int(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = s;
    return true;
  }
  return false;
}

struct Span {
  uint64_t begin, end;
  size_t tensor;
};

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::u8:
      return "U8";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::f32 ? 4 : d == DType::u8 ? 1 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated against overflow when opened
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->map_ = MappedFile(path);
  const std::string& p = f->map_.path();
  const uint8_t* base = f->map_.data();
  const uint64_t size = f->map_.size();

  if (size < 8) file_fail(p, cat("file has ", size, " bytes, shorter than the 8-byte header length"), kTruncatedHint);
  uint64_t n;
  std::memcpy(&n, base, 8);
  if (n > size - 8)
    file_fail(p, cat("header length ", n, " runs past the end of the file (", size, " bytes)"), kTruncatedHint);
  if (n > kMaxHeaderBytes)
    file_fail(p, cat("header length ", n, " is absurdly large (limit ", kMaxHeaderBytes, ")"), kTruncatedHint);
  const char* hb = reinterpret_cast<const char*>(base + 8);
  json header = json_parse_strict(hb, hb + n, p, "header", "tensor");
  if (!header.is_object())
    file_fail(p, cat("header is a JSON ", header.type_name(), ", not an object"), kTruncatedHint);

  const uint8_t* data = base + 8 + n;
  const uint64_t data_size = size - 8 - n;
  std::vector<Span> spans;
  f->tensors_.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        file_fail(p, cat("__metadata__ is a JSON ", entry.type_name(), ", not an object"),
                  "metadata must map strings to strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          file_fail(p, cat("__metadata__ value for '", k, "' is a JSON ", v.type_name(), ", not a string"),
                    "metadata must map strings to strings");
        f->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object())
      tensor_fail(p, name, cat("entry is a JSON ", entry.type_name(), ", not an object"),
                  "expected {\"dtype\", \"shape\", \"data_offsets\"}");
    TensorInfo t;
    t.name = name;
    t.file = &f->map_.path();

    auto it = entry.find("dtype");
    if (it == entry.end() || !it->is_string()) tensor_fail(p, name, "missing or non-string \"dtype\"", kSupported);
    const std::string ds = it->get<std::string>();
    if (!dtype_parse(ds, &t.dtype))
      tensor_fail(p, name, cat(ds, " is not supported"), cat(kSupported, "; convert the checkpoint"));

    it = entry.find("shape");
    const auto shape_it = it;
    if (it == entry.end() || !it->is_array())
      tensor_fail(p, name, "missing or non-array \"shape\"", "shape must be an array of non-negative integers");
    for (const auto& d : *it) {
      int64_t v;
      if (!json_nonneg_int(d, &v))
        tensor_fail(p, name, cat("shape ", it->dump(), " has an invalid dimension ", d.dump()),
                    "shape must be an array of non-negative integers");
      t.shape.push_back(v);
    }

    it = entry.find("data_offsets");
    int64_t ob = 0, oe = 0;
    if (it == entry.end() || !it->is_array() || it->size() != 2 || !json_nonneg_int((*it)[0], &ob) ||
        !json_nonneg_int((*it)[1], &oe))
      tensor_fail(p, name, "missing or invalid \"data_offsets\"", "expected [begin, end], non-negative integers");
    if (ob > oe) tensor_fail(p, name, cat("data_offsets [", ob, ", ", oe, "] end before begin"), kCorruptHint);
    if (static_cast<uint64_t>(oe) > data_size)
      tensor_fail(p, name, cat("data_offsets [", ob, ", ", oe, "] past the data section (", data_size, " bytes)"),
                  kTruncatedHint);

    int64_t numel, nbytes;
    if (!shape_numel(t.shape, &numel) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(t.dtype)), &nbytes))
      tensor_fail(p, name, cat("shape ", shape_it->dump(), " overflows"), kCorruptHint);
    if (nbytes != oe - ob)
      tensor_fail(p, name,
                  cat(ds, " x ", numel, " elements = ", nbytes, " bytes but data_offsets span ", oe - ob, " bytes"),
                  kCorruptHint);
    t.data = data + ob;
    t.nbytes = static_cast<size_t>(nbytes);
    spans.push_back({static_cast<uint64_t>(ob), static_cast<uint64_t>(oe), f->tensors_.size()});
    f->tensors_.push_back(std::move(t));
  }

  // Overlaps: sort by begin; every non-empty tensor must start at or after the
  // furthest end so far.
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  uint64_t max_end = 0;
  size_t max_owner = 0;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (s.begin < max_end)
      tensor_fail(p, f->tensors_[s.tensor].name,
                  cat("data_offsets [", s.begin, ", ", s.end, "] overlap tensor '", f->tensors_[max_owner].name, "'"),
                  kCorruptHint);
    max_end = s.end;
    max_owner = s.tensor;
  }
  std::vector<TensorInfo> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(f->tensors_[s.tensor]));
  f->tensors_ = std::move(ordered);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsModel SafetensorsModel::open(const std::string& dir_or_file) {
  SafetensorsModel m;
  m.source_ = dir_or_file;
  std::string single, index;
  if (is_directory(dir_or_file)) {
    // Same preference as transformers: model.safetensors before the index.
    std::string s = path_join(dir_or_file, "model.safetensors");
    std::string i = path_join(dir_or_file, "model.safetensors.index.json");
    if (file_exists(s))
      single = s;
    else if (file_exists(i))
      index = i;
    else {
      namespace fs = std::filesystem;
      std::error_code ec;
      for (const std::string& f : {s, i}) {  // there, but not a readable file
        const fs::file_status st = fs::symlink_status(f, ec);
        if (ec || !fs::exists(st)) continue;
        if (fs::is_symlink(st) && !fs::exists(f, ec))
          fail("[safetensors] ", f, " is a symbolic link to a missing file (", fs::read_symlink(f, ec).string(),
               "): an incomplete download; fetch the model again");
        fail("[safetensors] ", f, " is ", fs::is_directory(fs::status(f, ec)) ? "a directory" : "not a regular file",
             ", not a weights file");
      }
      std::string others;  // weights under another name
      for (auto it = fs::directory_iterator(dir_or_file, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
        if (it->path().extension() == ".safetensors")
          others += (others.empty() ? "" : ", ") + it->path().filename().string();
      if (!others.empty())
        fail("[safetensors] ", dir_or_file, " holds ", others, " but neither model.safetensors nor ",
             "model.safetensors.index.json, the names transformers writes: rename a single weights file to "
             "model.safetensors, or write the index that maps tensors to the shards");
      fail("[safetensors] no weights in ", dir_or_file, ": looked for ", s, " and ", i,
           " (a Hugging Face model directory holds model.safetensors, or model.safetensors.index.json and its shards)");
    }
  } else if (file_exists(dir_or_file)) {
    const std::string suffix = ".index.json";
    bool is_index = dir_or_file.size() >= suffix.size() &&
                    dir_or_file.compare(dir_or_file.size() - suffix.size(), suffix.size(), suffix) == 0;
    (is_index ? index : single) = dir_or_file;
  } else {
    fail("[safetensors] ", dir_or_file, " does not exist (give a model directory or a .safetensors file)");
  }

  if (!single.empty()) {
    m.files_.push_back(SafetensorsFile::open(single));
  } else {
    std::string text = read_text_file(index);
    json j = json_parse_strict(text.data(), text.data() + text.size(), index, "index", "key");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      file_fail(index, "no \"weight_map\" object", "expected {\"weight_map\": {tensor: shard file}}");
    const json& wm = j["weight_map"];
    if (wm.empty()) file_fail(index, "\"weight_map\" is empty", "the index lists no tensors; re-export the model");
    std::map<std::string, SafetensorsFile*> shards;
    const std::string dir = path_dirname(index);
    for (const auto& [name, shard] : wm.items()) {
      if (!shard.is_string())
        file_fail(index, cat("weight_map entry '", name, "' is a JSON ", shard.type_name(), ", not a file name"),
                  "expected {\"weight_map\": {tensor: shard file}}");
      const std::string sname = shard.get<std::string>();
      if (sname.empty() || sname.find('/') != std::string::npos || sname.find('\\') != std::string::npos ||
          sname == "." || sname == "..")
        file_fail(index, cat("weight_map entry '", name, "' names the shard '", sname, "', not a file of this directory"),
                  "shards are files beside the index (e.g. model-00001-of-00002.safetensors)");
      auto it = shards.find(sname);
      if (it == shards.end()) {
        std::string sp = path_join(dir, sname);
        if (!file_exists(sp))
          file_fail(index, cat("shard ", sp, " (for tensor '", name, "') does not exist"),
                    "the download is incomplete; fetch every shard named in the index");
        m.files_.push_back(SafetensorsFile::open(sp));
        it = shards.emplace(sname, m.files_.back().get()).first;
      }
      if (!it->second->find(name))
        file_fail(index,
                  cat("tensor '", name, "' is mapped to shard ", it->second->path(), " which does not contain it"),
                  "the index and shards do not match; re-download the model");
    }
  }

  for (const auto& f : m.files_)
    for (const TensorInfo& t : f->tensors()) {
      auto [it, fresh] = m.by_name_.emplace(t.name, &t);
      if (!fresh)
        fail("[safetensors] ", m.source_, ": tensor '", t.name, "' appears in both ", *it->second->file, " and ",
             *t.file, " (shards must not repeat tensors; re-export the model)");
    }
  if (m.by_name_.empty()) fail("[safetensors] ", m.source_, " contains no tensors (point to a model with weights)");
  return m;
}

const TensorInfo* SafetensorsModel::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& SafetensorsModel::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t)
    fail("[safetensors] ", source_, ": no tensor '", name, "' (", by_name_.size(),
         " tensors present; the checkpoint does not match the model family's weight map)");
  return *t;
}

std::vector<const TensorInfo*> SafetensorsModel::all() const {
  std::vector<const TensorInfo*> v;
  v.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) v.push_back(t);
  return v;
}

void tensor_to_f32(const TensorInfo& t, float* out) {
  const int64_t n = t.numel();
  if (n == 0) return;  // a zero-size tensor (a dim of 0): nothing to convert, and out may be null
  const uint8_t* src = t.data;
  const DType dt = t.dtype;
  if (dt == DType::u8)
    fail("[safetensors] ", t.file ? *t.file : std::string("?"), ": tensor '", t.name,
         "' holds raw U8 bytes, not weights (a ramtrain checkpoint's quantized moments?)");
  auto convert = [src, dt, out](int64_t b, int64_t e) {
    if (dt == DType::f32) {
      std::memcpy(out + b, src + 4 * b, static_cast<size_t>(e - b) * 4);
      return;
    }
    for (int64_t i = b; i < e; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = dt == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  };
  if (n <= kConvertGrain)
    convert(0, n);
  else
    parallel_for(n, kConvertGrain, convert);
}

namespace {

struct WritePlan {
  std::vector<int64_t> numel, nbytes;  // per tensor; nbytes in the target dtype
  uint64_t total = 0;
};

WritePlan write_plan(const std::string& path, const std::vector<TensorWrite>& tensors) {
  WritePlan plan;
  std::set<std::string> names;
  for (const TensorWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail("[safetensors] writing ", path, ": invalid tensor name '", t.name,
           "' (names must be non-empty and not __metadata__)");
    if (!names.insert(t.name).second)
      fail("[safetensors] writing ", path, ": tensor '", t.name, "' given twice (names must be unique)");
    if (t.dtype == DType::u8 && !t.raw)
      fail("[safetensors] writing ", path, ": tensor '", t.name, "': U8 cannot be converted from fp32");
    for (int64_t d : t.shape)
      if (d < 0) fail("[safetensors] writing ", path, ": tensor '", t.name, "' has negative dimension ", d);
    int64_t numel, nb;
    if (!shape_numel(t.shape, &numel) || __builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(t.dtype)), &nb))
      fail("[safetensors] writing ", path, ": tensor '", t.name, "' shape overflows int64");
    if (!t.runs.empty()) {
      int64_t sum = 0;
      for (const auto& r : t.runs) {
        if (r.numel < 0 || (r.numel > 0 && !r.data))
          fail("[safetensors] writing ", path, ": tensor '", t.name, "' has a run without data");
        sum += r.numel;
      }
      if (sum != numel)
        fail("[safetensors] writing ", path, ": tensor '", t.name, "' runs hold ", sum, " elements, its shape ",
             numel);
    } else if (numel > 0 && !t.data && !t.raw && !t.fill) {
      fail("[safetensors] writing ", path, ": tensor '", t.name, "' has no data");
    }
    if (__builtin_add_overflow(plan.total, static_cast<uint64_t>(nb), &plan.total))
      fail("[safetensors] writing ", path, ": total size overflows");
    plan.numel.push_back(numel);
    plan.nbytes.push_back(nb);
  }
  return plan;
}

void write_file(const std::string& path, const std::vector<TensorWrite>& tensors, const WritePlan& plan,
                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorWrite& t = tensors[i];
    h[t.name] = {{"dtype", dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {off, off + static_cast<uint64_t>(plan.nbytes[i])}}};
    off += static_cast<uint64_t>(plan.nbytes[i]);
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("[safetensors] writing ", path, ": cannot encode the header (", e.what(), "; names must be UTF-8)");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  AtomicFile out(path);
  out.write(&n, 8);
  out.write(text);
  std::vector<uint16_t> buf;
  std::vector<float> made;  // a tensor made by its fill
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorWrite& t = tensors[k];
    if (plan.numel[k] == 0) continue;
    if (t.raw) {
      out.write(t.raw, static_cast<size_t>(plan.nbytes[k]));
      continue;
    }
    std::vector<TensorWrite::Run> runs = t.runs;
    if (runs.empty() && !t.data && t.fill) {
      made.resize(static_cast<size_t>(plan.numel[k]));
      t.fill(made.data());
      runs.push_back({made.data(), plan.numel[k]});
    }
    if (runs.empty()) runs.push_back({t.data, plan.numel[k]});
    for (const TensorWrite::Run& run : runs) {
      const int64_t numel = run.numel;
      if (numel == 0) continue;
      if (t.dtype == DType::f32) {
        out.write(run.data, static_cast<size_t>(numel) * 4);
        continue;
      }
      buf.resize(std::max(buf.size(), static_cast<size_t>(std::min(numel, kWriteChunk))));
      const bool bf = t.dtype == DType::bf16;
      for (int64_t c = 0; c < numel; c += kWriteChunk) {
        const int64_t len = std::min(kWriteChunk, numel - c);
        const float* src = run.data + c;
        uint16_t* dst = buf.data();
        auto convert = [src, dst, bf](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) dst[i] = bf ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
        };
        if (len <= kConvertGrain)
          convert(0, len);
        else
          parallel_for(len, kConvertGrain, convert);
        out.write(dst, static_cast<size_t>(len) * 2);
      }
    }
  }
  out.commit();
}

}  // namespace

std::vector<float> tensor_write_gather(const TensorWrite& t, int64_t numel) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(numel));
  if (t.runs.empty() && !t.data && t.fill) {
    out.resize(static_cast<size_t>(numel));
    t.fill(out.data());
    return out;
  }
  if (t.runs.empty()) return std::vector<float>(t.data, t.data + numel);
  for (const auto& r : t.runs) out.insert(out.end(), r.data, r.data + r.numel);
  RT_CHECK(static_cast<int64_t>(out.size()) == numel, "[safetensors] tensor '", t.name, "' runs hold ", out.size(),
           " elements, expected ", numel);
  return out;
}

void safetensors_write(const std::string& path, const std::vector<TensorWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  WritePlan plan = write_plan(path, tensors);
  write_file(path, tensors, plan, metadata);
}

void safetensors_write_model(const std::string& dir, const std::vector<TensorWrite>& tensors,
                             uint64_t max_shard_bytes) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::string single = path_join(dir, "model.safetensors");
  const std::string index = path_join(dir, "model.safetensors.index.json");
  WritePlan plan = write_plan(dir, tensors);
  make_dirs(dir);
  if (max_shard_bytes == 0 || plan.total <= max_shard_bytes) {
    write_file(single, tensors, plan, meta);
    ::unlink(index.c_str());  // a stale index would describe other weights
    return;
  }
  // Greedy in the given order; a tensor bigger than the limit gets its own shard.
  std::vector<std::vector<size_t>> groups;
  uint64_t cur = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nb = static_cast<uint64_t>(plan.nbytes[i]);
    if (groups.empty() || (!groups.back().empty() && cur + nb > max_shard_bytes)) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(i);
    cur += nb;
  }
  json weight_map = json::object();
  char name[64];
  for (size_t g = 0; g < groups.size(); ++g) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
    std::vector<TensorWrite> part;
    WritePlan part_plan;
    for (size_t i : groups[g]) {
      part.push_back(tensors[i]);
      part_plan.numel.push_back(plan.numel[i]);
      part_plan.nbytes.push_back(plan.nbytes[i]);
      weight_map[tensors[i].name] = name;
    }
    write_file(path_join(dir, name), part, part_plan, meta);
  }
  json idx = {{"metadata", {{"total_size", plan.total}}}, {"weight_map", weight_map}};
  write_file_atomic(index, idx.dump(2) + "\n");
  ::unlink(single.c_str());  // a stale model.safetensors would shadow the index
}

}  // namespace rt
