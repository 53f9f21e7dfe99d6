// libFuzzer: the fine-tuning dataset parsers on arbitrary bytes, as .jsonl
// (text, instruction and chat records rendered in ChatML with loss masks) and
// as plain text split by blank lines, both with bad records skipped and
// counted, then packed into rows. The tokenizer is the committed Qwen2-layout
// fixture (RAMTRAIN_FUZZ_TOKENIZER overrides its directory). Contract:
// rt::Error or success, never a read outside a mapping, a crash or UB.
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "data/chat_format.h"
#include "data/finetune.h"
#include "data/records.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {
std::unique_ptr<rt::Tokenizer> g_tok;
std::unique_ptr<rt::ChatTemplate> g_chat;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rt::set_global_threads(1);
  const char* dir = std::getenv("RAMTRAIN_FUZZ_TOKENIZER");
  g_tok = rt::tokenizer_load(dir ? dir : RAMTRAIN_FUZZ_FIXTURE_DIR "/tokenizers/qwen2");
  g_chat = std::make_unique<rt::ChatTemplate>(*g_tok, rt::ChatFormat::chatml);
  return 0;
}

namespace {
void run(const std::string& path, bool jsonl, int64_t T, bool pack) {
  try {
    rt::ExampleEncoder enc(*g_tok, g_chat.get(), "", !jsonl, true);
    rt::FinetuneOptions o;
    o.seq_len = T;
    o.val_fraction = 0;
    o.pack = pack;
    o.records.format = jsonl ? rt::DataFormat::jsonl : rt::DataFormat::text;
    o.records.bad_records = rt::BadRecordPolicy::skip;
    o.records.max_warnings = 0;
    rt::FinetuneDataset ds({path}, enc, o);
    for (int i = 0; i < 3; ++i) ds.next_batch(2);
    ds.set_cursor(ds.cursor());
  } catch (const rt::Error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int64_t T = 4 + (size ? data[0] % 29 : 0);
  const bool pack = size > 1 && (data[1] & 1);
  run(rt::fuzz::input_file(data, size, ".jsonl"), true, T, pack);
  run(rt::fuzz::input_file(data, size, ".txt"), false, T, !pack);
  return 0;
}
