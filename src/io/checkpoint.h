// Checkpoints: everything a training run needs to continue exactly, in one
// directory per save, written atomically, verified by checksum on load.
//   OUT/ckpt-00000120/
//     state-<unit>.safetensors  per HostState unit (embed, layer.0.., head):
//                               fp32 "master/<hf name>", "adam_m/<hf name>",
//                               "adam_v/<hf name>" (canonical weight-map order);
//                               lean states as held: quantized moments, a bf16
//                               master and its Kahan compensation bit for bit
//                               (io/checkpoint_unit.h)
//     config.json               the model (spec_to_config_json)
//     trainer.json              step, Adam step count, skipped-step counter,
//                               bad-step streak, data cursor, seed, the data's
//                               identity (paths, token counts, fingerprint), the
//                               source model dir and tokenizer, and the resolved
//                               run configuration (every option and its value)
//     manifest.json             format/version/step, {file: {bytes, xxh3_64}},
//                               and manifest_xxh3_64: the XXH3-64 of manifest.json
//                               itself with that value written as 16 zeros
// RNG state: there is none to save. Init is counter-based (seed only) and the
// data order is window_order(seed, epoch), a pure function of seed + cursor;
// the LR schedule position is the step.
// Atomicity: files are written into OUT/.tmp-ckpt-<step>.<pid>, fsync'ed with
// the directory, which is then renamed to OUT/ckpt-<step> and OUT fsync'ed. A
// crash leaves either the old set of checkpoints or the new one plus, at worst,
// a .tmp-ckpt-* directory that the next writer removes (when its pid is dead).
// Test hooks (environment, read at every save): RAMTRAIN_INJECT_WRITE_FAIL_AFTER_BYTES=n
// makes the checkpoint byte stream of this process fail like a full disk once n
// bytes are written; RAMTRAIN_INJECT_KILL_AFTER_BYTES=n SIGKILLs the process there.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint_unit.h"
#include "io/data_cursor.h"
#include "io/token_file.h"
#include "model/spec.h"
#include "state/host_state.h"

namespace rt {

// What identifies a run's data and configuration (compared on resume).
struct RunIdentity {
  uint64_t seed = 0;
  std::vector<std::string> data_paths;  // absolute
  uint64_t train_tokens = 0, val_tokens = 0, train_windows = 0;
  uint64_t data_fingerprint = 0;                  // dataset_fingerprint
  std::string source_model_dir;                   // absolute; "" when started from a preset
  bool source_multimodal = false;                 // it held a Gemma3ForConditionalGeneration (export carries its tower)
  std::string tokenizer;                          // "byte", "hf" or ""
  std::map<std::string, std::string> run_config;  // ArgParser::resolved()
};

// The trainer's scalar state after `step` optimizer steps.
struct TrainerCheckpoint {
  int64_t step = 0;
  int64_t adam_t = 0;        // applied updates (bias correction count)
  int64_t skipped = 0;       // steps skipped for a non-finite loss or norm
  int64_t bad_in_a_row = 0;  // current streak of skipped steps
  int64_t bad_since = 0;     // first step of that streak (0: none)
  DataCursor cursor;         // the next train window
  RunIdentity run;
};
std::string trainer_checkpoint_to_json(const TrainerCheckpoint& c);
TrainerCheckpoint trainer_checkpoint_parse(const std::string& text,
                                           const std::string& source);  // throws "[checkpoint] ..."

struct ManifestEntry {
  uint64_t bytes = 0;
  uint64_t xxh3_64 = 0;
};
struct CheckpointManifest {
  int64_t step = 0;
  std::map<std::string, ManifestEntry> files;  // file name -> size and checksum
};
// The manifest text, self-checksum included.
std::string manifest_to_json(const CheckpointManifest& m);
// Strict: valid JSON, format "ramtrain-checkpoint" version 1, the self-checksum
// matches, file names are plain (no '/', not "." or ".."); throws "[checkpoint] <source>: ...".
CheckpointManifest manifest_parse(const std::string& text, const std::string& source);

uint64_t xxh3_64_of(const void* data, size_t n);
// Checkpoint bytes this process has written so far (what the test hooks count).
uint64_t checkpoint_bytes_written();
// XXH3-64 of (token count, up to 2^20 tokens at the start, middle and end):
// a sampled fingerprint that catches changed or reordered data in O(1) reads.
uint64_t dataset_fingerprint(const TokenStream& tokens);
// Of any dataset: BatchSource::fingerprint (data/dataset.h).

std::string checkpoint_dir_name(int64_t step);  // "ckpt-00000120"
struct CheckpointRef {
  std::string path;
  int64_t step = 0;
};
// Directories OUT/ckpt-<digits>, ascending by step (no validation).
std::vector<CheckpointRef> checkpoint_list(const std::string& out_dir);
// "" when DIR is a complete checkpoint whose every file has the size and
// checksum the manifest records, whose trainer.json holds the manifest's step,
// and, when DIR is named ckpt-<digits>, whose name says that step too (a copy
// of another step's directory is not that step); else the reason, naming the file.
std::string checkpoint_verify(const std::string& dir);
// The bytes of one checkpoint of this model's state in the given storages
// and update rule: its unit files exactly (io/checkpoint_unit.h: the master in
// fp32, a bf16 master in bf16; the moments as held: fp32 12 B/param with the
// master, adamw4bit + bf16-sr ~3.03) + kCheckpointSmallFilesBytes for
// config.json, trainer.json and manifest.json (a bound).
inline constexpr uint64_t kCheckpointSmallFilesBytes = uint64_t(64) << 10;
uint64_t checkpoint_bytes_estimate(const ModelSpec& spec, MomentStorage moments = MomentStorage::fp32,
                                   MasterStorage master = MasterStorage::fp32, UpdateRule rule = UpdateRule::adamw);
// The newest checkpoint in OUT that verifies; each newer one that does not is
// named with its reason in *warnings. nullopt when none is valid.
std::optional<CheckpointRef> checkpoint_find_latest_valid(const std::string& out_dir,
                                                          std::vector<std::string>* warnings);

// Readers: strict parsers that throw "[checkpoint] ..." naming what is wrong.
// They do not re-hash the files: call checkpoint_verify (or find_latest_valid) first.
TrainerCheckpoint checkpoint_read_trainer(const std::string& dir);
ModelSpec checkpoint_read_spec(const std::string& dir);
// Loads master weights (and Adam moments when with_moments) into a state of the
// same spec; refuses a missing, extra or misshapen tensor by name.
// With moments, the state's moment storage must be the checkpoint's
// (checkpoint_read_moments) and its update rule the checkpoint's
// (checkpoint_read_update_rule); convert the moments after loading.
void checkpoint_load_state(const std::string& dir, HostState& state, bool with_moments = true);
// The moment storage (--optimizer) the checkpoint's state was saved with.
MomentStorage checkpoint_read_moments(const std::string& dir, const ModelSpec& spec);
// The update rule (adamw, or muon for --optimizer muon | muon8bit | muon4bit) its state was saved with.
UpdateRule checkpoint_read_update_rule(const std::string& dir);

struct SaveReport {
  std::string path;  // the final OUT/ckpt-<step>
  int64_t step = 0;
  uint64_t bytes = 0;        // every file
  double stall_seconds = 0;  // training stopped this long: waiting for the previous write + the copy
  double write_seconds = 0;  // writing, fsync and rename (on the background thread when background)
  bool background = false;
  std::string note;  // why a requested background save ran synchronously ("" otherwise)
};

// Writes checkpoints into OUT and keeps the newest keep_last of them.
// save() first waits for a write in flight; then, in background mode, copies
// every unit's arena into a staging buffer (allocated once, reused) and writes
// from it on a thread while training continues. When host RAM cannot hold the
// staging copy (MemAvailable < copy + 10% + 256 MiB) or it cannot be allocated,
// it writes synchronously from the live state and says so in SaveReport::note.
// Errors of a background write are rethrown by the next poll(), wait() or save().
class CheckpointWriter {
 public:
  CheckpointWriter(std::string out_dir, int64_t keep_last);
  ~CheckpointWriter();  // waits for a write in flight; its error is printed, not thrown
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Synchronous saves return the finished report; background ones a report
  // with stall_seconds filled and write_seconds 0 (the final one comes from poll/wait).
  SaveReport save(const HostState& state, const TrainerCheckpoint& meta, bool background);
  // Synchronous, one unit at a time: fetch(u) returns unit u's snapshot (its
  // buffers valid until the next call), for u in unit order. For states whose
  // units are gathered as they are written (a data-parallel GPU rank's:
  // Backend::gather_unit); the files are those of save().
  SaveReport save_gathered(const ModelSpec& spec, size_t n_units, const TrainerCheckpoint& meta,
                           const std::function<UnitSnap(size_t)>& fetch);
  std::optional<SaveReport> poll();  // the finished background write, once; never blocks
  std::optional<SaveReport> wait();  // blocks until no write is in flight
  bool busy() const { return thread_.joinable(); }
  const std::string& out_dir() const { return out_dir_; }
  // The newest checkpoint this writer completed ("" none).
  const std::string& last_path() const { return last_path_; }

  struct Job;  // one write: a snapshot of the state and its result (internal)

 private:
  void finish(std::optional<SaveReport>* out);
  std::string out_dir_;
  int64_t keep_last_;
  std::vector<HostBuffer> staging_;  // one per unit, unit_stage_floats (io/checkpoint_unit.h)
  std::thread thread_;
  std::shared_ptr<Job> job_;
  std::string last_path_;
};

// Synchronous, without a writer object (tests, tools).
SaveReport checkpoint_write(const std::string& out_dir, const HostState& state, const TrainerCheckpoint& meta,
                            int64_t keep_last);

}  // namespace rt
