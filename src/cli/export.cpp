// ramtrain export: a checkpoint's master weights as a HF model directory
// (config.json, safetensors sharded with an index when over --max-shard-size,
// and the tokenizer files: ramtrain_tokenizer.json for byte-level runs, the
// source model directory's tokenizer files for runs started from --model).
// The checkpoint is verified (every checksum) before anything is written.
// --out is locked while it is written (core/run_lock.h), and so is the run
// directory when --out is its final/ (which the run's trainer writes); an --out
// that holds checkpoints or the checkpoint itself is refused: the export
// replaces --out as a whole.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/run_lock.h"
#include "io/checkpoint.h"
#include "io/hf_export.h"

namespace rt::cli {

int cmd_export(const Args& args) {
  ArgParser p("export",
              "Writes the master weights of a checkpoint (DIR/ckpt-<step>, written by 'ramtrain train') as a HF\n"
              "model directory that transformers, 'ramtrain loss' and 'ramtrain sample' load. CKPT may also be a\n"
              "run's output directory: its newest valid checkpoint is exported.",
              "  ramtrain export runs/demo/ckpt-00000300 --out runs/demo/hf-300\n"
              "  ramtrain export runs/ft --out runs/ft/hf --dtype bf16 --max-shard-size 5G\n"
              "  ramtrain export --out runs/demo/hf runs/demo\n");
  p.option("checkpoint", "CKPT", "the checkpoint directory, or a run directory (its newest valid checkpoint)")
      .as_positional();
  p.option("out", "HFDIR", "the HF model directory to write");
  p.option("dtype", "bf16|fp32", "dtype of the exported weights", "bf16").choice({"bf16", "fp32"});
  p.option("max-shard-size", "SIZE", "split the safetensors into shards of at most SIZE (e.g. 5G) with an index", "0")
      .size();
  p.flag("text-only",
         "a run of a Gemma3ForConditionalGeneration whose model directory is gone: export the language model alone "
         "(Gemma3ForCausalLM; the vision tower cannot be carried without the directory)");
  if (!p.parse(args)) return 0;
  const std::string ckpt = p.require("checkpoint");
  const std::string out = p.require("out");
  const std::string dt = p.str("dtype");
  if (dt != "bf16" && dt != "fp32") fail("[export] --dtype must be bf16 or fp32, got '", dt, "'");
  if (!is_directory(ckpt)) fail("[export] ", ckpt, " is not a directory: give a checkpoint (DIR/ckpt-<step>)");

  std::string dir = ckpt;
  if (!file_exists(path_join(ckpt, "manifest.json"))) {
    std::vector<std::string> warnings;
    std::optional<CheckpointRef> ref = checkpoint_find_latest_valid(ckpt, &warnings);
    for (auto& w : warnings) std::printf("warning: %s\n", w.c_str());
    if (!ref && (file_exists(path_join(ckpt, "trainer.json")) ||
                 std::filesystem::path(ckpt).filename().string().rfind("ckpt-", 0) == 0))
      fail("[export] ", ckpt, " looks like a checkpoint but has no ", path_join(ckpt, "manifest.json"),
           " (written last, when a checkpoint is complete): it is incomplete or damaged; export another checkpoint");
    if (!ref) fail("[export] ", ckpt, " is neither a checkpoint nor a run directory holding a valid one");
    dir = ref->path;
    std::printf("exporting the newest valid checkpoint %s\n", dir.c_str());
  } else {
    const std::string why = checkpoint_verify(dir);
    if (!why.empty()) fail("[export] ", dir, " is not a valid checkpoint: ", why);
  }
  std::string clean = out;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  {
    namespace fs = std::filesystem;
    std::error_code ea, ec;
    const fs::path a = fs::weakly_canonical(clean, ea), c = fs::weakly_canonical(dir, ec);
    if (!ea && !ec && !a.empty() && std::mismatch(a.begin(), a.end(), c.begin(), c.end()).first == a.end())
      fail("[export] --out ", out, " is or holds the checkpoint ", dir,
           ", which the export would replace: pick another --out");
    if (!checkpoint_list(clean).empty())
      fail("[export] --out ", out, " holds training checkpoints (", checkpoint_list(clean).back().path,
           "), which the export would replace: pick another --out, e.g. ", path_join(clean, "hf"));
    if (file_exists(clean)) fail("[export] --out ", out, " is a file: give a directory for the HF model");
  }
  // final/ of a run directory is the trainer's to write while it runs.
  RunLock run_lock;
  if (std::filesystem::path(clean).filename() == "final" && is_directory(path_dirname(clean)))
    run_lock = RunLock::acquire(path_dirname(clean), "[export]", "run directory");
  RunLock out_lock = RunLock::acquire(clean, "[export]", "--out");
  // The export replaces --out as a whole: only an earlier export (its
  // ramtrain.json) or an empty directory (our lock file aside) may be replaced.
  if (is_directory(clean) && !file_exists(path_join(clean, "ramtrain.json"))) {
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(clean, ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name == ".ramtrain.lock") continue;
      fail("[export] --out ", out, " is a directory holding other files (", name,
           "), which the export would delete: pick another --out, e.g. ", path_join(clean, "hf"), ", or empty it");
    }
  }
  TrainerCheckpoint meta = checkpoint_read_trainer(dir);
  HostState state(checkpoint_read_spec(dir), false);
  checkpoint_load_state(dir, state, false);

  ExportOptions eo;
  eo.dtype = dt == "bf16" ? DType::bf16 : DType::f32;
  eo.max_shard_bytes = p.size_bytes("max-shard-size");
  eo.tokenizer = meta.run.tokenizer == "byte" ? "byte" : "";
  if (!meta.run.source_model_dir.empty()) {
    if (is_directory(meta.run.source_model_dir)) {
      eo.copy_from_dir = meta.run.source_model_dir;
      eo.copy_files = hf_tokenizer_files(meta.run.source_model_dir);
      eo.source_model_dir = meta.run.source_model_dir;
    } else if (meta.run.source_multimodal && !p.on("text-only")) {
      fail("[export] the run's model directory ", meta.run.source_model_dir,
           " (a Gemma3ForConditionalGeneration) is gone: its vision tower and projector are carried from there. "
           "Restore the directory and export again, or pass --text-only to export the language model alone "
           "(Gemma3ForCausalLM)");
    } else if (meta.run.tokenizer != "byte" || state.spec().family == Family::gemma3) {
      std::printf("warning: the run's model directory %s is gone: no tokenizer files are copied%s\n",
                  meta.run.source_model_dir.c_str(),
                  meta.run.source_multimodal ? "; --text-only: the language model alone (Gemma3ForCausalLM)"
                  : state.spec().family == Family::gemma3
                      ? "; if it was a Gemma3ForConditionalGeneration (a checkpoint from before ramtrain recorded "
                        "that), its vision tower cannot be carried either and this export is the language model "
                        "alone (Gemma3ForCausalLM): restore the directory to export the multimodal model"
                      : "");
    }
  }
  eo.info["step"] = std::to_string(meta.step);
  eo.info["checkpoint"] = dir;
  eo.info["data_cursor"] = meta.cursor.to_string();
  for (auto& [k, v] : meta.run.run_config) eo.info["config." + k] = v;
  export_hf_dir(out, state, eo);
  std::printf("exported %s (step %lld, %lld params, %s) to %s\n", dir.c_str(), (long long)meta.step,
              (long long)state.n_params(), dt.c_str(), out.c_str());
  return 0;
}

}  // namespace rt::cli
