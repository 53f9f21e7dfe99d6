// safetensors: a zero-copy mmap reader (single file or sharded through
// model.safetensors.index.json) and an atomic writer.
// The header is validated strictly: 8-byte length within the file, valid JSON
// object, every entry with a known dtype, a shape of non-negative ints and
// data_offsets [begin, end] inside the data section, dtype size x numel equal
// to end - begin, no two tensors overlapping. Every violation throws rt::Error
// naming the file and the tensor.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/fs.h"

namespace rt {

enum class DType { f32, bf16, f16, u8 };  // u8: raw bytes (checkpoints' quantized moments), never converted
const char* dtype_name(DType d);          // "F32", "BF16", "F16", "U8"
size_t dtype_size(DType d);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t nbytes = 0;
  const std::string* file = nullptr;  // the file it lives in
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);  // throws rt::Error
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return map_.path(); }

 private:
  MappedFile map_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights: DIR/model.safetensors, or DIR/model.safetensors.index.json
// with its shards, or a single .safetensors path.
class SafetensorsModel {
 public:
  static SafetensorsModel open(const std::string& dir_or_file);  // throws rt::Error
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws naming the tensor
  std::vector<const TensorInfo*> all() const;            // sorted by name
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
};

// Converts a tensor of any supported dtype into fp32 (out has numel floats).
void tensor_to_f32(const TensorInfo& t, float* out);

struct TensorWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;  // fp32 source; converted to `dtype` while writing
  DType dtype = DType::f32;
  // When non-empty, the tensor is these runs end to end instead of `data`
  // (a fused tensor written from separate weights, without a copy).
  struct Run {
    const float* data;
    int64_t numel;
  };
  std::vector<Run> runs{};
  // When set, the tensor's stored bytes (dtype x numel of them, e.g. a source
  // checkpoint's tensor carried through an export), written as they are.
  const uint8_t* raw = nullptr;
  // When set (and runs empty), the tensor's numel elements are made on demand
  // into a buffer the writer owns, one tensor at a time (a fused tensor whose
  // parts are interleaved or transposed, model/weight_map.h).
  std::function<void(float* out)> fill{};
};
// A TensorWrite's elements in order (its data, or its runs gathered).
std::vector<float> tensor_write_gather(const TensorWrite& t, int64_t numel);

// Writes one .safetensors file atomically (tmp, fsync, rename). Tensors are
// stored in the given order, 8-byte aligned header as the format requires.
void safetensors_write(const std::string& path, const std::vector<TensorWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes DIR/model.safetensors, or shards model-0000k-of-0000n.safetensors plus
// model.safetensors.index.json when the total exceeds max_shard_bytes (0: no limit).
void safetensors_write_model(const std::string& dir, const std::vector<TensorWrite>& tensors,
                             uint64_t max_shard_bytes = 0);

}  // namespace rt
