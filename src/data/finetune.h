// Fine-tuning data: examples with loss masks from text, .jsonl text,
// instruction and chat records, truncated and packed into rows of seq_len T.
// docs/finetune_data.md is the user-facing description.
//
// Records (data/records.h reads them; ExampleEncoder turns each into ids):
//   text:        the tokenizer's template (e.g. Llama-3 BOS) + ids + EOS; every token trained
//   {"text": s}: the same
//   {"instruction": i, "input": x, "output": o [, "system": s]}: a chat of one
//                user turn i + "\n\n" + x (just i when x is empty or absent)
//                and one assistant turn o; loss only on o and its end of turn
//   {"messages": [{"role": r, "content": c}, ...]}: rendered by the model's
//                chat_template when it has one (any roles, tool_calls,
//                "tools"), else by ChatTemplate (data/chat_format.h: system,
//                user, assistant); loss only on assistant turns and their
//                end-of-turn tokens; the rendering is one tokenizer call, the
//                mask from token offsets (data/chat_example.h)
//   {"conversations": [{"from": f, "value": v}, ...]}: ShareGPT, as messages
//   {"prompt": p, "completion": c}: prompt untrained, completion + EOS trained;
//                p + c is one tokenizer call, a token holding bytes of both
//                is trained (data/chat_example.h)
// An example of L tokens gives L-1 predictions: inputs ids[0, L-1), targets
// ids[1, L) where trained, ignore_target elsewhere; positions 0..L-2.
// Truncation (examples longer than T+1 tokens): keep_start keeps ids[0, T+1);
// drop drops the example; split cuts it into windows [kT, kT+T+1) (k = 0, 1, ...;
// each token is a target once), each its own example with positions from 0.
// Examples (or split windows) with no trained target left are dropped.
// Every truncation and drop is counted (FinetuneStats::summary).
// Packing: each epoch shuffles the train examples with window_order(n, seed,
// epoch) and packs them greedily in that order: an example goes into the
// current row when its L-1 predictions fit in what is left of the T slots,
// else it starts the next row. The tail of a row is padding (input pad_id,
// target ignore_target). Positions restart at 0 for every example. With
// pack_attention = masked (the default) each packed row carries doc_start
// (Batch::doc_start), taken from the packer's own example boundaries (not
// guessed from positions): every token of an example gets the row position
// of the example's first input token, the padding tail the position where it
// begins, so attention stays inside each example and a packed example sees
// exactly what it would alone in a row. cross: no doc_start, plain causal
// attention over the row (a token also attends to the earlier examples of
// its row). pack = false gives one example per row and no doc_start (the
// padding after the example cannot reach it under causal attention).
// Validation: the last floor(n * val_fraction) kept examples in file order,
// packed the same way without shuffling.
// Streaming: the inputs are scanned from mmap; the encoded examples go to
// an unlinked temporary file in cache_dir (4 bytes per token: the id, with
// the loss flag in bit 31) that is mmap'ed, so RAM holds only the index
// (16 bytes per example) and one epoch's order.
// Resuming: DataCursor {epoch, row}; the rows of an epoch depend only on
// the data, the options and the seed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fs.h"
#include "data/chat_format.h"
#include "data/dataset.h"
#include "data/hf_chat_template.h"
#include "data/loss_mask_file.h"
#include "io/token_file.h"
#include "data/records.h"
#include "tokenizer/tokenizer.h"

namespace rt {

enum class Truncation { keep_start, drop, split };
Truncation truncation_parse(const std::string& s);  // keep-start | drop | split
// Attention across the examples packed into one row.
enum class PackAttention { masked, cross };
PackAttention pack_attention_parse(const std::string& s);  // masked | cross

// Encodes records into ids and masks (a PieceEncoder for records_for_each).
// chat: the built-in template for instruction and chat records, or nullptr:
// then such records throw no_chat_reason (a setup error, not bad data),
// unless use_hf_template gave the model's own template, which then renders
// them (data/hf_chat_template.h: tool roles, tool calls, the template's
// loss-mask rule). text_only (ramtrain tokenize): instruction and chat
// records are bad records, since a plain token stream cannot keep their loss
// masks. Flags: bit 0 = trained; bit 1 (example_start) = the first token of
// another example of the same record (a template that is not prefix stable
// gives one example per assistant turn); FinetuneDataset splits there.
class ExampleEncoder {
 public:
  static constexpr uint8_t example_start = 2;
  ExampleEncoder(const Tokenizer& tok, const ChatTemplate* chat, std::string no_chat_reason, bool text_only,
                 bool with_masks);
  // Renders chat-like records with tpl (kept by the caller) and the special-token strings.
  void use_hf_template(const jinja::Template* tpl, jinja::Object specials);
  void encode(const RecordPiece& p, EncodedPiece& out) const;

 private:
  void encode_text(std::string_view text, bool first, bool last, EncodedPiece& out) const;
  void append_text(std::string_view text, uint8_t mask, EncodedPiece& out) const;
  void encode_chat(const RecordPiece& p, const nlohmann::ordered_json& j, const char* kind, EncodedPiece& out) const;
  void encode_hf(const RecordPiece& p, const nlohmann::ordered_json& msgs, const nlohmann::ordered_json& tools,
                 EncodedPiece& out) const;

  const Tokenizer& tok_;
  const ChatTemplate* chat_;
  std::string no_chat_reason_;
  bool text_only_, with_masks_;
  std::vector<int32_t> prefix_, suffix_;  // the tokenizer's template around one text
  int32_t eos_ = -1;                      // appended after a text unless suffix_ ends with it
  const jinja::Template* hf_ = nullptr;
  jinja::Object hf_specials_;
};

struct FinetuneOptions {
  int64_t seq_len = 0;        // T >= 1
  double val_fraction = 0.1;  // in [0, 1)
  uint64_t seed = 0;
  Truncation truncation = Truncation::keep_start;
  bool pack = true;
  PackAttention pack_attention = PackAttention::masked;  // only when pack
  int32_t pad_id = 0;
  RecordOptions records;
  std::string cache_dir;  // "": $TMPDIR, else /tmp
};

struct FinetuneStats {
  RecordStats records;
  uint64_t examples = 0;  // kept (train + validation)
  uint64_t val_examples = 0;
  uint64_t truncated = 0, truncated_tokens = 0;  // keep_start: examples cut, tokens cut off
  uint64_t split = 0, split_windows = 0;         // split: examples cut, windows made
  uint64_t dropped_too_long = 0;                 // drop
  uint64_t dropped_too_short = 0;                // fewer than 2 tokens
  uint64_t dropped_untrained = 0;                // no trained target (after truncation)
  uint64_t tokens = 0, trained_tokens = 0;       // predicted and trained positions, train part
  uint64_t val_tokens = 0;
  uint64_t rows_epoch0 = 0, val_rows = 0;
  std::string summary() const;  // several lines, every count above that is not zero
};

class FinetuneDataset final : public BatchSource {
 public:
  // Throws "[data] ..." for bad options, no train example, or val_fraction
  // > 0 with no validation example.
  FinetuneDataset(const std::vector<std::string>& files, const ExampleEncoder& enc, const FinetuneOptions& opt);
  // Examples from a token file and its loss-mask file (ramtrain tokenize of
  // chat/instruction data, data/loss_mask_file.h): each document one example,
  // trained where its flag says, truncated and packed as above.
  FinetuneDataset(const TokenStream& tokens, const LossMaskFile& mask, const FinetuneOptions& opt);

  Batch next_batch(int64_t B) override;
  DataCursor cursor() const override;
  void set_cursor(const DataCursor& c) override;  // throws when c.index > rows of c.epoch
  // Every batch has B rows (the CUDA engine needs a fixed shape): rows past
  // the last validation row are padding with no targets.
  std::vector<Batch> val_batches(int64_t B, int64_t max_batches) const override;
  int64_t seq_len() const override { return T_; }
  uint64_t train_token_count() const override { return stats_.tokens; }
  uint64_t val_token_count() const override { return stats_.val_tokens; }
  uint64_t train_window_count() const override { return stats_.rows_epoch0; }
  // Size, then the first, middle and last MiB of the example cache.
  uint64_t fingerprint() const override;
  // The encoded examples (token ids and targets), as cached on disk.
  const MappedFile& cache() const { return cache_; }

  const FinetuneStats& stats() const { return stats_; }
  uint64_t rows_in_epoch(uint64_t epoch);
  // The packed rows of epoch's order as example indices (tests, tools).
  std::vector<std::vector<uint64_t>> epoch_rows(uint64_t epoch);

 private:
  struct Example {
    uint64_t offset;  // first token in the cache
    uint32_t length;  // tokens, 2..T+1
  };
  using ExampleSink = std::function<void(std::span<const int32_t> ids, std::span<const uint8_t> trained)>;
  // Runs produce (which hands every example to the sink) and builds the cache, split and plan.
  void build(const std::string& name, const std::function<void(const ExampleSink&)>& produce);
  void plan_epoch(uint64_t epoch);
  void fill_row(const uint64_t* ex, size_t n, int64_t row, Batch& b) const;
  Batch make_batch(int64_t B) const;

  int64_t T_ = 0;
  FinetuneOptions opt_;
  FinetuneStats stats_;
  std::vector<Example> examples_;  // train examples, then validation examples
  uint64_t n_train_ = 0;
  MappedFile cache_;
  // the current epoch's plan: order_[row_begin_[r] .. row_begin_[r+1]) are the examples of row r
  uint64_t plan_epoch_ = 0;
  bool plan_valid_ = false;
  std::vector<uint64_t> order_, row_begin_;
  std::vector<uint64_t> val_order_, val_row_begin_;
  uint64_t epoch_ = 0, row_ = 0;
};

}  // namespace rt
