// --resume DIR|auto for `ramtrain train`: find the checkpoint, make its saved
// run configuration the base layer of the options (so `--resume auto` alone
// continues the same run), and refuse options that would make it another run.
// Refused when they differ: the model (preset/model config), seq-len,
// micro-batch, grad-accum, seed, val-fraction and the data (token counts and
// fingerprint). Everything else (lr, schedule, steps, intervals, out, device,
// threads, ...) may be overridden explicitly, with a warning when it changes
// the numbers. A fresh run (no --resume) into an --out that already holds
// checkpoints is refused: resume it or pick another --out.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/run_lock.h"
#include "data/dataset.h"
#include "io/checkpoint.h"
#include "model/spec.h"

namespace rt::cli {

struct ResumeSource {
  std::string dir;  // the checkpoint directory
  TrainerCheckpoint meta;
  ModelSpec spec;
};

// nullopt: a fresh start (no --resume, or auto with no valid checkpoint in --out).
// Fills data_paths from the checkpoint when none were given. Only reads: a
// refused resume changes nothing on disk.
std::optional<ResumeSource> resume_prepare(ArgParser& p, std::vector<std::string>& data_paths);

// A fresh run (no --resume, or auto finding no valid checkpoint) into an
// --out that holds an earlier run is refused unless --overwrite: checkpoints,
// a final model or the default metrics file (auto: a final model) would be
// replaced or mixed with this run's. Called holding the --out lock.
void fresh_out_check(const ArgParser& p, bool resumed);

// Called once the run has passed every check and is about to train (holding
// the --out lock): says where it continues from, and renames the checkpoints
// in --out newer than that step (every one, when --resume auto found none
// valid) to <name>.superseded-<pid>, each with a warning, so that a later
// `--resume auto` never goes back to them.
void resume_commit(const ArgParser& p, const std::optional<ResumeSource>& r);

// Before the data is read: locks the run's --out (core/run_lock.h: a second
// run into it is refused, naming this one; held until the returned lock is
// destroyed), checks that it can be written, and warns when its file system
// has less free space than checkpoint_bytes, one checkpoint of the run's state
// (io/checkpoint.h checkpoint_bytes_estimate). "" (nothing saved): no lock.
RunLock out_dir_lock(const std::string& out_dir, uint64_t checkpoint_bytes);

// Refuses data whose token counts, window count or fingerprint differ from the checkpoint's.
void resume_check_data(const ResumeSource& r, const BatchSource& data);

// "key: checkpoint A, this run B" for every config.json field that differs ("" none).
std::string spec_differences(const ModelSpec& saved, const ModelSpec& now);

}  // namespace rt::cli
