// ramtrain plan's flags and machine: the options (as train's where they share
// a name; --help lists them), read into PlanOptions with the checks that need
// the flags and the model alone, then the card (datasheet leads from
// engine/step_model.h, adjusted by --gpu-*) and the host. The FP8 checks refuse
// what `train --matmul fp8` refuses on that card.
#include <string>

#include "cli/args.h"
#include "cli/model_dir.h"
#include "cli/plan.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/spec.h"

namespace rt::cli {

namespace {

const char* kSummary =
    "Plans a training run without running it: the host RAM it needs per item, the device plan\n"
    "the CUDA engine would choose for the card (its own planner), the predicted step time split into\n"
    "compute, host<->device copies and the CPU optimizer, with the binding one named, and what to\n"
    "change when it does not fit. Card figures are datasheet leads; the time model is calibrated on\n"
    "H100 and H200 measurements (bench/plan_check.sh compares). Exits 1 when the run would be refused.";

const char* kExamples =
    "  ramtrain plan --preset qwen2.5-7b --gpu rtx3080 --micro-batch 2 --grad-accum 16\n"
    "  ramtrain plan --preset qwen2.5-7b --gpu h200 --micro-batch 32 --delayed-update --json\n"
    "  ramtrain plan --model ./Qwen2.5-7B --gpu-memory 10G --gpu-tflops 60 --pcie-gbs 25 --host-ram 64G\n";

// The options, as train's where they share a name (cli/train_config.cpp).
void plan_declare_options(ArgParser& p) {
  p.group("Model");
  p.option("preset", "NAME", "a built-in model shape (ramtrain train --help lists them)");
  p.option("model", "DIR", "a HF model directory (only config.json is read)");
  p.option("layers", "N", "plan with this many layers instead of the model's (a what-if)").integer(1);
  p.group("Tokens per step");
  p.option("seq-len", "T", "tokens per sequence", "2048").integer(1);
  p.option("micro-batch", "B", "sequences per micro-batch", "8").integer(1);
  p.option("grad-accum", "K", "micro-batches per optimizer step", "1").integer(1);
  p.group("Card");
  p.option("gpu", "NAME", std::string("a known card: ") + card_names() + " (datasheet leads)", "h200")
      .choice({"rtx3080", "rtx3090", "rtx4090", "rtx5090", "a100-40g", "h100", "h200"});
  p.option("gpu-memory", "SIZE",
           "device memory the engine may plan with, as train's --max-gpu-memory (default: the card's, "
           "less ~0.6 GiB for the CUDA context)")
      .size();
  p.option("gpu-tflops", "X", "dense bf16 TFLOP/s with fp32 accumulate (default: the card's)").above(0);
  p.option("pcie-gbs", "Y", "practical host<->device GB/s (default: the card's: gen4 x16 25, gen5 x16 50)").above(0);
  p.option("matmul", "bf16|fp8",
           "the projections' GEMMs, as train's --matmul: fp8 counts their FLOPs at the card's FP8 rate (block "
           "scaling: h100, h200, measured on the H100; tensor scaling: rtx4090, rtx5090, h100, h200, measured on the H100, "
           "an ESTIMATE on the others; "
           "other cards are refused as train refuses them)",
           "bf16")
      .choice({"bf16", "fp8"});
  p.option("fp8-scaling", "block|tensor",
           "with --matmul fp8, as train's --fp8-scaling: block (1x128/128x128 scales, Hopper) or tensor (one scale "
           "per tensor, any FP8 card; its rate is an estimate from the GEMM's measured 1.75x less the quantizers' "
           "bytes, step_model.cpp)",
           "block")
      .choice({"block", "tensor"});
  p.option("gpu-fp8-tflops", "X",
           "dense FP8 TFLOP/s with fp32 accumulate for --matmul fp8 (default: the card's; with --gpu-tflops, "
           "the card's FP8/bf16 ratio applied to it)")
      .above(0);
  p.group("Host");
  p.option("host-ram", "SIZE", "the host's RAM (about 4 GiB of it is kept for the OS and the process)", "128G").size();
  p.option("cpu-adamw-gparams", "X", "CPU AdamW rate in Gparam/s (measured ~4 on the 16-core H200 host)", "4.0")
      .above(0);
  p.option("state-dir", "PATH",
           "plan the state tier below RAM, as train --state-dir (the path is not touched): the optimizer state of "
           "the units that do not fit in RAM lives on an SSD, and the bf16 weights too when RAM cannot hold them; "
           "prints the bytes per tier, the SSD traffic of a step and whether the SSD binds it");
  p.option("max-host-memory", "SIZE",
           "with the state tier: host RAM the training state may take (default: the usable RAM less the other "
           "items: block checkpoints, staging)")
      .size();
  p.option("ssd-gbs", "X", "the state SSD's sustained GB/s, reads and writes together (a PCIe 4 NVMe: ~7)", "3.0")
      .above(0);
  p.group("Engine options (as in train)");
  p.flag("delayed-update", "apply step t's update during step t+1");
  p.flag("low-memory", "gradients and checkpoints on the host, 2 slots, 256-row LM-head chunks");
  p.flag("resident", "keep every layer on the device");
  p.option("slots", "N", "device weight slots", "3").integer(2);
  p.option("grads", "auto|device|host|fold",
           "where gradients wait for the norm (fold: nowhere, each layer updates as its gradient lands)", "auto")
      .choice({"auto", "device", "host", "fold"});
  p.option("clip", "NORM", "the run's --clip (0: off; auto then folds where it would send gradients to the host)",
           "1.0")
      .number(0);
  p.option("checkpoints", "auto|device|host", "where block inputs wait for the backward", "auto")
      .choice({"auto", "device", "host"});
  p.option("layer-major", "auto|on|off", "layer-major micro-batches (--grad-accum > 1)", "auto")
      .choice({"auto", "on", "off"});
  p.option("master", "auto|fp32|split|bf16-sr|bf16-kahan",
           "host storage of the master (auto: split; bf16-*: the bf16 shadow is the master)", "auto")
      .choice({"auto", "fp32", "split", "bf16-sr", "bf16-kahan"});
  p.option("optimizer", "adamw|adamw8bit|adamw4bit|muon|muon8bit|muon4bit",
           "Adam moments in fp32, or block-wise quantized to 8 or 4 bits; muon, muon8bit, muon4bit: Muon for the "
           "layers' matrices (a momentum, fp32, 8- or 4-bit, and no second moment), AdamW for the rest; "
           "Newton-Schulz runs on the GPU (its workspace is in the device plan) and gradients reach the optimizer "
           "whole (--grads host or fold)",
           "adamw")
      .choice({"adamw", "adamw8bit", "adamw4bit", "muon", "muon8bit", "muon4bit"});
  p.option("keep-activations", "N|auto", "layers whose activations stay forward to backward", "auto")
      .integer(0)
      .or_word("auto");
  p.option("keep-attention", "N|auto",
           "layers (before the kept ones) that keep only their attention half: q/k/v, the attention output and the "
           "residual h; their backward recomputes the norms and the MLP's gate/up alone (selective recompute)",
           "auto")
      .integer(0)
      .or_word("auto");
  p.option("nproc-per-node", "N",
           "ranks (GPUs) on this host in data parallel: also print each rank's host RAM with the optimizer "
           "state sharded over the ranks (1/N of the fp32 master and Adam moments, the whole bf16 weights; "
           "docs/multi_gpu.md), as train --nproc-per-node N runs it on N GPUs",
           "1")
      .integer(1, 1024);
  p.group("Output");
  p.flag("json", "print one JSON object instead of the report");
}

}  // namespace

// ---- the flags

bool plan_options(const Args& args, PlanOptions* out) {
  ArgParser p("plan", kSummary, kExamples);
  plan_declare_options(p);
  if (!p.parse(args)) return false;
  PlanOptions& o = *out;

  // the model
  if (p.has("preset") == p.has("model")) fail("[plan] give exactly one of --preset NAME or --model DIR");
  if (p.has("preset")) {
    o.model_name = p.str("preset");
    o.spec = spec_preset(o.model_name);
  } else {
    o.model_name = resolve_model_dir(p.str("model"));
    model_dir_check(o.model_name, false, "[plan]");
    o.spec = spec_from_config_file(path_join(o.model_name, "config.json"));
  }
  if (p.has("layers")) o.spec.n_layers = p.integer("layers");
  o.seq_len = p.integer("seq-len"), o.micro_batch = p.integer("micro-batch"), o.grad_accum = p.integer("grad-accum");
  if (o.seq_len > o.spec.max_sequence())
    fail("[plan] --seq-len ", o.seq_len, " exceeds the model's ", o.spec.max_sequence_why(), "; lower --seq-len");

  // the card and the host
  o.gpu = p.str("gpu");
  if (p.has("gpu-memory")) o.gpu_memory = p.size_bytes("gpu-memory");
  if (p.has("gpu-tflops")) o.gpu_tflops = p.number("gpu-tflops");
  if (p.has("gpu-fp8-tflops")) o.gpu_fp8_tflops = p.number("gpu-fp8-tflops");
  if (p.has("pcie-gbs")) o.pcie_gbs = p.number("pcie-gbs");
  o.card_adjusted = p.given("gpu-memory") || p.given("gpu-tflops") || p.given("pcie-gbs") || p.given("gpu-fp8-tflops");
  o.matmul = p.str("matmul");
  o.fp8_scaling = p.str("fp8-scaling");
  if (o.matmul != "fp8" && p.given_explicitly("fp8-scaling"))
    fail("[plan] --fp8-scaling applies to --matmul fp8 only; add --matmul fp8 or drop --fp8-scaling");
  o.host_ram = p.size_bytes("host-ram");
  o.gparams = p.number("cpu-adamw-gparams");
  // the state tier (engine/tier_plan.h) pages the state: it takes --max-host-memory of RAM, or what is left
  o.tiered = p.has("state-dir") || p.has("max-host-memory");
  if (p.has("max-host-memory")) o.max_host_memory = p.size_bytes("max-host-memory");
  o.ssd_gbs = p.number("ssd-gbs");

  // the optimizer and the master's storage
  o.optimizer = p.str("optimizer");
  o.muon = o.optimizer.rfind("muon", 0) == 0;
  o.rule = o.muon ? UpdateRule::muon : UpdateRule::adamw;
  const std::string master = p.str("master");
  o.storage = master == "fp32"         ? MasterStorage::fp32
              : master == "bf16-sr"    ? MasterStorage::bf16_sr
              : master == "bf16-kahan" ? MasterStorage::bf16_kahan
                                       : MasterStorage::split;
  o.moments = o.optimizer == "adamw8bit" || o.optimizer == "muon8bit"   ? MomentStorage::q8
              : o.optimizer == "adamw4bit" || o.optimizer == "muon4bit" ? MomentStorage::q4
                                                                        : MomentStorage::fp32;

  // the engine options, as `ramtrain train` builds them (cli/train.cpp)
  CudaOptions& co = o.engine;
  co.slots = static_cast<int>(p.integer("slots"));
  co.fit_slots = !p.given("slots");
  co.resident = p.on("resident");
  co.delayed_update = p.on("delayed-update");
  co.grads = p.str("grads");
  co.clipping = p.number("clip") > 0;
  co.checkpoints = p.str("checkpoints");
  co.layer_major = p.str("layer-major");
  co.master = master;
  co.muon = o.muon;  // whole-unit updates, NS5 workspace
  co.micro_batches = o.grad_accum;
  co.keep_activations = p.str("keep-activations") == "auto" ? -1 : p.integer("keep-activations");
  co.keep_attention = p.str("keep-attention") == "auto" ? -1 : p.integer("keep-attention");
  co.verbose = false;
  if (p.on("low-memory")) set_low_memory(co);
  o.ranks = static_cast<int>(p.integer("nproc-per-node"));
  o.json = p.on("json");
  return true;
}

// ---- the machine

PlanMachine plan_machine(const PlanOptions& o) {
  PlanMachine m;
  CardSpec& card = m.card;
  card_lookup(o.gpu, &card);  // a choice: always known
  m.budget = o.gpu_memory ? *o.gpu_memory : card_engine_budget(card.memory_bytes);
  if (o.gpu_tflops) {
    if (card.bf16_tflops > 0) card.fp8_tflops *= *o.gpu_tflops / card.bf16_tflops;
    card.bf16_tflops = *o.gpu_tflops;
    card.gemm_peak_tflops = 0, card.gemm_peak_measured = false;  // its GEMM peak: the H100's share of the rate given
  }
  m.matmul =
      o.matmul == "fp8" ? (o.fp8_scaling == "tensor" ? MatmulMode::fp8_tensor : MatmulMode::fp8) : MatmulMode::bf16;
  if (o.gpu_fp8_tflops)  // the rate as given
    card.fp8_tflops = *o.gpu_fp8_tflops, card.fp8_gain = 0, card.fp8_tensor_gain = 0;
  if (m.matmul == MatmulMode::fp8 && !card.fp8_path)
    fail(
        "[plan] --matmul fp8: ramtrain runs its block-scaled FP8 projections on Hopper only (--gpu h100 or h200: "
        "cuBLASLt's 1x128/128x128 block scaling), and `train --matmul fp8` refuses ",
        card.name,
        card.fp8_tflops > 0 ? " (it has FP8 tensor cores, but cuBLASLt gives it per-tensor scales only): plan with "
                              "--fp8-scaling tensor, or --matmul bf16"
                            : " (no FP8 tensor cores): plan with --matmul bf16");
  if (m.matmul == MatmulMode::fp8_tensor && !card.fp8_tensor_path)
    fail("[plan] --matmul fp8 --fp8-scaling tensor: ", card.name,
         " has no FP8 tensor cores (sm_89 and newer have them: rtx4090, rtx5090, h100, h200), and `train` refuses "
         "it; plan with --matmul bf16");
  if (o.pcie_gbs) card.pcie_gbs = *o.pcie_gbs;
  if (o.card_adjusted) card.name += " (adjusted)";
  m.host_usable = o.host_ram > kHostReserveBytes ? o.host_ram - kHostReserveBytes : 0;
  return m;
}

}  // namespace rt::cli
