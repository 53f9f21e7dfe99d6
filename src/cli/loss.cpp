// ramtrain loss: the loss (and optionally every gradient) of a HF model on
// token sequences, computed by the CPU reference. This is how users check
// that an imported model computes what transformers computes.
#include <cmath>
#include <cstdio>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/cpu_ops.h"
#include "io/safetensors.h"
#include "io/state_tensors.h"
#include "io/token_file.h"
#include "state/host_state.h"

namespace rt::cli {

namespace {

// Sequences from a text-ids file or any token file (one stream = one sequence).
TokenSequences read_sequences(const std::string& path) {
  if (TokenStream::looks_like_token_file(path)) {
    TokenStream ts = TokenStream::open(path);
    TokenSequences s;
    s.path = path;
    s.seqs.emplace_back(ts.size());
    ts.read(0, ts.size(), s.seqs.back().data());
    s.lines.push_back(1);
    return s;
  }
  return token_text_read(path);
}

}  // namespace

int cmd_loss(const Args& args) {
  ArgParser p("loss",
              "Loads a HF model directory (config.json + safetensors) and prints the mean next-token\n"
              "cross-entropy over every predicted position of every sequence, as transformers returns it\n"
              "for labels=input_ids. Computed in fp32 by the CPU reference backend.",
              "  ramtrain loss --model ./Qwen2.5-0.5B --tokens seqs.txt\n"
              "  ramtrain loss --model ./my-model --tokens seqs.txt --json --dump-grads grads.safetensors\n");
  p.option("model", "DIR", "HF model directory: config.json and model.safetensors (or a sharded index)");
  p.option("tokens", "FILE",
           "token sequences: a text file with one sequence of space-separated ids per line, or a token file "
           "(.bin / ramtrain format: one sequence)");
  p.flag("json", "print one JSON line with loss, tokens and sequences");
  p.option("dump-grads", "OUT.safetensors", "write every parameter's fp32 gradient under its HF name");
  p.option("threads", "N", "CPU threads (default: all cores)", "0");
  if (!p.parse(args)) return 0;
  const std::string model_dir = resolve_model_dir(p.require("model")), tokens_path = p.require("tokens");
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));

  LoadedModel m = load_model_for_inference(model_dir, p.has("dump-grads"), "[loss]");
  TokenSequences seqs = read_sequences(tokens_path);
  seqs.validate_ids(static_cast<uint64_t>(m.spec.vocab));

  int64_t n_pred_total = 0;
  for (size_t i = 0; i < seqs.seqs.size(); ++i) {
    const auto& s = seqs.seqs[i];
    if (static_cast<int64_t>(s.size()) > m.spec.max_sequence())
      fail("[loss] ", tokens_path, ":", seqs.lines[i], ": sequence of ", s.size(), " tokens is longer than the model's ",
           m.spec.max_sequence_why());
    if (s.size() >= 2) n_pred_total += static_cast<int64_t>(s.size()) - 1;
  }
  if (n_pred_total == 0)
    fail("[loss] ", tokens_path, ": no sequence has two or more tokens, so there is nothing to predict");

  CpuOps ops(m.spec);
  ModelWeightsT<float> w = m.state->weights();
  ModelGrads g;
  if (p.has("dump-grads")) g = m.state->grads();
  const float grad_scale = 1.0f / static_cast<float>(n_pred_total);
  // One runner per distinct length, sequences of equal length batched together.
  std::map<int64_t, std::vector<size_t>> by_len;
  for (size_t i = 0; i < seqs.seqs.size(); ++i)
    if (seqs.seqs[i].size() >= 2) by_len[static_cast<int64_t>(seqs.seqs[i].size())].push_back(i);
  double loss_sum = 0;
  for (auto& [T, idx] : by_len) {
    const int64_t B = static_cast<int64_t>(idx.size());
    std::vector<int32_t> ids(B * T), targets(B * T), pos(B * T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const auto& s = seqs.seqs[idx[b]];
        ids[b * T + t] = s[t];
        targets[b * T + t] = t + 1 < T ? s[t + 1] : -100;
        pos[b * T + t] = static_cast<int32_t>(t);
      }
    ModelRunner<CpuOps> runner(ops, m.spec, B, T);
    int64_t n_valid = 0;
    loss_sum += runner.forward_backward(w, p.has("dump-grads") ? &g : nullptr,
                                        BatchView{B, T, ids.data(), targets.data(), pos.data()}, grad_scale, &n_valid);
  }
  const double loss = loss_sum / static_cast<double>(n_pred_total);
  if (p.has("dump-grads")) safetensors_write(p.str("dump-grads"), grad_tensors(*m.state), {{"format", "pt"}});
  if (!std::isfinite(loss)) {  // JSON has no NaN: null, and a failure (as eval)
    if (p.on("json"))
      std::printf("{\"loss\": null, \"tokens\": %lld, \"sequences\": %zu}\n", static_cast<long long>(n_pred_total),
                  seqs.seqs.size());
    fail("[loss] the loss is not finite (", loss, "): the model's activations overflow fp32 on these tokens");
  }
  if (p.on("json"))
    std::printf("{\"loss\": %.9g, \"tokens\": %lld, \"sequences\": %zu}\n", loss, static_cast<long long>(n_pred_total),
                seqs.seqs.size());
  else
    std::printf("loss %.6f over %lld predicted tokens in %zu sequences\n", loss, static_cast<long long>(n_pred_total),
                seqs.seqs.size());
  return 0;
}

}  // namespace rt::cli
