#include "cli/train_config.h"

#include "cli/model_dir.h"
#include "cli/train_data.h"
#include "core/error.h"
#include "core/fs.h"

namespace rt::cli {

const char* auto_on_off_name(AutoOnOff v) {
  switch (v) {
    case AutoOnOff::auto_select:
      return "auto";
    case AutoOnOff::on:
      return "on";
    case AutoOnOff::off:
      return "off";
  }
  return "auto";
}

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::auto_select:
      return "auto";
    case Placement::device:
      return "device";
    case Placement::host:
      return "host";
    case Placement::fold:
      return "fold";
  }
  return "auto";
}

void train_options(ArgParser& p) {
  p.option("config", "FILE.toml", "read options from a TOML file (command-line options win)");

  p.group("Model");
  p.option("preset", "NAME",
           "start from a built-in model shape: tiny-byte, llama-3.1-8b, qwen2.5-7b, olmo-2-7b, granite-3.3-8b, "
           "smollm3-3b, ... (random init; a wrong name lists them all)");
  p.option("model", "DIR|ORG/NAME",
           "start from a HF model directory (config.json + safetensors), or a model id "
           "found in the local HF cache ($HF_HUB_CACHE, else $HF_HOME/hub, default ~/.cache/huggingface/hub)");
  p.option("init", "random|pretrained",
           "weights to start from (default: pretrained with --model, random with --preset)")
      .choice({"random", "pretrained"});

  p.group("Data");
  p.option("data", "PATH...", "training data: text/.jsonl files, directories, or a token file (a list in TOML)").list();
  p.option("eval-data", "PATH", "evaluate on this held-out data too (a file or directory, same formats as --data)");
  train_data_options(p);
  p.option("seq-len", "T", "tokens per sequence", "256").integer(1);
  p.option("val-fraction", "F", "fraction of the data held out for validation (0: none)", "0.1").number(0, 0.99);

  p.group("Schedule");
  p.option("steps", "N", "optimizer steps", "200").integer(1);
  p.option("epochs", "E", "train E passes over the data instead of --steps (steps = E x windows / (B x K))").integer(1);
  p.option("lr", "LR", "peak learning rate", "1e-3").above(0);
  p.option("min-lr-ratio", "R", "cosine floor as a fraction of the peak", "0.1").number(0, 1);
  p.option("schedule", "NAME", "learning-rate schedule after warm-up: cosine, constant or linear", "cosine")
      .choice({"cosine", "constant", "linear"});
  p.option("warmup", "N", "linear warm-up steps (the default is cut to half of a shorter run)", "10").integer(0);
  p.option("seed", "S", "seed for init and data order", "0").integer(0);

  p.group("Optimizer");
  p.option("micro-batch", "B", "sequences per micro-batch", "8").integer(1);
  p.option("grad-accum", "K", "micro-batches per optimizer step", "1").integer(1);
  p.option("weight-decay", "WD", "decoupled AdamW weight decay", "0.0").number(0);
  p.flag("decay-norms-and-biases", "also apply weight decay to norm weights and biases (HF default: no)");
  p.option("beta1", "B1", "AdamW beta1", "0.9").number(0).below(1);
  p.option("beta2", "B2", "AdamW beta2", "0.95").number(0).below(1);
  p.option("eps", "EPS", "AdamW epsilon", "1e-8").above(0);
  p.option("clip", "NORM", "clip the global gradient norm to NORM (0: off)", "1.0").number(0);
  p.option("max-bad-steps", "N", "abort after N steps in a row with a non-finite loss or gradient norm (0: never)", "5")
      .integer(0);
  p.flag("delayed-update",
         "apply each step's update during the next step, so the CPU optimizer overlaps a whole "
         "step (gradients one step stale; GPU: needs --grads device)");
  p.option("optimizer", "adamw|adamw8bit|adamw4bit|muon|muon8bit|muon4bit",
           "AdamW with fp32 moments (8 B/param), or block-wise quantized moments: 8-bit (2.03 B/param) or 4-bit "
           "(1.03 B/param), blocks of 256 with an fp32 absmax each, dequantized to fp32 for every update; "
           "muon: Muon (Newton-Schulz orthogonalised momentum) for the layers' 2-D matrices and AdamW for the "
           "embedding, head, norms, biases and routers; its update is scaled by 0.2*sqrt(max(rows, cols)) "
           "(Moonshot's RMS matching), so it shares --lr with AdamW; muon8bit, muon4bit: the same with 8- or 4-bit "
           "moments (the matrices hold a momentum and no second moment: 8 B/param with an fp32 master, 5 with "
           "muon8bit, 4.6 with muon4bit; 2.6 with muon4bit and --master bf16-sr). "
           "On the GPU, Newton-Schulz runs there in bf16 (fp32 sums), pipelined with the CPU optimizer "
           "(two matrices in flight), and each layer's gradient reaches the optimizer whole: --grads host or fold (auto picks "
           "one; device and --delayed-update are refused); docs/lean_state.md",
           "adamw")
      .choice({"adamw", "adamw8bit", "adamw4bit", "muon", "muon8bit", "muon4bit"});
  p.option("muon-momentum", "MU", "Muon's (Nesterov) momentum (default: --beta1)").number(0, 0.999999);
  p.option("moment-rounding", "nearest|stochastic",
           "how --optimizer adamw8bit/adamw4bit/muon8bit/muon4bit round the updated moments back to their codes "
           "(stochastic: unbiased, so small moments do not stall; measured better for AdamW, docs/lean_state.md)",
           "stochastic")
      .choice({"nearest", "stochastic"});
  p.option("threads", "N", "CPU threads (0: all cores)", "0").integer(0, 4096);
  p.option("matmul", "bf16|fp8",
           "what the transformer layers' projections (q/k/v/o, gate/up/down; not MoE experts, embedding, LM head, "
           "router) multiply in: bf16 (fp32 on the CPU), or fp8: e4m3 operands with power-of-two scales, per 1x128 "
           "tile of activations and gradients and per 128x128 block of weights (DeepSeek-V3's recipe, --fp8-scaling "
           "block) or one per tensor (--fp8-scaling tensor), fp32 accumulation. GPU: Hopper (sm_90) for block "
           "scaling, any FP8 card (sm_89+: RTX 4090, Hopper) for tensor scaling; --device cpu runs their bit-exact "
           "quantization twin (docs/fp8.md)",
           "bf16")
      .choice({"bf16", "fp8"});
  p.option("fp8-scaling", "block|tensor",
           "with --matmul fp8, the scales of the e4m3 operands: block (1x128 tiles of activations and gradients, "
           "128x128 blocks of weights; finer, Hopper only) or tensor (one power-of-two scale per operand tensor from "
           "its current amax; cuBLASLt's faster per-tensor FP8 GEMM, and the one Ada runs; coarser: measure the loss)",
           "block")
      .choice({"block", "tensor"});

  p.group("GPU memory (CUDA builds; a CPU run warns that they do nothing)");
  p.option("device", "auto|cpu|cuda", "compute device: auto picks the GPU when one is present", "auto")
      .choice({"auto", "cpu", "cuda"});
  p.option("max-gpu-memory", "SIZE",
           "device memory the engine may take, e.g. 16G (default: what is free); a plan "
           "that does not fit is shrunk step by step (host gradients and checkpoints, 2 slots, small LM-head "
           "chunks) and the log says so")
      .size();
  p.option("slots", "S", "device weight slots for streaming", "3").integer(2, 64);
  p.option("keep-activations", "auto|N",
           "keep the activations of the last N layers from forward to backward "
           "instead of recomputing them (same results); auto: as many as fit in the device memory the plan leaves "
           "(CPU: in a quarter of the free RAM); 0: recompute every layer",
           "auto")
      .integer(0)
      .or_word("auto");
  p.option("keep-attention", "auto|N",
           "selective recompute: N more layers (before the kept ones) keep only their attention half (q/k/v, the "
           "attention output and the residual h), so their backward recomputes the two norms and the MLP's gate/up "
           "alone, skipping the q/k/v/o projections and the attention forward (same results); auto: as the memory "
           "left allows, by recompute FLOPs saved per byte (the start line prints hardware/model FLOPs); 0: off. "
           "Layer-major (--grad-accum > 1): the last N layers keep the half of every micro-batch (N x grad-accum "
           "halves); it keeps no whole layers",
           "auto")
      .integer(0)
      .or_word("auto");
  p.flag("resident", "keep every layer on the GPU (when it fits): the baseline for the streaming overhead");
  p.option("grads", "auto|device|host|fold",
           "device: keep gradients on the GPU until the step's norm is known; host: send each layer's to host RAM "
           "as it is made (low device memory, +4 B/param of host RAM); fold: send them out the same way but update "
           "each layer as its gradient lands, with no host gradient buffer (least host RAM; needs --grad-accum 1 "
           "or layer-major; clipping: each layer by the norm of the gradients landed up to it, the same as global "
           "clipping on every step within --clip, never more on the others; docs/small_gpu.md); auto: device, or "
           "host when they take much of the card (fold when --clip 0); --optimizer muon: host or fold only",
           "auto")
      .choice({"auto", "device", "host", "fold"});
  p.option("checkpoints", "auto|device|host", "where block inputs wait for the backward", "auto")
      .choice({"auto", "device", "host"});
  p.option("layer-major", "auto|on|off",
           "with --grad-accum > 1: run every micro-batch through a layer while its "
           "weights are on the GPU, so weights cross PCIe once per step (same results; tied embeddings: up to "
           "rounding); auto: when the weights stream and the embedding is untied",
           "auto")
      .choice({"auto", "on", "off"});
  p.option("mlp-chunk-tokens", "auto|0|N",
           "run each layer's MLP over chunks of N tokens, so its large "
           "intermediate tensors exist for one chunk only (long sequences: 7B at 16k tokens in 10 GiB; results "
           "change only by fp32 summation order); auto: only as the last step when the plan does not fit "
           "otherwise (CPU: off); 0: never",
           "auto")
      .integer(0)
      .or_word("auto");
  p.option("master", "auto|fp32|split|bf16-sr|bf16-kahan",
           "how host RAM holds the master weights: fp32, or split into the "
           "pinned bf16 copy the GPU loads + a 16-bit remainder + 1 bit (exact, same results, 12.125 instead of 14 "
           "B/param with Adam; fewer bytes per update); auto: split (the CPU backend uses fp32 for both). Lossy, "
           "on both backends: bf16-sr, the master is the bf16 copy itself, updated with stochastic rounding "
           "(2 B/param); bf16-kahan, the same rounded to nearest plus a bf16 Kahan compensation (4 B/param)",
           "auto")
      .choice({"auto", "fp32", "split", "bf16-sr", "bf16-kahan"});
  p.flag("low-memory",
         "the least device memory: --grads host --checkpoints host --slots 2, the embedding on "
         "the host, small LM-head chunks (with --micro-batch 1 a 7B model needs about 7 GiB)");
  p.option("trace", "FILE.json", "write a Chrome/Perfetto trace of the GPU streams and the CPU optimizer");

  p.group("Host memory: the state tier below RAM (docs/architecture.md, State tier)");
  p.option("state-dir", "PATH",
           "an existing directory on a local SSD that holds the optimizer state (Adam m, v or their codes; a split "
           "master's remainder; a Kahan compensation) of the units that do not fit under --max-host-memory, in "
           "one preallocated file, PATH/ramtrain-state.bin; each unit is read in ahead of its update and written "
           "back after it, so RAM holds the weights, the gradients and three units in flight. When --max-host-memory "
           "is below that minimum, the weights (the master) page too and RAM holds the gradients and three units "
           "in flight: the CPU backend then computes on an fp32 copy of its own, the CUDA engine on every layer "
           "held on the device (needs --resident with a split or bf16 master; not with --delayed-update), each "
           "unit's weights uploaded once a step after its update (both outside --max-host-memory). "
           "Results are bit for bit those of the all-in-RAM run. The file is live state, not a checkpoint: "
           "checkpoints still go to --out, and a resume reads those");
  p.option("max-host-memory", "SIZE",
           "with --state-dir: host RAM the training state may take, e.g. 24G (weights, gradients, the units' "
           "optimizer state kept in RAM and the three in flight; not activations or staging); below the minimum "
           "with the weights in RAM, the weights page too; too small a SIZE is refused with the minimum. Default: "
           "page every unit's optimizer state")
      .size();

  p.group("Data parallel (docs/multi_gpu.md)");
  p.option("nproc-per-node", "N",
           "N ranks share each step's --grad-accum micro-batches (a multiple of N), each with 1/N of the optimizer "
           "state; the same results as one process up to fp32 summation order. With N GPUs here: one process per "
           "GPU (NCCL; torchrun's RANK, WORLD_SIZE, ... set for each; rank 0 prints and writes). Under a launcher "
           "(torchrun --no-python, mpirun, srun) leave it out: each process is one rank. --device cpu (or fewer "
           "GPUs than N): the CPU twin, N threads of one process",
           "1")
      .integer(1, 1024);

  p.group("Checkpoints and output");
  p.option("out", "DIR",
           "output directory: DIR/ckpt-<step> checkpoints, DIR/final the final HF model, "
           "DIR/metrics.jsonl",
           "runs/latest");
  p.option("save-every", "N",
           "write a checkpoint DIR/ckpt-<step> every N steps and at the end (0: only on "
           "SIGINT/SIGTERM)",
           "0")
      .integer(0);
  p.option("keep-checkpoints", "N", "keep the newest N checkpoints (0: all)", "3").integer(0);
  p.option("resume", "DIR|auto", "continue from a checkpoint (auto: the newest valid one in --out)");
  p.flag("overwrite",
         "start a fresh run in an --out that holds an earlier one (its checkpoints are deleted when this run "
         "starts, its final model and metrics replaced); without it such an --out is refused");
  p.option("export-dtype", "bf16|fp32|none",
           "dtype of the final model's safetensors (DIR/final); none: no final export (checkpoints, metrics "
           "and --save-every still write; for runs whose export would not fit the disk)",
           "bf16")
      .choice({"bf16", "fp32", "none"});

  p.group("Logging and evaluation");
  p.option("log-every", "N", "print a log line every N steps", "1").integer(1);
  p.option("eval-every", "N", "validation loss every N steps (0: only at the end)", "0").integer(0);
  p.option("eval-batches", "N", "micro-batches per evaluation (per set)", "8").integer(1);
  p.option("metrics", "FILE.jsonl",
           "one JSON line per step and evaluation: exact losses, lr, epoch, wall-clock "
           "time (default: OUT/metrics.jsonl, appended to on resume). A failed write (e.g. a full disk) is "
           "reported once; training continues and later records are dropped");
  p.option("sample-prompt", "TEXT",
           "print a sample from this prompt before and after training (SIGINT/SIGTERM "
           "stop it at the next token)");
  p.option("sample-tokens", "N", "tokens per sample", "200").integer(0);
}

namespace {

Placement placement_parse(const std::string& s) {
  return s == "device" ? Placement::device
         : s == "host"  ? Placement::host
         : s == "fold"  ? Placement::fold
                        : Placement::auto_select;
}

}  // namespace

void data_parallel_check(const TrainConfig& c, const ArgParser& p, int64_t world, bool gpu) {
  if (c.grad_accum % world != 0)
    fail("[train] ", world, " data-parallel ranks (--nproc-per-node or a launcher) split each step's --grad-accum micro-batches: --grad-accum ",
         c.grad_accum, " is not a multiple of ", world, "; use --grad-accum ", world * ((c.grad_accum + world - 1) / world));
  if (c.delayed_update || c.grads == Placement::fold || (!gpu && c.layer_major == AutoOnOff::on))
    fail("[train] data parallelism (--nproc-per-node or a launcher) cannot be combined with --delayed-update, --grads fold",
         gpu ? "" : " or --layer-major on (the CPU twin does none of them)", "; drop one");
  if (matmul_is_fp8(c.matmul))
    fail("[train] data parallelism (--nproc-per-node or a launcher) does not run --matmul fp8 yet: drop one of the "
         "two");
  if (c.update_rule == UpdateRule::muon)
    fail("[train] data parallelism (--nproc-per-node or a launcher) shards AdamW state only; --optimizer ", p.str("optimizer"),
         " (Muon orthogonalises whole matrices) is not sharded yet: drop one of the two");
  if (c.optimizer != MomentStorage::fp32)
    fail("[train] data parallelism (--nproc-per-node or a launcher) shards fp32 Adam moments only for now; --optimizer ", p.str("optimizer"),
         " (quantized moments) is not sharded yet: drop one of the two (docs/multi_gpu.md)");
  if (!gpu) return;
  if (c.bf16_master)
    fail("[train] data-parallel GPU ranks keep an fp32 master of their slices; --master ", c.master,
         " is not sharded: drop it");
  if (c.grads == Placement::host)
    fail("[train] data-parallel GPU ranks reduce-scatter gradients on the device: --grads host is not available "
         "(use --grads auto or device)");
  if (c.export_dtype == DType::f32)
    fail("[train] data-parallel GPU ranks export the bf16 weights they gather; --export-dtype fp32 needs the fp32 "
         "master, which per-rank shards do not export yet: use --export-dtype bf16");
}

TrainConfig train_config_read(const ArgParser& p) {
  TrainConfig c;
  if (p.has("preset") == p.has("model")) fail("[train] give exactly one of --preset NAME or --model DIR");
  if (p.has("preset")) c.preset = p.str("preset");
  if (p.has("model")) c.model = resolve_model_dir(p.str("model"));
  const std::string init = p.has("init") ? p.str("init") : (p.has("model") ? "pretrained" : "random");
  c.init = init == "pretrained" ? InitFrom::pretrained : InitFrom::random;
  if (c.init == InitFrom::pretrained && !c.preset.empty())
    fail("[train] --init pretrained needs --model DIR; a preset has no weights");

  c.data = p.list("data");
  if (p.has("eval-data")) c.eval_data = p.str("eval-data");
  c.seq_len = p.integer("seq-len");
  c.val_fraction = p.number("val-fraction");
  c.seed = static_cast<uint64_t>(p.integer("seed"));

  c.steps = p.integer("steps");
  if (p.has("epochs")) {
    if (p.given_explicitly("steps") && p.given_explicitly("epochs"))
      fail("[train] give one of --steps N or --epochs E, not both");
    if (!p.given_explicitly("steps")) c.epochs = p.integer("epochs");
  }
  c.schedule = lr_schedule_kind_parse(p.str("schedule"));
  c.lr = p.number("lr");
  c.min_lr_ratio = p.number("min-lr-ratio");
  c.warmup = p.integer("warmup");
  c.warmup_given = p.given("warmup");

  c.micro_batch = p.integer("micro-batch");
  c.grad_accum = p.integer("grad-accum");
  c.weight_decay = p.number("weight-decay");
  c.beta1 = p.number("beta1");
  c.beta2 = p.number("beta2");
  c.eps = p.number("eps");
  c.clip = p.number("clip");
  c.decay_norms_and_biases = p.on("decay-norms-and-biases");
  c.delayed_update = p.on("delayed-update");
  c.max_bad_steps = p.integer("max-bad-steps");
  const std::string opt = p.str("optimizer");
  c.optimizer = opt == "adamw8bit" || opt == "muon8bit"   ? MomentStorage::q8
                : opt == "adamw4bit" || opt == "muon4bit" ? MomentStorage::q4
                                                          : MomentStorage::fp32;
  c.update_rule = opt.rfind("muon", 0) == 0 ? UpdateRule::muon : UpdateRule::adamw;
  if (p.has("muon-momentum")) {
    if (c.update_rule != UpdateRule::muon)
      fail("[train] --muon-momentum applies to --optimizer muon | muon8bit | muon4bit only; add one or drop "
           "--muon-momentum");
    c.muon_momentum = p.number("muon-momentum");
  }
  c.moment_rounding = p.str("moment-rounding") == "stochastic" ? QuantRounding::stochastic : QuantRounding::nearest;
  if (c.optimizer == MomentStorage::fp32 && p.given_explicitly("moment-rounding"))
    fail(
        "[train] --moment-rounding applies to quantized moments only; add --optimizer adamw8bit, adamw4bit, "
        "muon8bit or muon4bit, or drop --moment-rounding");
  c.threads = static_cast<int>(p.integer("threads"));
  c.matmul = p.str("matmul") == "fp8" ? (p.str("fp8-scaling") == "tensor" ? MatmulMode::fp8_tensor : MatmulMode::fp8)
                                       : MatmulMode::bf16;
  if (c.matmul == MatmulMode::bf16 && p.given_explicitly("fp8-scaling"))
    fail("[train] --fp8-scaling ", p.str("fp8-scaling"), " applies to --matmul fp8 only; add --matmul fp8 or drop "
         "--fp8-scaling");

  const std::string dev = p.str("device");
  c.device = dev == "cpu" ? Device::cpu : dev == "cuda" ? Device::cuda : Device::auto_select;
  if (p.has("max-gpu-memory")) c.max_gpu_memory = p.size_bytes("max-gpu-memory");
  if (p.has("state-dir")) c.state_dir = p.str("state-dir");
  if (p.has("max-host-memory")) {
    if (c.state_dir.empty())
      fail(
          "[train] --max-host-memory bounds the state the tier keeps in RAM: give --state-dir PATH (a directory on "
          "a local SSD) with it, or drop --max-host-memory");
    c.max_host_memory = p.size_bytes("max-host-memory");
  }
  c.slots = static_cast<int>(p.integer("slots"));
  c.slots_given = p.given_explicitly("slots");
  const std::string ka = p.str("keep-activations");
  c.keep_activations = ka == "auto" ? -1 : p.integer("keep-activations");
  c.keep_attention = p.str("keep-attention") == "auto" ? -1 : p.integer("keep-attention");
  c.resident = p.on("resident");
  c.low_memory = p.on("low-memory");
  c.grads = placement_parse(p.str("grads"));
  c.checkpoints = placement_parse(p.str("checkpoints"));
  if (c.grads == Placement::fold && c.delayed_update)
    fail("[train] --grads fold updates each layer in the step that made its gradient; --delayed-update applies it "
         "one step later: drop one of the two");
  const std::string lm = p.str("layer-major");
  c.layer_major = lm == "on" ? AutoOnOff::on : lm == "off" ? AutoOnOff::off : AutoOnOff::auto_select;
  const std::string mc = p.str("mlp-chunk-tokens");
  c.mlp_chunk_tokens = mc == "auto" ? -1 : p.integer("mlp-chunk-tokens");
  c.master = p.str("master");
  c.bf16_master = c.master == "bf16-sr" || c.master == "bf16-kahan";
  if (p.has("trace")) c.trace = p.str("trace");
  if (c.update_rule == UpdateRule::muon) {  // checked on every machine, so a config is refused the same way everywhere
    // the GPU engine orthogonalises each unit's whole gradient: it must reach the optimizer whole
    if (c.grads == Placement::device)
      fail("[train] --optimizer ", opt, " orthogonalises whole matrices, but --grads device updates each layer in "
           "chunks as its gradient lands: use --grads host or --grads fold (or drop --grads: auto picks one)");
  }
  for (const char* k :
       {"max-gpu-memory", "slots", "resident", "grads", "checkpoints", "layer-major", "master", "low-memory", "trace"})
    if (p.given_explicitly(k) && (p.str(k) != "false") && !(std::string(k) == "master" && c.bf16_master) &&
        !(std::string(k) == "grads" && c.grads == Placement::fold))
      c.gpu_options_given.push_back(std::string("--") + k);  // bf16 masters and --grads fold have CPU twins
  if (c.low_memory) {  // checked on every machine, so a config is refused the same way everywhere
    for (const char* k : {"grads", "checkpoints", "slots", "keep-activations", "keep-attention"})
      if (p.given_explicitly(k)) fail("[train] --low-memory sets --", k, " itself; drop one of the two");
    if (c.resident)
      fail("[train] --low-memory and --resident contradict each other (resident keeps every layer on the GPU)");
    if (c.delayed_update)
      fail(
          "[train] --low-memory sends gradients to the host, which --delayed-update cannot use yet; drop one of the "
          "two");
  }

  c.nproc_per_node = p.integer("nproc-per-node");
  if (c.nproc_per_node > 1) data_parallel_check(c, p, c.nproc_per_node, false);  // the same refusals on every machine

  c.out = p.str("out");
  if (p.has("resume")) c.resume = p.str("resume");
  c.save_every = p.integer("save-every");
  c.keep_checkpoints = p.integer("keep-checkpoints");
  c.export_dtype = p.str("export-dtype") == "fp32" ? DType::f32 : DType::bf16;
  c.export_final = p.str("export-dtype") != "none";

  c.log_every = p.integer("log-every");
  c.eval_every = p.integer("eval-every");
  c.eval_batches = p.integer("eval-batches");
  if (p.has("metrics")) {
    c.metrics = p.str("metrics");
  } else if (!c.out.empty()) {
    c.metrics = path_join(c.out, "metrics.jsonl");
    c.metrics_default = true;
  }
  if (p.has("sample-prompt")) c.sample_prompt = p.str("sample-prompt");
  c.sample_tokens = p.integer("sample-tokens");
  return c;
}

MasterStorage TrainConfig::master_storage() const {
  return master == "bf16-sr"      ? MasterStorage::bf16_sr
         : master == "bf16-kahan" ? MasterStorage::bf16_kahan
                                  : MasterStorage::fp32;
}

int64_t train_steps_for_epochs(int64_t epochs, uint64_t windows_per_epoch, int64_t micro_batch, int64_t grad_accum) {
  const uint64_t per_step = static_cast<uint64_t>(micro_batch) * static_cast<uint64_t>(grad_accum);
  const uint64_t rows = static_cast<uint64_t>(epochs) * windows_per_epoch;
  const uint64_t steps = (rows + per_step - 1) / per_step;
  RT_CHECK(steps >= 1, "[train] --epochs ", epochs, ": the data holds no training window");
  return static_cast<int64_t>(steps);
}

}  // namespace rt::cli
