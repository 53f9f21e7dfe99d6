// libFuzzer: the checkpoint's own files, manifest.json and trainer.json.
// Contract: rt::Error or success; an accepted manifest writes back to a text
// that parses to the same entries, and so does an accepted trainer.json.
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    rt::CheckpointManifest m = rt::manifest_parse(text, "fuzz/manifest.json");
    rt::CheckpointManifest b = rt::manifest_parse(rt::manifest_to_json(m), "fuzz/round-trip");
    if (b.step != m.step || b.files.size() != m.files.size()) __builtin_trap();
  } catch (const rt::Error&) {
  }
  try {
    rt::TrainerCheckpoint c = rt::trainer_checkpoint_parse(text, "fuzz/trainer.json");
    rt::TrainerCheckpoint d = rt::trainer_checkpoint_parse(rt::trainer_checkpoint_to_json(c), "fuzz/round-trip");
    if (d.step != c.step || !(d.cursor == c.cursor) || d.run.run_config != c.run.run_config) __builtin_trap();
  } catch (const rt::Error&) {
  }
  return 0;
}
