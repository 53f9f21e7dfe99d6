// ramtrain sample: generate text from a model directory, with the model's own
// tokenizer (tokenizer.json / tokenizer.model) or ramtrain's byte tokenizer.
// --chat wraps the prompt as one user turn in the model's chat format and
// stops at the end-of-turn token: the model dir's own chat_template
// (data/hf_chat_template.h, rendered as apply_chat_template with
// add_generation_prompt) when it has one, else a built-in format;
// --chat-format picks a built-in format instead. SIGINT/SIGTERM stop
// generation at the next token: what was generated is printed and the exit
// code is 128 + signal.
#include <csignal>
#include <cstdio>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_dir.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "data/byte_tokenizer.h"
#include "data/chat_format.h"
#include "data/hf_chat_template.h"
#include "engine/sampler.h"
#include "engine/trainer.h"
#include "tokenizer/tokenizer.h"

namespace rt::cli {

namespace {

// sample_tokens, telling first when the text will outgrow the model's positions.
std::vector<int32_t> sample_with_note(const HostState& st, const std::vector<int32_t>& ids, const SampleOptions& so) {
  const ModelSpec& s = st.spec();
  if (static_cast<int64_t>(ids.size()) + so.max_new_tokens > s.max_sequence())
    std::fprintf(stderr,
                 "note: the prompt (%zu tokens) and --max-tokens %lld reach past the model's %s; from there on "
                 "the newest three quarters of the text are its context\n",
                 ids.size(), static_cast<long long>(so.max_new_tokens), s.max_sequence_why().c_str());
  return sample_tokens(st, ids, so);
}

}  // namespace

int cmd_sample(const Args& args) {
  ArgParser p("sample",
              "Generates text from a model directory (a HF model, or one written by 'ramtrain train'), with the\n"
              "model's tokenizer. --chat talks to a chat model: the prompt becomes a user turn in the model's chat\n"
              "format and generation stops at the end of the assistant turn. Sampling is seeded: the same seed\n"
              "gives the same text.",
              "  ramtrain sample --model runs/demo/final --prompt \"Once upon a time\"\n"
              "  ramtrain sample --model runs/demo/final --prompt \"int main\" --temperature 0 --max-tokens 100\n"
              "  ramtrain sample --model runs/chat/final --chat --prompt \"What is RAM?\"\n");
  p.group("Model and prompt");
  p.option("model", "DIR|ORG/NAME",
           "model directory (config.json + safetensors + tokenizer), or a model id in the "
           "local HF cache");
  p.option("prompt", "TEXT", "text to continue (with --chat: the user's message)", "");
  p.flag("chat", "wrap the prompt as a user turn in the chat format and stop at the end of the reply");
  p.option("chat-format", "chatml|llama3|mistral",
           "built-in chat format for --chat (default: the model's chat_template, else from the tokenizer)")
      .choice({"chatml", "llama3", "mistral"});
  p.option("chat-template-var", "NAME=VALUE...",
           "variables for the model's chat_template, NAME=VALUE (VALUE as JSON when it is, else a string), e.g. "
           "reasoning_effort=high enable_thinking=false")
      .list();
  p.group("Sampling");
  p.option("max-tokens", "N", "new tokens to generate (SIGINT/SIGTERM stop at the next one)", "200").integer(0);
  p.option("temperature", "T", "softmax temperature (0: greedy)", "0.8").number(0);
  p.option("top-k", "K", "sample among the K most likely tokens (0: all)", "40").integer(0);
  p.option("seed", "S", "random seed", "0").integer(0);
  p.option("threads", "N", "CPU threads (0: all cores)", "0").integer(0, 4096);
  if (!p.parse(args)) return 0;
  if (p.integer("threads") > 0) set_global_threads(static_cast<int>(p.integer("threads")));
  const std::string dir = resolve_model_dir(p.require("model"));
  install_stop_handler();  // generation stops at the next token; what was generated is printed
  auto stopped = [] {
    if (!Trainer::stop_flag().load()) return 0;
    const int sig = Trainer::stop_signal() ? Trainer::stop_signal() : SIGINT;
    std::fflush(stdout);
    std::fprintf(stderr, "interrupted by %s: generation stopped\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    return 128 + sig;
  };
  LoadedModel m = load_model_for_inference(dir, false, "[sample]");
  SampleOptions so;
  so.max_new_tokens = p.integer("max-tokens");
  so.temperature = p.number("temperature");
  so.top_k = p.integer("top-k");
  so.seed = static_cast<uint64_t>(p.integer("seed"));
  so.stop = &Trainer::stop_flag();
  RT_CHECK(so.max_new_tokens >= 0, "[sample] --max-tokens must be >= 0");
  RT_CHECK(so.temperature >= 0, "[sample] --temperature must be >= 0");
  const std::string prompt = p.str("prompt");
  const bool chat = p.on("chat");

  if (m.tokenizer == "byte") {
    if (chat) fail("[sample] --chat needs a tokenizer with a chat format; ", dir, " has ramtrain's byte tokenizer");
    ByteTokenizer tok;
    so.stop_ids = {ByteTokenizer::eos_id};
    so.vocab_limit = ByteTokenizer::vocab_size;  // the vocab may be padded past the 258 byte ids
    std::vector<int32_t> ids = tok.encode(prompt);
    ids.insert(ids.begin(), ByteTokenizer::bos_id);
    std::vector<int32_t> out = sample_with_note(*m.state, ids, so);
    std::printf("%s%s\n", prompt.c_str(), tok.decode(out).c_str());
    return stopped();
  }
  if (m.tokenizer != "hf")
    fail("[sample] ", dir,
         " has no tokenizer: copy the model's tokenizer.json (or tokenizer.model) and "
         "tokenizer_config.json into it");
  const auto tok = tokenizer_load(dir);
  if (tok->vocab_size() > m.spec.vocab)
    fail("[sample] the tokenizer ", tok->describe(), " has ", tok->vocab_size(), " ids but the model's vocab is ",
         m.spec.vocab, ": they do not belong together");
  so.vocab_limit = tok->vocab_size();  // padded embedding rows are never sampled
  std::vector<int32_t> ids;
  for (int64_t e : m.spec.eos_ids) so.stop_ids.push_back(e);
  if (tok->eos_id()) so.stop_ids.push_back(*tok->eos_id());
  std::optional<HfChatTemplate> hf_tpl;
  if (chat && !p.has("chat-format")) hf_tpl = hf_chat_template_find(dir);
  if (hf_tpl) hf_chat_vars_assign(p.list("chat-template-var"), hf_tpl->specials, "--chat-template-var");
  if (hf_tpl) {
    const jinja::Template tpl(hf_tpl->source, hf_tpl->origin);
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back({{"role", "user"}, {"content", prompt}});
    const std::string text = tpl.render(hf_chat_vars(msgs, nullptr, /*add_generation_prompt=*/true, hf_tpl->specials));
    ids = tok->encode(text, /*add_special=*/false);  // as apply_chat_template(tokenize=True): the template adds BOS
    std::fprintf(stderr, "chat template: %s (prompt %zu tokens)\n", hf_tpl->origin.c_str(), ids.size());
    if (const jinja::Value* eos = hf_tpl->specials.find("eos_token"); eos && eos->is_string())
      if (auto id = tok->token_to_id(eos->s)) so.stop_ids.push_back(*id);
  } else if (chat) {
    std::string why;
    std::optional<ChatFormat> cf;
    if (p.has("chat-format"))
      cf = chat_format_parse(p.str("chat-format"));
    else
      cf = chat_format_detect(*tok, m.spec.family, &why);
    if (!cf) fail("[sample] ", why);
    const ChatTemplate tpl(*tok, *cf);
    ids = tpl.render_prompt(prompt);
    so.stop_ids.push_back(tpl.end_of_turn_id());
  } else {
    ids = tok->encode(prompt, true);
    if (ids.empty()) fail("[sample] the prompt is empty and the tokenizer adds no BOS: give --prompt TEXT (or --chat)");
  }
  std::vector<int32_t> out = sample_with_note(*m.state, ids, so);
  const std::string text = tok->decode(out, /*skip_special=*/true);
  if (chat)
    std::printf("%s\n", text.c_str());
  else
    std::printf("%s%s\n", prompt.c_str(), text.c_str());
  return stopped();
}

}  // namespace rt::cli
