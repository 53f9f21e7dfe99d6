// `ramtrain plan`'s stages, in the order cmd_plan (cli/plan.cpp) runs them,
// each a function of the ones before it:
//   plan_options     the flags (plan_options.cpp): the model, checks on flags alone
//   plan_machine     the card, datasheet leads adjusted by --gpu-*; the host
//   plan_device_fit  the engine's device plan (plan_memory.cpp), with the
//                    engine's fallback when the host cannot pin layer-major's inputs
//   plan_host_ram    host RAM per item, the state tier, the checkpoint on disk,
//                    data parallel's bytes per rank
//   predict_step     the step time (engine/step_model.h)
//   plan_fixes       what to change (plan_fixes.cpp)
//   plan_report      the text report (plan_report.cpp), or plan_json: one JSON
//                    object (plan_json.cpp); they decide nothing
// A stage that refuses the run throws rt::Error naming the flag to change; a
// run that breaks several rules is refused for the first in this order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/fp8.h"
#include "engine/backend.h"
#include "engine/device_plan.h"
#include "engine/step_model.h"
#include "engine/tier_plan.h"
#include "model/spec.h"
#include "state/host_state.h"

namespace rt::cli {

// Host RAM the OS and the process keep beyond the plan: on the lent 128 GiB
// H200 host the engine found ~24.4 GiB free beside a 99.3 GiB state (issue 16:
// "host gradients need 29051 MiB more host RAM but only ~25000 MiB are
// available"), so ~124 GiB of 128 are usable.
constexpr uint64_t kHostReserveBytes = 4ull << 30;
constexpr double kGiB = 1ull << 30;  // the report's unit (gib below)

// The flags, typed. Unset card figures (nullopt) are the card's own.
struct PlanOptions {
  std::string model_name;                                // --preset NAME, or the --model directory as resolved
  ModelSpec spec;                                        // --layers applied
  int64_t seq_len = 0, micro_batch = 0, grad_accum = 0;  // T, B, K: micro-batches of B x T tokens, K a step
  std::string gpu;
  std::optional<uint64_t> gpu_memory;
  std::optional<double> gpu_tflops, gpu_fp8_tflops, pcie_gbs;
  bool card_adjusted = false;       // any of the four above given
  std::string matmul, fp8_scaling;  // as given: "bf16" | "fp8", "block" | "tensor"
  uint64_t host_ram = 0;
  double gparams = 0;   // --cpu-adamw-gparams
  bool tiered = false;  // --state-dir or --max-host-memory: the state tier pages the state
  std::optional<uint64_t> max_host_memory;
  double ssd_gbs = 0;
  // The engine options as `ramtrain train` builds them (cli/train.cpp), less
  // max_gpu_memory (the machine's budget, set by plan_device_fit).
  CudaOptions engine;
  std::string optimizer;  // as given, for messages
  bool muon = false;      // --optimizer muon*
  UpdateRule rule = UpdateRule::adamw;
  MasterStorage storage = MasterStorage::split;
  MomentStorage moments = MomentStorage::fp32;
  int ranks = 1;  // --nproc-per-node
  bool json = false;
};

struct PlanMachine {
  CardSpec card;        // the --gpu card, adjusted by --gpu-*, its name marked " (adjusted)"
  uint64_t budget = 0;  // device bytes the engine may plan with
  MatmulMode matmul = MatmulMode::bf16;
  uint64_t host_usable = 0;  // --host-ram less kHostReserveBytes
};

struct PlanDevice {
  CudaOptions options;         // the engine's options as run: layer-major "off" after the fallback
  DevicePlan plan;             // fit_device_plan's
  bool host_fallback = false;  // layer-major at auto fell back to micro-batch-major for host RAM
};

struct PlanHostItem {
  std::string what;
  uint64_t bytes = 0;
};

struct PlanHost {
  // The state first (master, m, v, shadows, gradients: kPlanStateItems, what
  // the state tier splits between RAM and SSD), then the buffers beside it.
  std::vector<PlanHostItem> items;
  uint64_t total = 0;  // the items, the state's at its RAM share with the tier
  bool fits = false;
  uint64_t numel = 0;                   // elements of the state (every unit's arena)
  uint64_t moment_bytes = 0;            // Adam m and v (Muon: no v for its matrices)
  uint64_t block_checkpoint_bytes = 0;  // the pinned block checkpoints' item
  uint64_t saved_bytes = 0;             // one checkpoint on disk (--save-every)
  RunTierPlan tier;                     // with PlanOptions::tiered
  uint64_t tier_budget = 0;
  // --nproc-per-node > 1: each rank's host bytes (the largest), the ranks together
  uint64_t dp_rank_max = 0, dp_host = 0;
  bool dp_fits = false;
};
constexpr size_t kPlanStateItems = 5;

// What cmd_plan fills, stage by stage; the report and the JSON read it whole.
struct Plan {
  PlanOptions opt;
  PlanMachine machine;
  PlanDevice device;
  PlanHost host;
  StepPrediction step;
  std::vector<std::string> fixes;
  bool fits() const { return device.plan.fits() && host.fits; }
};

// false: --help was printed (plan nothing).
bool plan_options(const Args& args, PlanOptions* out);
PlanMachine plan_machine(const PlanOptions& o);
PlanDevice plan_device_fit(const PlanOptions& o, const PlanMachine& m);
PlanHost plan_host_ram(const PlanOptions& o, const PlanMachine& m, const PlanDevice& d);
std::vector<std::string> plan_fixes(const Plan& plan);
void plan_report(const Plan& plan);  // prints the text report
std::string plan_json(const Plan& plan);

// The report's number formats: printf of one value; GiB, or MiB below 1 GiB;
// a JSON string.
std::string fmt(const char* f, double v);
std::string gib(double bytes);
std::string json_str(const std::string& s);

}  // namespace rt::cli
