// ramtrain eval: mean next-token loss and perplexity of a model over a whole
// dataset, every target token counted once.
//   one token file, or text with a byte-vocab model (no tokenizer):
//     the stream of N tokens is cut into non-overlapping windows of T+1
//     tokens sharing their boundary token, o = k*T for k = 0 .. ceil((N-1)/T)-1:
//     inputs [o, o+T), targets [o+1, o+T+1) clipped to N (the last window may
//     be partial; its missing targets carry no loss). Each token but the first
//     is a target exactly once.
//   text / .jsonl with a tokenizer: the fine-tuning examples of data/finetune.h
//     (loss masks respected: only trained positions count), one per row, never
//     packed, longer ones split into windows [kT, kT+T+1) so that every trained
//     token is a target once.
// Rows go to the backend in batches of B rows of T positions (the CUDA engine
// needs a fixed shape: a last short batch is filled with rows that carry no
// target). loss = sum of token losses / targets, perplexity = exp(loss).
// On the CPU the fp32 reference runs forward only (ModelRunner, as `ramtrain
// loss` does) so that no gradient arenas are allocated; on the GPU the CUDA
// engine's Backend::loss_sum, as the trainer's validation uses it.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/thread_pool.h"
#include "cpu/cpu_ops.h"
#include "data/byte_tokenizer.h"
#include "data/chat_format.h"
#include "data/dataset.h"
#include "data/finetune.h"
#include "data/records.h"
#include "engine/backend.h"
#include "io/token_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace rt::cli {

namespace {

bool has_tokenizer_files(const std::string& dir) {
  return !dir.empty() &&
         (file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.model")));
}

// Every row of the data, B rows at a time, each row's positions restarting at 0.
class EvalRows {
 public:
  virtual ~EvalRows() = default;
  virtual uint64_t rows() const = 0;
  // Rows [r, r + n) into b's rows [0, n); b is (B, T), already cleared.
  virtual void fill(uint64_t r, int64_t n, Batch& b) = 0;
};

// Non-overlapping windows over one token stream (see the top of the file).
class StreamRows final : public EvalRows {
 public:
  StreamRows(TokenStream ts, int64_t T) : ts_(std::move(ts)), T_(T) {}
  uint64_t rows() const override {
    const uint64_t n = ts_.size();
    return n < 2 ? 0 : (n - 1 + T_ - 1) / T_;
  }
  void fill(uint64_t r, int64_t n, Batch& b) override {
    std::vector<int32_t> buf(T_ + 1);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t o = (r + i) * T_;
      const uint64_t len = std::min<uint64_t>(T_ + 1, ts_.size() - o);  // >= 2
      ts_.read(o, len, buf.data());
      for (uint64_t t = 0; t + 1 < len; ++t) {
        b.inputs[i * T_ + t] = buf[t];
        b.targets[i * T_ + t] = buf[t + 1];
      }
    }
  }

 private:
  TokenStream ts_;
  int64_t T_;
};

// The examples of a FinetuneDataset (pack off): epoch 0's rows, in its order.
class ExampleRows final : public EvalRows {
 public:
  explicit ExampleRows(std::unique_ptr<FinetuneDataset> ds) : ds_(std::move(ds)) {}
  uint64_t rows() const override { return ds_->train_window_count(); }
  void fill(uint64_t r, int64_t n, Batch& b) override {
    RT_CHECK(r == next_, "[eval] rows are read in order");
    const Batch got = ds_->next_batch(n);
    next_ += n;
    const int64_t T = b.T;
    std::copy(got.inputs.begin(), got.inputs.end(), b.inputs.begin());
    std::copy(got.targets.begin(), got.targets.end(), b.targets.begin());
    if (!got.positions.empty())
      std::copy(got.positions.begin(), got.positions.end(), b.positions.begin());
    else
      for (int64_t i = 0; i < n * T; ++i) b.positions[i] = static_cast<int32_t>(i % T);
    if (!got.doc_start.empty()) {  // masked packing (rows past n: one document each)
      b.doc_start.assign(static_cast<size_t>(b.B * T), 0);
      std::copy(got.doc_start.begin(), got.doc_start.end(), b.doc_start.begin());
    }
  }

 private:
  std::unique_ptr<FinetuneDataset> ds_;
  uint64_t next_ = 0;
};

}  // namespace

int cmd_eval(const Args& raw_args) {
  ArgParser p("eval",
              "Prints the mean next-token loss (nats per target token) and the perplexity of a model over\n"
              "a whole dataset. Every target token is counted once: a token file (or byte-level text) is cut\n"
              "into non-overlapping windows of --seq-len predictions, the last one partial; text and .jsonl\n"
              "records become the fine-tuning examples `ramtrain train` would see (one per row, unpacked,\n"
              "long ones split), and only their trained tokens count (chat/instruction records: the replies).\n"
              "Runs on the GPU when one is present (--device), through the engine `train` uses.",
              "  ramtrain eval --model ./Qwen2.5-0.5B --data corpus.tok --seq-len 1024\n"
              "  ramtrain eval --model runs/chat/final --data held_out.jsonl --json\n"
              "  ramtrain eval --model runs/demo/final --data README.md docs --seq-len 256 --device cpu\n");
  p.option("model", "DIR", "HF model directory (config.json + safetensors), e.g. a run's final/ or an export");
  p.option("data", "PATH...", "evaluation data: one token file, or text/.jsonl files and directories");
  p.option("seq-len", "N", "predictions per row (default: the model's max_position_embeddings, at most 1024)");
  p.option("micro-batch", "B", "rows per forward pass", "4");
  p.option("tokenizer", "DIR", "tokenizer for text/.jsonl data (default: the --model dir's tokenizer.json/.model)");
  p.option("data-format", "auto|text|jsonl", "format of non-token data files (auto: *.jsonl is jsonl, the rest text)",
           "auto")
      .choice({"auto", "text", "jsonl"});
  p.option("text-split", "blank-lines|file", "text data: one example per blank-line-separated block, or per file",
           "blank-lines")
      .choice({"blank-lines", "file"});
  p.option("chat-format", "chatml|llama3|mistral",
           "chat format for chat/instruction records (default: from the tokenizer)")
      .choice({"chatml", "llama3", "mistral"});
  p.option("bad-lines", "abort|skip", "bad records: stop, or skip and count", "abort")
      .choice({"abort", "skip"});
  p.option("device", "auto|cpu|cuda", "compute device: auto picks the GPU when one is present", "auto")
      .choice({"auto", "cpu", "cuda"});
  p.option("threads", "N", "CPU threads (default: all cores)", "0").integer(0);
  p.flag("json", "print one JSON line: loss, perplexity, tokens, rows, seq_len, backend");

  // --data takes several paths: collect the words after it that are not options.
  Args args;
  std::vector<std::string> data_paths;
  for (size_t i = 0; i < raw_args.size(); ++i) {
    if (raw_args[i] == "--data") {
      while (i + 1 < raw_args.size() && raw_args[i + 1].rfind("--", 0) != 0) data_paths.push_back(raw_args[++i]);
      if (data_paths.empty()) fail("[eval] --data needs one or more paths");
    } else {
      args.push_back(raw_args[i]);
    }
  }
  if (!p.parse(args)) return 0;
  if (data_paths.empty() && p.given("data")) data_paths.push_back(p.str("data"));  // --data=PATH
  const std::string model_dir = resolve_model_dir(p.require("model"));
  if (data_paths.empty()) fail("[eval] --data is required: one token file, or text/.jsonl files and directories");
  for (const std::string& path : data_paths)
    if (!file_exists(path) && !is_directory(path) && !is_record_stream(path))
      fail("[eval] --data ", path, ": no such file or directory");
  const std::string device = p.str("device");
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));
  const int64_t B = p.integer("micro-batch");
  if (B < 1) fail("[eval] --micro-batch must be >= 1, got ", B);

  LoadedModel m = load_model_for_inference(model_dir, false, "[eval]");
  const ModelSpec& spec = m.spec;
  const int64_t T = p.given("seq-len") ? p.integer("seq-len") : std::min<int64_t>(spec.max_sequence(), 1024);
  if (T < 1) fail("[eval] --seq-len must be >= 1, got ", T);
  if (T > spec.max_sequence())
    fail("[eval] --seq-len ", T, " is longer than the model's ", spec.max_sequence_why(), "; pass --seq-len ",
         spec.max_sequence(), " or less");

  // The data, as rows.
  std::unique_ptr<EvalRows> rows;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> chat;
  std::string tok_dir = p.has("tokenizer") ? p.str("tokenizer") : std::string();
  if (p.has("tokenizer") && !has_tokenizer_files(tok_dir))
    fail("[eval] --tokenizer ", tok_dir, " holds neither tokenizer.json nor tokenizer.model");
  if (tok_dir.empty() && has_tokenizer_files(model_dir)) tok_dir = model_dir;
  const DataFormat format = data_format_parse(p.str("data-format"));
  if (data_paths.size() == 1 && TokenStream::looks_like_token_file(data_paths[0])) {
    TokenStream ts = TokenStream::open(data_paths[0]);
    ts.validate_ids(static_cast<uint64_t>(spec.vocab));
    rows = std::make_unique<StreamRows>(std::move(ts), T);
  } else {
    bool any_jsonl = false;
    for (const std::string& path : data_paths) {
      if (TokenStream::looks_like_token_file(path))
        fail("[eval] --data ", path, ": is a token file; give one token file on its own, or only text/.jsonl files");
      any_jsonl |= (file_exists(path) || is_record_stream(path)) && path_is_jsonl(path, format);
    }
    const bool byte_vocab = spec.vocab >= ByteTokenizer::vocab_size && spec.vocab <= 512;
    if (tok_dir.empty()) {
      if (!byte_vocab || any_jsonl || format == DataFormat::jsonl)
        fail("[eval] the data is text/.jsonl, which needs the model's tokenizer, but ", model_dir,
             " has no tokenizer.json or tokenizer.model. Pass --tokenizer DIR or a token file (`ramtrain tokenize`).");
      rows = std::make_unique<StreamRows>(load_text_documents(data_paths), T);
    } else {
      tok = tokenizer_load(tok_dir);
      if (tok->vocab_size() > spec.vocab)
        fail("[eval] the tokenizer ", tok->describe(), " has ", tok->vocab_size(), " ids but the model's vocab is ",
             spec.vocab, ": they do not belong together (pass the model's own tokenizer)");
      std::string no_chat;
      std::optional<ChatFormat> cf;
      if (p.has("chat-format"))
        cf = chat_format_parse(p.str("chat-format"));
      else
        cf = chat_format_detect(*tok, spec.family, &no_chat);
      if (cf) chat = std::make_unique<ChatTemplate>(*tok, *cf);
      std::vector<std::string> files;
      for (const std::string& path : data_paths) {
        if (is_directory(path))
          for (auto& f : text_document_paths({path})) files.push_back(f);
        else
          files.push_back(path);
      }
      FinetuneOptions fo;
      fo.seq_len = T;
      fo.val_fraction = 0;
      fo.truncation = Truncation::split;
      fo.pack = false;
      fo.pad_id = tok->eos_id().value_or(0);
      fo.records.format = format;
      fo.records.text_split = text_split_parse(p.str("text-split"));
      fo.records.bad_records = bad_record_policy_parse(p.str("bad-lines"));
      fo.records.label = "encoding data";
      fo.records.piece_bytes = tok->encodes_line_pieces_exactly() ? (1u << 20) : 0;
      const ExampleEncoder enc(*tok, chat.get(), no_chat, /*text_only=*/false, /*with_masks=*/true);
      auto ds = std::make_unique<FinetuneDataset>(files, enc, fo);
      std::fprintf(stderr, "tokenizer: %s; chat format: %s\n%s\n", tok->describe().c_str(),
                   chat ? chat_format_name(chat->format()) : "none", ds->stats().summary().c_str());
      rows = std::make_unique<ExampleRows>(std::move(ds));
    }
  }
  const uint64_t n_rows = rows->rows();
  if (n_rows == 0)
    fail("[eval] ", data_paths[0], data_paths.size() > 1 ? " (and the other --data paths)" : "",
         ": no token to predict (a token stream needs two or more tokens)");

  // The backend: the CUDA engine when asked for or (auto) when a GPU is present and can run the model.
  std::unique_ptr<Backend> backend;
  if (device == "cuda" && !cuda_backend_available())
    fail("[eval] --device cuda: no CUDA GPU can be used here (this build has no CUDA backend, or no GPU is visible); "
         "use --device cpu or auto");
  if (device == "cuda" || (device == "auto" && cuda_backend_available())) {
    CudaOptions co;
    co.verbose = false;
    if (device == "cuda") {
      backend = make_cuda_backend(*m.state, B, T, co);
    } else {
      try {
        backend = make_cuda_backend(*m.state, B, T, co);
      } catch (const Error& e) {
        std::fprintf(stderr, "note: a GPU is present but the CUDA engine cannot run this model (%s); using the CPU\n",
                     e.what());
      }
    }
  }
  std::unique_ptr<CpuOps> cpu_ops;
  std::unique_ptr<ModelRunner<CpuOps>> cpu_runner;
  if (!backend) {
    cpu_ops = std::make_unique<CpuOps>(spec);
    cpu_runner = std::make_unique<ModelRunner<CpuOps>>(*cpu_ops, spec, B, T);
  }
  const ModelWeightsT<float> w = m.state->weights();
  const std::string where = backend ? backend->describe() : std::string("cpu (fp32 reference, forward only)");

  double loss_sum = 0;
  int64_t n_tokens = 0;
  for (uint64_t r = 0; r < n_rows; r += static_cast<uint64_t>(B)) {
    const int64_t n = static_cast<int64_t>(std::min<uint64_t>(B, n_rows - r));
    Batch b;
    b.B = B;
    b.T = T;
    b.inputs.assign(B * T, 0);
    b.targets.assign(B * T, ignore_target);
    b.positions.resize(B * T);
    for (int64_t i = 0; i < B * T; ++i) b.positions[i] = static_cast<int32_t>(i % T);
    rows->fill(r, n, b);
    int64_t nv = 0;
    if (backend)
      loss_sum += backend->loss_sum(b, &nv);
    else
      loss_sum += cpu_runner->forward_backward(
          w, nullptr, BatchView{B, T, b.inputs.data(), b.targets.data(), b.positions.data(), batch_doc_start(b)}, 1.0f,
          &nv);
    n_tokens += nv;
  }
  if (n_tokens == 0) fail("[eval] the data holds no trained target token (every position is masked)");
  const double loss = loss_sum / static_cast<double>(n_tokens);
  if (!std::isfinite(loss)) fail("[eval] the loss is not finite (", loss, "): the model's weights hold NaN/Inf");
  const double ppl = std::exp(loss);
  if (p.on("json"))
    std::printf("%s\n", nlohmann::json({{"loss", loss},
                                        {"perplexity", ppl},
                                        {"tokens", n_tokens},
                                        {"rows", n_rows},
                                        {"seq_len", T},
                                        {"backend", where}})
                            .dump()
                            .c_str());
  else
    std::printf("eval: loss %.6f, perplexity %.4f over %lld target tokens in %llu rows of %lld (%s)\n", loss, ppl,
                static_cast<long long>(n_tokens), static_cast<unsigned long long>(n_rows), static_cast<long long>(T),
                where.c_str());
  return 0;
}

}  // namespace rt::cli
