// libFuzzer: the safetensors reader on arbitrary bytes. Contract: every input
// either opens (and then every tensor converts to fp32 without reading outside
// the mapping: ASan checks) or throws rt::Error; nothing else escapes.
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rt::set_global_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = rt::fuzz::input_file(data, size, ".safetensors");
  try {
    auto f = rt::SafetensorsFile::open(path);
    std::vector<float> out;
    for (const rt::TensorInfo& t : f->tensors()) {
      if (t.numel() > (1 << 20)) continue;
      out.resize(static_cast<size_t>(t.numel()));
      rt::tensor_to_f32(t, out.data());
    }
  } catch (const rt::Error&) {
  }
  return 0;
}
