// TrainConfig: every option of `ramtrain train`, typed (enums, not strings),
// filled from one ArgParser whose command-line and TOML values went through
// the same checks (cli/args.h). train_options() declares the options with
// their group, type and bounds; train_config_read() reads them and adds the
// checks that span several options (--low-memory against --grads, --epochs
// against --steps, ...), each message naming the flag (or file: key).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cli/args.h"
#include "core/fp8.h"
#include "io/safetensors.h"
#include "optim/lr_schedule.h"
#include "state/host_state.h"

namespace rt::cli {

enum class Device { auto_select, cpu, cuda };
enum class InitFrom { pretrained, random };
enum class Placement { auto_select, device, host, fold };  // --grads / --checkpoints on the GPU (fold: --grads)

const char* placement_name(Placement p);
enum class AutoOnOff { auto_select, on, off };  // --layer-major
const char* auto_on_off_name(AutoOnOff v);

struct TrainConfig {
  // model
  std::string preset;  // exactly one of preset / model
  std::string model;   // a directory (a HF model id already resolved to its cache snapshot)
  InitFrom init = InitFrom::random;
  // data (the data-format options stay in the ArgParser: cli/train_data.h reads them)
  std::vector<std::string> data;
  std::string eval_data;  // "" none
  int64_t seq_len = 256;
  double val_fraction = 0.1;
  uint64_t seed = 0;
  // schedule
  int64_t steps = 200;
  int64_t epochs = 0;  // > 0: steps come from the data (train_steps_for_epochs)
  LrSchedule::Kind schedule = LrSchedule::Kind::cosine;
  double lr = 1e-3, min_lr_ratio = 0.1;
  int64_t warmup = 10;
  bool warmup_given = false;  // the default warm-up is cut to half a short run
  // optimizer
  int64_t micro_batch = 8, grad_accum = 1;
  double weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip = 1.0;
  bool decay_norms_and_biases = false;
  bool delayed_update = false;
  int64_t max_bad_steps = 5;
  MomentStorage optimizer = MomentStorage::fp32;  // --optimizer adamw | adamw8bit | adamw4bit (muon: fp32, muon8bit: q8)
  UpdateRule update_rule = UpdateRule::adamw;     // --optimizer muon | muon8bit: UpdateRule::muon
  double muon_momentum = -1;                      // --muon-momentum (< 0: --beta1)
  QuantRounding moment_rounding = QuantRounding::stochastic;
  int64_t nproc_per_node = 1;  // > 1: DataParallelCpu (engine/data_parallel_cpu.h), the CPU twin of multi-GPU
  // GPU memory
  Device device = Device::auto_select;
  uint64_t max_gpu_memory = 0;  // 0: what is free
  std::string state_dir;        // --state-dir: the optimizer state's file tier ("" all in RAM)
  uint64_t max_host_memory = 0;  // --max-host-memory (0: page every unit)
  int slots = 3;
  bool slots_given = false;
  int64_t keep_activations = -1;  // -1: auto
  int64_t keep_attention = -1;    // -1: auto
  bool resident = false, low_memory = false;
  Placement grads = Placement::auto_select, checkpoints = Placement::auto_select;
  AutoOnOff layer_major = AutoOnOff::auto_select;  // --grad-accum > 1: layer-major micro-batches (backend.h)
  int64_t mlp_chunk_tokens = -1;         // --mlp-chunk-tokens: -1 auto, 0 off, R tokens (CudaOptions::mlp_chunk_tokens)
  std::string master = "auto";           // auto | fp32 | split: host storage of the fp32 master (CudaOptions::master),
                                         // or bf16-sr | bf16-kahan (bf16_master below)
  bool bf16_master = false;              // --master bf16-sr | bf16-kahan: both backends hold a bf16 master
  MasterStorage master_storage() const;  // bf16 masters; else fp32 (the CPU backend's; the engine picks its own)
  std::string trace;
  std::vector<std::string> gpu_options_given;  // the GPU-only flags given (warned about on a CPU run)
  // checkpoints and output
  std::string out = "runs/latest";
  std::string resume;  // "" none, "auto" or a directory
  int64_t save_every = 0, keep_checkpoints = 3;
  DType export_dtype = DType::bf16;
  bool export_final = true;  // --export-dtype none: false
  // logging
  int64_t log_every = 1, eval_every = 0, eval_batches = 8;
  std::string metrics;           // "" none
  bool metrics_default = false;  // metrics is OUT/metrics.jsonl because --metrics was not given
  std::string sample_prompt;     // "" none
  int64_t sample_tokens = 200;
  int threads = 0;
  MatmulMode matmul = MatmulMode::bf16;  // --matmul: the projections' GEMMs in bf16 or FP8 (core/fp8.h)
};

// Declares every train option (with the data options of cli/train_data.h), grouped for --help.
void train_options(ArgParser& p);

// Reads the typed configuration. Call after parse, merge_toml and the resume
// base are in; throws rt::Error naming the option on a bad combination.
TrainConfig train_config_read(const ArgParser& p);
// The refusals of data parallelism over `world` ranks (the CPU twin's, and
// with gpu also those of GPU ranks: docs/multi_gpu.md), named with the fix.
void data_parallel_check(const TrainConfig& c, const ArgParser& p, int64_t world, bool gpu);

// --epochs E: the optimizer steps that read E epochs of windows (rounded up).
int64_t train_steps_for_epochs(int64_t epochs, uint64_t windows_per_epoch, int64_t micro_batch, int64_t grad_accum);

}  // namespace rt::cli
