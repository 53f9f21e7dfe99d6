// libFuzzer: the data readers on arbitrary bytes: token files (ramtrain, llm.c
// and nanoGPT .bin), the text-ids format of `ramtrain loss --tokens`, the data
// cursor of checkpoints, and a Dataset over whatever stream opened. Contract:
// rt::Error or success, never a read outside a mapping or UB.
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "fuzz_util.h"
#include "io/token_file.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rt::set_global_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bin = rt::fuzz::input_file(data, size, ".bin");
  try {
    rt::TokenStream ts = rt::TokenStream::open(bin);
    ts.validate_ids(1u << 20);
    if (ts.size() > 1) {
      rt::DatasetOptions o;
      o.seq_len = static_cast<int64_t>(std::min<uint64_t>(ts.size() - 1, 1 + data[0] % 8));
      o.val_fraction = 0;
      o.seed = size;
      rt::Dataset d(std::move(ts), o);
      for (int i = 0; i < 3; ++i) d.next_batch(2);
      rt::DataCursor c = d.cursor();
      d.set_cursor(rt::DataCursor::parse(c.to_string()));
    }
  } catch (const rt::Error&) {
  }
  const std::string txt = rt::fuzz::input_file(data, size, ".txt");
  try {
    rt::TokenSequences s = rt::token_text_read(txt);
    s.validate_ids(1000);
  } catch (const rt::Error&) {
  }
  try {
    rt::DataCursor c = rt::DataCursor::parse(std::string(reinterpret_cast<const char*>(data), size));
    if (!(rt::DataCursor::parse(c.to_string()) == c)) __builtin_trap();
  } catch (const rt::Error&) {
  }
  return 0;
}
