// libFuzzer: the chat-template renderer (data/jinja_template.h) on arbitrary
// template text, rendered against a small fixed conversation. Templates come
// from model directories, so the contract is: rt::Error or a rendering, never
// a crash, a hang or an unbounded allocation.
#include <string>

#include "core/error.h"
#include "data/hf_chat_template.h"
#include "data/jinja_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // bounds the work a loop over range() can do per input
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi ü"},
          {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}])");
  try {
    rt::jinja::Template tpl(text, "fuzz");
    tpl.set_clock([] { return std::time_t(0); });
    rt::jinja::Object specials;
    specials.set("bos_token", rt::jinja::Value::string("<s>"));
    (void)tpl.render(rt::hf_chat_vars(messages, nullptr, true, specials));
  } catch (const rt::Error&) {
  }
  return 0;
}
