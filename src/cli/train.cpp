// ramtrain train: train from a built-in preset or fine-tune a HF model directory.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "cli/train_data.h"
#include "cli/resume.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "data/byte_tokenizer.h"
#include "data/dataset.h"
#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/trainer.h"
#include "io/hf_export.h"

namespace rt::cli {

namespace {

const char* kTrainSummary =
    "Trains a model with every byte of training state (fp32 master weights, AdamW moments, gradients) in\n"
    "host RAM. Start from a built-in preset (random init) or a HF model directory (pretrained weights).\n"
    "Data: text files or directories and .jsonl files (text, instruction or chat records, with loss only on\n"
    "the replies; docs/finetune_data.md), encoded with the model's own tokenizer and chat format; plain text\n"
    "for byte-vocab models such as the tiny-byte preset; or one pre-tokenized token file (.bin: ramtrain,\n"
    "llm.c or nanoGPT format; `ramtrain tokenize` writes them).\n"
    "Every option can also be set in a TOML file given with --config (keys are the option names);\n"
    "options on the command line override the file.";

const char* kTrainExamples =
    "  ramtrain train --preset tiny-byte --data README.md src --steps 300 --out runs/demo\n"
    "  ramtrain train --model ./Llama-3.2-1B --data corpus.bin --seq-len 1024 --lr 2e-5 --out runs/ft\n"
    "  ramtrain train --model ./Qwen2.5-0.5B-Instruct --data chat.jsonl --seq-len 1024 --lr 1e-5 --out runs/chat\n"
    "  ramtrain train --config run.toml --steps 50\n";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

}  // namespace

int cmd_train(const Args& raw_args) {
  // --data takes several paths: collect the words after it that are not options.
  Args args;
  std::vector<std::string> data_paths;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    if (raw_args[i] == "--data") {
      while (i + 1 < raw_args.size() && raw_args[i + 1].rfind("--", 0) != 0) data_paths.push_back(raw_args[++i]);
      if (data_paths.empty()) fail("[train] --data needs one or more paths");
      continue;
    }
    args.push_back(raw_args[i]);
  }
  ArgParser p("train", kTrainSummary, kTrainExamples);
  p.option("config", "FILE.toml", "read options from a TOML file (command-line options win)");
  p.option("preset", "NAME", "start from a built-in model shape: tiny-byte, llama-3.1-8b, qwen2.5-7b, ... (random init)");
  p.option("model", "DIR", "start from a HF model directory (config.json + safetensors)");
  p.option("init", "random|pretrained", "weights to start from (default: pretrained with --model, random with --preset)");
  p.option("data", "PATH...", "training data: text/.jsonl files, directories, or a token file (comma list in TOML)");
  train_data_options(p);
  p.option("seq-len", "T", "tokens per sequence", "256");
  p.option("micro-batch", "B", "sequences per micro-batch", "8");
  p.option("grad-accum", "K", "micro-batches per optimizer step", "1");
  p.option("steps", "N", "optimizer steps", "200");
  p.option("lr", "LR", "peak learning rate", "1e-3");
  p.option("min-lr-ratio", "R", "cosine floor as a fraction of the peak", "0.1");
  p.option("schedule", "cosine|constant|linear", "learning-rate schedule after warm-up", "cosine");
  p.option("warmup", "N", "linear warm-up steps", "10");
  p.option("weight-decay", "WD", "decoupled AdamW weight decay", "0.0");
  p.flag("decay-norms-and-biases", "also apply weight decay to norm weights and biases (HF default: no)");
  p.option("beta1", "B1", "AdamW beta1", "0.9");
  p.option("beta2", "B2", "AdamW beta2", "0.95");
  p.option("eps", "EPS", "AdamW epsilon", "1e-8");
  p.option("clip", "NORM", "clip the global gradient norm to NORM (0: off)", "1.0");
  p.option("seed", "S", "seed for init and data order", "0");
  p.option("val-fraction", "F", "fraction of the data held out for validation", "0.1");
  p.option("eval-every", "N", "validation loss every N steps (0: only at the end)", "0");
  p.option("eval-batches", "N", "validation micro-batches per evaluation", "8");
  p.option("log-every", "N", "print a log line every N steps", "1");
  p.option("save-every", "N", "write a checkpoint DIR/ckpt-<step> every N steps and at the end (0: only on SIGINT/SIGTERM)", "0");
  p.option("keep-checkpoints", "N", "keep the newest N checkpoints (0: all)", "3");
  p.option("resume", "DIR|auto", "continue from a checkpoint (auto: the newest valid one in --out; none: start)");
  p.option("max-bad-steps", "N", "abort after N steps in a row with a non-finite loss or gradient norm (0: never)", "5");
  p.option("metrics", "FILE.jsonl", "append one JSON line per step and evaluation (exact losses)");
  p.option("out", "DIR", "output directory: DIR/ckpt-<step> checkpoints, DIR/final the final HF model", "runs/latest");
  p.option("export-dtype", "bf16|fp32", "dtype of exported safetensors", "bf16");
  p.option("threads", "N", "CPU threads (0: all cores)", "0");
  p.option("device", "auto|cpu|cuda", "compute device: auto picks the GPU when one is present", "auto");
  p.option("max-gpu-memory", "SIZE", "device memory the engine may take, e.g. 16G (default: what is free); a plan "
           "that does not fit is shrunk step by step (host gradients and checkpoints, 2 slots, small LM-head "
           "chunks) and the log says so");
  p.option("slots", "S", "device weight slots for streaming (>= 2)", "3");
  p.option("keep-activations", "auto|N", "keep the activations of the last N layers from forward to backward "
           "instead of recomputing them (same results, one forward per layer less); auto: as many as fit in the "
           "device memory the plan leaves (CPU: in a quarter of the free RAM); 0: recompute every layer", "auto");
  p.flag("delayed-update", "apply each step's update during the next step, so the CPU optimizer overlaps a whole "
         "step (gradients one step stale; GPU: needs --grads device)");
  p.flag("resident", "keep every layer on the GPU (when it fits): the baseline for the streaming overhead");
  p.option("trace", "FILE.json", "write a Chrome/Perfetto trace of the GPU streams and the CPU optimizer");
  p.option("grads", "auto|device|host", "GPU: keep gradients on the device until the step's norm is known, or send "
           "each layer's to host RAM as it is made (low device memory)", "auto");
  p.option("checkpoints", "auto|device|host", "GPU: where block inputs wait for the backward", "auto");
  p.option("master", "auto|fp32|split", "GPU: how host RAM holds the fp32 master weights: fp32, or split into the "
           "pinned bf16 copy the GPU loads + a 16-bit remainder + 1 bit (exact, same results, 12.125 instead of 14 "
           "B/param with Adam; fewer bytes per update); auto: split (the CPU backend always uses fp32)", "auto");
  p.flag("low-memory", "GPU: the least device memory: --grads host --checkpoints host --slots 2, the embedding on "
         "the host, small LM-head chunks (with --micro-batch 1 a 7B model needs about 7 GiB)");
  p.option("sample-prompt", "TEXT", "print a sample from this prompt before and after training");
  p.option("sample-tokens", "N", "tokens per sample", "200");
  if (!p.parse(args)) return 0;
  if (p.has("config")) p.merge_toml(p.str("config"));
  std::optional<ResumeSource> resume = resume_prepare(p, data_paths);  // --resume: the checkpoint's options are the base
  if (data_paths.empty() && p.has("data")) data_paths = split_list(p.str("data"));
  if (data_paths.empty()) fail("[train] --data is required: text files/directories or token files");

  const std::string device = p.str("device");
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail("[train] --device must be auto, cpu or cuda, got '", device, "'");
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));

  if (p.has("preset") == p.has("model")) fail("[train] give exactly one of --preset NAME or --model DIR");
  std::string init = p.has("init") ? p.str("init") : (p.has("model") ? "pretrained" : "random");
  if (init != "random" && init != "pretrained") fail("[train] --init must be random or pretrained, got '", init, "'");
  const uint64_t seed = static_cast<uint64_t>(p.integer("seed"));
  // The data first: its errors come before gigabytes of model state are allocated.
  const ModelSpec data_spec =
      p.has("preset") ? spec_preset(p.str("preset")) : spec_from_config_file(path_join(p.str("model"), "config.json"));
  TrainData td = train_data_open(p, data_paths, data_spec, p.has("model") ? p.str("model") : "", seed);
  BatchSource& data = *td.source;
  std::unique_ptr<HostState> state;
  std::string tokenizer = "byte";
  if (resume) {
    state = std::make_unique<HostState>(resume->spec, false);
    checkpoint_load_state(resume->dir, *state);
    tokenizer = resume->meta.run.tokenizer;
  } else if (p.has("preset")) {
    if (init == "pretrained") fail("[train] --init pretrained needs --model DIR; a preset has no weights");
    ModelSpec spec = spec_preset(p.str("preset"));
    state = std::make_unique<HostState>(spec, false);
    state->init_random(seed);
  } else if (init == "pretrained") {
    LoadedModel m = load_model_dir(p.str("model"), false);
    state = std::move(m.state);
    tokenizer = m.tokenizer;
  } else {
    ModelSpec spec = spec_from_config_file(path_join(p.str("model"), "config.json"));
    state = std::make_unique<HostState>(spec, false);
    state->init_random(seed);
    tokenizer = file_exists(path_join(p.str("model"), "ramtrain_tokenizer.json")) ? "byte" : "";
  }
  const ModelSpec& spec = state->spec();

  const bool text = td.byte_text;
  if (text) tokenizer = "byte";  // byte-level text trains a byte-level model, whatever the directory held
  else if (tokenizer == "byte") tokenizer = "";
  if (resume) resume_check_data(*resume, data);

  TrainOptions o;
  o.steps = p.integer("steps");
  o.micro_batch = p.integer("micro-batch");
  o.grad_accum = p.integer("grad-accum");
  o.adam.beta1 = p.number("beta1");
  o.adam.beta2 = p.number("beta2");
  o.adam.eps = p.number("eps");
  o.weight_decay = p.number("weight-decay");
  o.decay_norms_and_biases = p.on("decay-norms-and-biases");
  o.clip = p.number("clip");
  o.delayed_update = p.on("delayed-update");
  {
    const std::string k = p.str("keep-activations");
    char* end = nullptr;
    const long long n = k == "auto" ? -1 : std::strtoll(k.c_str(), &end, 10);
    if (k != "auto" && (k.empty() || *end != '\0' || n < 0))
      fail("[train] --keep-activations must be auto or a number of layers >= 0, got '", k, "'");
    o.keep_activations = n;
  }
  int64_t warmup = p.integer("warmup");
  if (!p.given("warmup") && warmup > o.steps / 2) warmup = o.steps / 2;  // the default must fit short runs
  o.lr = make_lr_schedule(p.str("schedule"), p.number("lr"), warmup, o.steps, p.number("min-lr-ratio"));
  o.eval_every = p.integer("eval-every");
  o.eval_batches = p.integer("eval-batches");
  o.log_every = std::max<int64_t>(1, p.integer("log-every"));
  o.save_every = p.integer("save-every");
  o.out_dir = p.str("out");
  const std::string edt = p.str("export-dtype");
  if (edt != "bf16" && edt != "fp32") fail("[train] --export-dtype must be bf16 or fp32, got '", edt, "'");
  o.export_dtype = edt == "bf16" ? DType::bf16 : DType::f32;
  o.tokenizer = tokenizer;
  if (!td.tokenizer_dir.empty()) {
    o.copy_from_dir = td.tokenizer_dir;
    o.copy_files = hf_tokenizer_files(td.tokenizer_dir);
  }
  o.resolved_config = p.resolved();
  o.resolved_config["warmup"] = std::to_string(warmup);  // the effective value, for an exact resume
  o.keep_checkpoints = p.integer("keep-checkpoints");
  o.max_bad_steps = p.integer("max-bad-steps");
  if (p.has("metrics")) o.metrics_path = p.str("metrics");
  o.seed = seed;
  o.data_paths = data_paths;
  // Where a later `ramtrain export CKPT` finds the tokenizer files to copy.
  if (!td.tokenizer_dir.empty()) o.source_model_dir = td.tokenizer_dir;
  else if (p.has("model")) o.source_model_dir = p.str("model");

  std::printf("model: %s (%s), %lld layers, hidden %lld, vocab %lld; data: %llu train / %llu validation tokens\n",
              p.has("preset") ? p.str("preset").c_str() : p.str("model").c_str(), family_name(spec.family),
              (long long)spec.n_layers, (long long)spec.hidden, (long long)spec.vocab,
              (unsigned long long)data.train_token_count(), (unsigned long long)data.val_token_count());
  std::function<void(const char*)> sampler;
  if (p.has("sample-prompt")) {
    if (!text && !td.tokenizer) fail("[train] --sample-prompt needs a tokenizer: byte-level text or a model tokenizer");
    const std::string prompt = p.str("sample-prompt");
    const int64_t n_tok = p.integer("sample-tokens");
    sampler = [&, prompt, n_tok](const char* when) {
      ByteTokenizer tok;
      std::vector<int32_t> ids;
      SampleOptions so;
      so.max_new_tokens = n_tok;
      so.seed = seed;
      if (td.tokenizer) {
        ids = td.tokenizer->encode(prompt, true);
        so.vocab_limit = td.tokenizer->vocab_size();
        if (td.tokenizer->eos_id()) so.stop_ids = {*td.tokenizer->eos_id()};
      } else {
        ids = tok.encode(prompt);
        ids.insert(ids.begin(), ByteTokenizer::bos_id);
        so.stop_ids = {ByteTokenizer::eos_id};
        so.vocab_limit = ByteTokenizer::vocab_size;
      }
      std::vector<int32_t> out = sample_tokens(*state, ids, so);
      state->release_decoded();  // a split master's decoded fp32 copy is not kept while training
      std::printf("---- sample %s ----\n%s%s\n--------\n", when, prompt.c_str(),
                  td.tokenizer ? td.tokenizer->decode(out, true).c_str() : tok.decode(out).c_str());
      std::fflush(stdout);
    };
  }
  if (p.on("low-memory")) {  // checked on every machine, so a config is refused the same way everywhere
    for (const char* k : {"grads", "checkpoints", "slots", "keep-activations"})
      if (p.given_explicitly(k)) fail("[train] --low-memory sets --", k, " itself; drop one of the two");
    if (p.on("resident"))
      fail("[train] --low-memory and --resident contradict each other (resident keeps every layer on the GPU)");
    if (o.delayed_update)
      fail("[train] --low-memory sends gradients to the host, which --delayed-update cannot use yet; drop one of the two");
  }
  if (p.str("master") != "auto" && p.str("master") != "fp32" && p.str("master") != "split")
    fail("[train] --master must be auto, fp32 or split, got '", p.str("master"), "'");
  std::unique_ptr<Backend> backend;
  const bool use_cuda = device == "cuda" || (device == "auto" && cuda_backend_available());
  if (use_cuda) {
    CudaOptions co;
    if (p.has("max-gpu-memory")) co.max_gpu_memory = p.size_bytes("max-gpu-memory");
    co.slots = static_cast<int>(p.integer("slots"));
    co.fit_slots = !p.given_explicitly("slots");  // the engine may shrink the plan to fit (CudaOptions::fit)
    co.resident = p.on("resident");
    co.delayed_update = o.delayed_update;
    co.grads = p.str("grads");
    co.checkpoints = p.str("checkpoints");
    co.master = p.str("master");
    co.keep_activations = o.keep_activations;
    if (p.on("low-memory")) set_low_memory(co);
    if (p.has("trace")) co.trace_path = p.str("trace");
    if (device == "cuda") {
      backend = make_cuda_backend(*state, o.micro_batch, data.seq_len(), co);
    } else {
      try {
        backend = make_cuda_backend(*state, o.micro_batch, data.seq_len(), co);
      } catch (const Error& e) {
        std::printf("note: a GPU is present but the CUDA engine cannot run this model (%s); using the CPU backend\n",
                    e.what());
      }
    }
  }
  if (!backend && p.on("low-memory"))
    std::printf("note: --low-memory shapes the GPU engine's plan; the CPU backend keeps everything in host RAM anyway\n");
  install_stop_handler();
  Trainer trainer(*state, data, o, std::move(backend));
  if (resume) trainer.restore(resume->meta);
  return trainer.run(sampler);
}

}  // namespace rt::cli
