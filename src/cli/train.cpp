// ramtrain train: train from a built-in preset or fine-tune a HF model directory.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "cli/preflight.h"
#include "cli/train_config.h"
#include "cli/train_data.h"
#include "cli/resume.h"
#include "cli/spawn_ranks.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "data/byte_tokenizer.h"
#include "data/dataset.h"
#include "dist/launch.h"
#include "engine/backend.h"
#include "engine/data_parallel_cpu.h"
#include "engine/sharded_optimizer.h"
#include "engine/sampler.h"
#include "engine/trainer.h"
#include "io/hf_export.h"
#include "model/spec_multimodal.h"
#ifdef RAMTRAIN_HAVE_NCCL
#include "dist/nccl_collective.h"
#endif

namespace rt::cli {

namespace {

const char* kTrainSummary =
    "Trains a model with every byte of training state (fp32 master weights, AdamW moments, gradients) in\n"
    "host RAM. Start from a built-in preset (random init) or a HF model directory (pretrained weights).\n"
    "Data: text files or directories and .jsonl files (text, instruction or chat records, with loss only on\n"
    "the replies; docs/finetune_data.md), encoded with the model's own tokenizer and chat format; plain text\n"
    "for byte-vocab models such as the tiny-byte preset; or one pre-tokenized token file (.bin: ramtrain,\n"
    "llm.c or nanoGPT format; `ramtrain tokenize` writes them).\n"
    "Every option can also be set in a TOML file given with --config (keys are the option names, values\n"
    "checked like the flags'); options on the command line override the file. SIGINT/SIGTERM save a\n"
    "checkpoint at the next step boundary and exit (130/143); `--resume auto` continues.";

const char* kTrainExamples =
    "  ramtrain train --preset tiny-byte --data README.md src --steps 300 --out runs/demo\n"
    "  ramtrain train --model ./Llama-3.2-1B --data corpus.bin --seq-len 1024 --lr 2e-5 --out runs/ft\n"
    "  ramtrain train --model ./Qwen2.5-0.5B-Instruct --data chat.jsonl --seq-len 1024 --lr 1e-5 --out runs/chat\n"
    "  ramtrain train --model Qwen/Qwen2.5-0.5B --data chat.jsonl --eval-data held_out.jsonl --epochs 2 --out "
    "runs/ft2\n"
    "  ramtrain train --config run.toml --steps 50\n";

// The weights to start from: a checkpoint, random init, or the model directory's.
// *tokenizer: "byte", "hf"-style "" or "byte" as the exported model records it.
// dp_fresh: a data-parallel GPU rank starting a run (not a resume): its state
// only seeds the rank's slices and then keeps bf16 weights, and a fresh run's
// moments are zero, so it is made with an exact split master and the smallest
// moment storage, never read (5.2 B/param at start-up instead of 12).
std::unique_ptr<HostState> initial_state(const TrainConfig& c, const std::optional<ResumeSource>& resume,
                                         const ModelSpec& spec, std::string* tokenizer, bool dp_fresh = false) {
  std::unique_ptr<HostState> state;
  const MomentStorage moments = dp_fresh ? MomentStorage::q4 : c.optimizer;
  const MasterStorage master = dp_fresh ? MasterStorage::split : c.master_storage();
  *tokenizer = "byte";
  if (resume) {
    // the checkpoint's moment storage loads bit for bit (cmd_train converts to --optimizer after), and a
    // bf16 master is made before loading, so its values and Kahan compensation load exactly
    state = std::make_unique<HostState>(resume->spec, false, checkpoint_read_moments(resume->dir, resume->spec),
                                        c.master_storage());
    state->set_update_rule(checkpoint_read_update_rule(resume->dir));  // its Muon momentum or Adam moments
    checkpoint_load_state(resume->dir, *state);
    *tokenizer = resume->meta.run.tokenizer;
  } else if (!c.preset.empty() || c.init == InitFrom::random) {
    state = std::make_unique<HostState>(spec, false, moments, master, c.update_rule);
    state->init_random(c.seed);
    if (c.preset.empty()) *tokenizer = file_exists(path_join(c.model, "ramtrain_tokenizer.json")) ? "byte" : "";
  } else {
    LoadedModel m = load_model_dir(c.model, false, moments, master, c.update_rule);
    if (m.multimodal) {
      const bool mib = m.carried_bytes >= (1u << 20);
      std::printf(
          "model: %s is %s: training its language model; carrying %lld other tensors (%.1f %s: the vision "
          "tower and projector) into exports untouched\n",
          c.model.c_str(), kGemma3Multimodal, (long long)m.carried_tensors,
          static_cast<double>(m.carried_bytes) / (mib ? 1 << 20 : 1 << 10), mib ? "MiB" : "KiB");
    }
    state = std::move(m.state);
    *tokenizer = m.tokenizer;
  }
  if (!resume) state->set_update_rule(c.update_rule);
  return state;
}

TrainOptions trainer_options(const TrainConfig& c, const ArgParser& p, const TrainData& td,
                             const std::string& tokenizer, bool resumed) {
  TrainOptions o;
  o.steps = c.steps;
  o.micro_batch = c.micro_batch;
  o.grad_accum = c.grad_accum;
  o.adam.beta1 = c.beta1;
  o.adam.beta2 = c.beta2;
  o.adam.eps = c.eps;
  o.moment_rounding = c.moment_rounding;
  o.muon.momentum = c.muon_momentum;
  o.weight_decay = c.weight_decay;
  o.decay_norms_and_biases = c.decay_norms_and_biases;
  o.clip = c.clip;
  o.delayed_update = c.delayed_update;
  o.keep_activations = c.keep_activations;
  o.keep_attention = c.keep_attention;
  o.mlp_chunk_tokens = c.mlp_chunk_tokens;
  o.fold_grads = c.grads == Placement::fold;
  o.matmul = c.matmul;
  o.state_dir = c.state_dir;
  o.max_host_memory = c.max_host_memory;
  int64_t warmup = c.warmup;
  if (!c.warmup_given && warmup > o.steps / 2) warmup = o.steps / 2;  // the default must fit short runs
  if (warmup > o.steps)
    fail("[train] --warmup ", warmup, " is longer than the run (", o.steps, " steps); shorten it or train longer");
  o.lr.kind = c.schedule;
  o.lr.peak = c.lr;
  o.lr.warmup_steps = warmup;
  o.lr.total_steps = o.steps;
  o.lr.min_lr_ratio = c.min_lr_ratio;
  o.lr.validate();
  o.eval_every = c.eval_every;
  o.eval_batches = c.eval_batches;
  o.log_every = c.log_every;
  o.save_every = c.save_every;
  o.out_dir = c.out;
  o.export_dtype = c.export_dtype;
  o.export_final = c.export_final;
  o.tokenizer = tokenizer;
  if (!td.tokenizer_dir.empty()) {
    o.copy_from_dir = td.tokenizer_dir;
    o.copy_files = hf_tokenizer_files(td.tokenizer_dir);
  }
  o.resolved_config = p.resolved();
  o.resolved_config["warmup"] = std::to_string(warmup);  // the effective values, for an exact resume
  o.resolved_config["steps"] = std::to_string(o.steps);
  o.keep_checkpoints = c.keep_checkpoints;
  o.max_bad_steps = c.max_bad_steps;
  o.metrics_path = c.metrics;
  o.metrics_append = !c.metrics_default || resumed;  // the default file starts over with a fresh run
  o.seed = c.seed;
  o.data_paths = c.data;
  // Where a later `ramtrain export CKPT` finds the tokenizer files to copy.
  if (!td.tokenizer_dir.empty())
    o.source_model_dir = td.tokenizer_dir;
  else if (!c.model.empty())
    o.source_model_dir = c.model;
  // A multimodal model's export copies its vision tower from the model directory (io/hf_export.h)
  if (!c.model.empty() && c.preset.empty() && config_file_is_multimodal(c.model)) o.source_model_dir = c.model;
  return o;
}

// --sample-prompt: a sample with the data's tokenizer (or bytes), cut short by SIGINT/SIGTERM.
std::function<void(const char*)> make_sampler(const TrainConfig& c, const TrainData& td, const HostState& state) {
  if (c.sample_prompt.empty()) return nullptr;
  if (!td.byte_text && !td.tokenizer)
    fail("[train] --sample-prompt needs a tokenizer: byte-level text or a model tokenizer");
  return [&td, &state, prompt = c.sample_prompt, n_tok = c.sample_tokens, seed = c.seed](const char* when) {
    ByteTokenizer tok;
    std::vector<int32_t> ids;
    SampleOptions so;
    so.max_new_tokens = n_tok;
    so.seed = seed;
    so.stop = &Trainer::stop_flag();
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
    std::vector<int32_t> out = sample_tokens(state, ids, so);
    state.release_decoded();  // a split master's decoded fp32 copy is not kept while training
    std::printf("---- sample %s%s ----\n%s%s\n--------\n", when,
                Trainer::stop_flag().load() ? " (cut short by a signal)" : "", prompt.c_str(),
                td.tokenizer ? td.tokenizer->decode(out, true).c_str() : tok.decode(out).c_str());
    std::fflush(stdout);
  };
}

// The CUDA engine when it is to be used (null: the trainer's CPU backend).
std::unique_ptr<Backend> make_backend(const TrainConfig& c, HostState& state, int64_t seq_len,
                                      const GpuDataParallel& dp = {}) {
  CudaOptions co;
  co.dp = dp;
  co.max_gpu_memory = c.max_gpu_memory;
  co.slots = c.slots;
  co.fit_slots = !c.slots_given;  // the engine may shrink the plan to fit (CudaOptions::fit)
  co.resident = c.resident;
  co.delayed_update = c.delayed_update;
  co.grads = placement_name(c.grads);
  co.checkpoints = placement_name(c.checkpoints);
  co.layer_major = auto_on_off_name(c.layer_major);
  co.master = c.master;
  co.micro_batches = c.grad_accum;  // the layer-major buffers are planned for this many
  if (dp.on()) co.micro_batches = c.grad_accum / dp.grads->world();  // a rank's share
  co.keep_activations = c.keep_activations;
  co.keep_attention = c.keep_attention;
  co.mlp_chunk_tokens = c.mlp_chunk_tokens;
  co.clipping = c.clip > 0;
  co.matmul = c.matmul;
  if (c.low_memory) set_low_memory(co);
  co.trace_path = c.trace;
  if (c.device == Device::cuda || dp.on()) return make_cuda_backend(state, c.micro_batch, seq_len, co);
  try {
    return make_cuda_backend(state, c.micro_batch, seq_len, co);
  } catch (const Error& e) {
    std::printf("note: a GPU is present but the CUDA engine cannot run this model (%s); using the CPU backend\n",
                e.what());
    return nullptr;
  }
}

}  // namespace

int cmd_train(const Args& args) {
  ArgParser p("train", kTrainSummary, kTrainExamples);
  train_options(p);
  if (!p.parse(args)) return 0;
  if (p.has("config")) p.merge_toml(p.str("config"));
  std::vector<std::string> data_paths = p.list("data");
  std::optional<ResumeSource> resume =
      resume_prepare(p, data_paths);  // --resume: the checkpoint's options are the base
  TrainConfig c = train_config_read(p);
  if (resume && c.steps < resume->meta.step)
    fail("[train] --steps ", c.steps, " is before the checkpoint's step ", resume->meta.step, " (", resume->dir,
         "): a resumed run continues to --steps; give --steps ", resume->meta.step + 1, " or more");
  c.data = data_paths;
  if (c.data.empty()) fail("[train] --data is required: text files/directories or token files");
  if (c.threads > 0) set_global_threads(c.threads);

  // The model's shape before anything is encoded or allocated: a directory
  // without readable weights is refused here, not after the data is encoded.
  if (!c.model.empty() && !resume) model_dir_check(c.model, c.init == InitFrom::pretrained, "[train]");
  const ModelSpec spec = resume              ? resume->spec
                         : !c.preset.empty() ? spec_preset(c.preset)
                                             : spec_from_config_file(path_join(c.model, "config.json"));
  // Data parallel on GPUs (docs/multi_gpu.md): under a launcher (torchrun,
  // mpirun, srun or our own) this process is one rank; --nproc-per-node N
  // with N GPUs here (and not --device cpu) starts the N ranks itself.
  const LaunchConfig launch = launch_config_from_env();
  const int gpus = c.device == Device::cpu ? 0 : cuda_device_count();
  if (launch.world == 1 && c.nproc_per_node > 1) {
    if (c.device == Device::cuda && gpus < c.nproc_per_node)
      fail("[train] --nproc-per-node ", c.nproc_per_node, " --device cuda needs ", c.nproc_per_node,
           " GPUs, this machine has ", gpus, ": use --nproc-per-node ", gpus > 1 ? gpus : 1,
           " or --device cpu (the CPU twin)");
    if (gpus >= c.nproc_per_node) {
      data_parallel_check(c, p, c.nproc_per_node, true);
      std::printf("starting %lld ranks, one per GPU (rank 0's output follows)\n", (long long)c.nproc_per_node);
      Args child{"train"};
      child.insert(child.end(), args.begin(), args.end());
      return spawn_local_ranks(static_cast<int>(c.nproc_per_node), child);
    }
  }
  // Test hook: RAMTRAIN_TEST_DP_WORLD_OF_ONE=1 runs one process as a
  // data-parallel world of one GPU (every collective a copy), so a machine
  // with one GPU checks the rank's engine against the plain one, bit for bit
  // (tests/gpu/run.sh dp).
  const char* world_of_one = std::getenv("RAMTRAIN_TEST_DP_WORLD_OF_ONE");
  const bool gpu_dp = launch.world > 1 || (world_of_one && std::string(world_of_one) == "1" && gpus > 0);
  bool dp_follow_saves = false;
  if (gpu_dp) {
    if (c.nproc_per_node > 1 && c.nproc_per_node != launch.world)
      fail("[train] --nproc-per-node ", c.nproc_per_node, " but the launcher (", launch.launcher, ") started ",
           launch.world, " ranks: drop --nproc-per-node under a launcher, or make them equal");
    if (c.device == Device::cpu)
      fail("[train] the launcher (", launch.launcher, ") started ", launch.world,
           " processes, but --device cpu: the CPU twin runs its ranks as threads of one process "
           "(--nproc-per-node N without a launcher)");
    data_parallel_check(c, p, launch.world, true);  // the configuration's refusals first, the same on every machine
    if (gpus == 0)
      fail("[train] rank ", launch.rank, " of ", launch.world,
           " found no GPU: data parallelism runs one process per GPU");
    if (c.threads <= 0) {  // the ranks of this host share its cores
      const int per = static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, std::min(launch.world, gpus));
      set_global_threads(std::max(1, per));
    }
    if (launch.rank > 0) {  // rank 0 speaks and writes; the others train in silence
      if (!std::freopen("/dev/null", "w", stdout)) fail("[train] rank ", launch.rank, ": cannot silence stdout");
      dp_follow_saves = !c.out.empty();  // they take part in rank 0's checkpoint gathers
      c.out.clear();
      c.metrics.clear();
    }
  }
  if (gpu_dp && spec.is_moe())
    fail("[train] data parallelism does not support mixture-of-experts models (", spec.architecture,
         ") yet: their load-balancing loss is a mean over each process's micro-batches; train them on one GPU");
  if (c.device == Device::cuda && !cuda_backend_available())
    fail("[train] --device cuda: no CUDA GPU can be used here (this build has no CUDA backend, or no GPU is visible); "
         "use --device cpu, or auto to take a GPU when there is one");
  const bool cpu_backend = c.device == Device::cpu || !cuda_backend_available() || (c.nproc_per_node > 1 && !gpu_dp);
  if (!cpu_backend && matmul_is_fp8(c.matmul)) {  // before any work, and never a silent fall-back to the CPU
    std::string why;
    if (!cuda_fp8_supported(c.matmul, &why))
      fail("[train] --matmul fp8: ", why, " (--device cpu runs the FP8 twin, slowly: for tests)");
  }
  preflight(c, spec, cpu_backend);
  // one run per --out, and --out writable: refused here, not after training; a checkpoint holds the state as the
  // run keeps it (a data-parallel rank 0 writes the gathered fp32 AdamW state: adamw, fp32 or split master)
  RunLock out_lock =
      out_dir_lock(c.out, checkpoint_bytes_estimate(spec, c.optimizer, c.master_storage(), c.update_rule));
  if (!c.out.empty()) fresh_out_check(p, resume.has_value());

  // The data next: its errors come before gigabytes of model state are allocated.
  TrainData td = train_data_open(p, c.data, spec, c.model, c.seed);
  BatchSource& data = *td.source;
  std::unique_ptr<TrainData> eval_td;
  if (!c.eval_data.empty()) {
    std::printf("eval data: %s\n", c.eval_data.c_str());
    eval_td = std::make_unique<TrainData>(train_data_open(p, {c.eval_data}, spec, c.model, c.seed, 0.0, "--eval-data"));
  }
  if (c.epochs > 0) {
    c.steps = train_steps_for_epochs(c.epochs, data.train_window_count(), c.micro_batch, c.grad_accum);
    std::printf("--epochs %lld: %lld steps (%llu sequences per epoch, %lld per step)\n", (long long)c.epochs,
                (long long)c.steps, (unsigned long long)data.train_window_count(),
                (long long)(c.micro_batch * c.grad_accum));
  }
  std::string tokenizer;
  const auto t_state = std::chrono::steady_clock::now();
  std::unique_ptr<HostState> state = initial_state(c, resume, spec, &tokenizer, gpu_dp && !resume);
  if (state->update_rule() != c.update_rule)
    fail("[train] --resume: the checkpoint was trained with --optimizer ",
         optimizer_name(state->update_rule(), state->moment_storage()), " and this run asks for --optimizer ",
         p.str("optimizer"), "; Muon momentum and Adam moments do not convert: resume with --optimizer ",
         state->update_rule() == UpdateRule::muon ? "muon, muon8bit or muon4bit" : "adamw, adamw8bit or adamw4bit");
  if (!gpu_dp || resume)
    state->set_moment_storage(c.optimizer);  // a checkpoint's storage converts to the one asked for
  if (c.bf16_master) state->set_master_storage(c.master_storage());
  if (td.byte_text)
    tokenizer = "byte";  // byte-level text trains a byte-level model, whatever the directory held
  else if (tokenizer == "byte")
    tokenizer = "";
  if (resume) resume_check_data(*resume, data);
  const double state_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_state).count();

  TrainOptions o = trainer_options(c, p, td, tokenizer, resume.has_value());
  o.eval_data = eval_td ? eval_td->source.get() : nullptr;
  o.follow_saves = dp_follow_saves;
  std::printf("model: %s (%s), %lld layers, hidden %lld, vocab %lld; data: %llu train / %llu validation tokens\n",
              !c.preset.empty() ? c.preset.c_str() : c.model.c_str(), family_name(spec.family),
              (long long)spec.n_layers, (long long)spec.hidden, (long long)spec.vocab,
              (unsigned long long)data.train_token_count(), (unsigned long long)data.val_token_count());
  if (gpu_dp && !c.sample_prompt.empty()) {
    std::printf(
        "note: --sample-prompt is not run on data-parallel GPU ranks (each holds its slice of the weights "
        "between steps); sample the exported model with `ramtrain sample`\n");
    c.sample_prompt.clear();
  }
  const std::function<void(const char*)> sampler = make_sampler(c, td, *state);
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Collective> dp_grads, dp_weights;  // data parallel on GPUs: before the backend that uses them
  std::unique_ptr<ShardedOptimizer> dp_shard;
  if (gpu_dp) {
#ifdef RAMTRAIN_HAVE_NCCL
    const auto t_engine = std::chrono::steady_clock::now();
    dp_grads = make_nccl_collective(launch);
    dp_weights = dp_grads->split();
    // the rank keeps its slices (fp32 master, m, v) and the state keeps bf16 weights only, unit by unit
    dp_shard = std::make_unique<ShardedOptimizer>(*state, launch.world, launch.rank,
                                                  ShardedOptimizer::WeightsOnly{!resume.has_value()});
    GpuDataParallel dp;
    dp.grads = dp_grads.get();
    dp.weights = dp_weights.get();
    dp.shard = dp_shard.get();
    dp.stop = &Trainer::stop_flag();
    backend = make_backend(c, *state, data.seq_len(), dp);
    std::printf("ready: host state %.1f s, NCCL world of %d and engine set-up %.1f s\n", state_seconds, launch.world,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_engine).count());
#else
    fail(
        "[train] this ramtrain was built without NCCL, which data parallelism on GPUs needs: rebuild on a machine "
        "where the CUDA toolkit has NCCL (nccl.h, libnccl.so)");
#endif
  } else if (c.nproc_per_node > 1) {  // the data-parallel CPU twin (docs/multi_gpu.md)
    if (c.device != Device::cpu && cuda_backend_available())
      std::printf("note: --nproc-per-node runs the CPU twin (N threads on the CPU backend), not the GPU\n");
    backend = std::make_unique<DataParallelCpu>(*state, static_cast<int>(c.nproc_per_node), c.keep_activations);
  } else if (!cpu_backend) {
    const auto t_engine = std::chrono::steady_clock::now();
    backend = make_backend(c, *state, data.seq_len());
    std::printf("ready: host state %.1f s, engine set-up %.1f s\n", state_seconds,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_engine).count());
  }
  if (!backend) std::printf("ready: host state %.1f s\n", state_seconds);
  install_stop_handler();
  Trainer trainer(*state, data, o, std::move(backend));
  if (resume) trainer.restore(resume->meta);
  if (launch.rank == 0) resume_commit(p, resume);  // every check passed: now newer checkpoints may be moved aside
  return trainer.run(sampler);
}

}  // namespace rt::cli
