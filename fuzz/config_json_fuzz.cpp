// libFuzzer: config.json parsing (spec_from_config_text). Contract: a config
// is accepted or refused with rt::Error; an accepted one validates, and its
// spec_to_config_json re-parses to the same config (round trip).
#include <string>

#include "core/error.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  rt::ModelSpec s;
  try {
    s = rt::spec_from_config_text(text, "fuzz/config.json");
  } catch (const rt::Error&) {
    return 0;
  }
  const std::string again = rt::spec_to_config_json(s);
  rt::ModelSpec t = rt::spec_from_config_text(again, "fuzz/round-trip");  // must not throw
  if (rt::spec_to_config_json(t) != again) __builtin_trap();
  return 0;
}
