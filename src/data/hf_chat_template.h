// A model's own chat template (HF `chat_template`), rendered as transformers'
// apply_chat_template renders it, plus the loss-mask spans of a rendering.
//
// Where the template comes from (hf_chat_template_find): the model dir's
// chat_template.jinja, else chat_template.json {"chat_template": ...}, else
// tokenizer_config.json "chat_template" (a string, or a list of
// {"name", "template"} of which "default" is used).
//
// Variables the template sees (as transformers passes them): messages
// (each message as given, with reasoning copied between "reasoning_content",
// "thinking" and "reasoning" as transformers' _alias_reasoning_fields does),
// tools (null when none), documents (null), add_generation_prompt, the
// special-token strings (bos_token, eos_token, ... from tokenizer_config.json)
// and any extra variables (e.g. enable_thinking, date_string).
//
// Loss-mask rule (hf_chat_trained_spans): for each assistant message k,
//   P_k = render(messages[0..k), add_generation_prompt=true)
//   Q_k = render(messages[0..k], add_generation_prompt=false)
// The trained text of turn k is Q_k minus its prefix P_k, without trailing
// whitespace (e.g. the "\n" after <|im_end|>): the assistant's content, any
// tool calls and reasoning the template renders there, and its end-of-turn
// token. When Q_k does not start with P_k (Mistral-Nemo moves the system
// message into the last user message), the turn starts instead at the first
// byte where Q_k differs from the rendering with turn k replaced by an empty
// assistant message, backed up to just after the last occurrence of the
// generation prompt's text (P_k minus the rendering of messages[0..k)
// without it, e.g. gpt-oss's "<|start|>assistant") before that byte, when
// there is one (gpt-oss drops an earlier tool call's reasoning once a final
// answer follows, and both renderings continue with "<|channel|>"). For one example per
// conversation, every Q_k to be a prefix of the full rendering ("prefix
// stable"). Templates that re-render earlier turns differently once later
// turns follow (Qwen3 drops the reasoning of turns before the last user
// message) are not prefix stable: then each assistant turn k becomes its own
// example, the text Q_k with only turn k trained, which is exactly what the
// model sees when it generates that turn.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/chat_example.h"
#include "data/jinja_template.h"

namespace rt {

struct HfChatTemplate {
  std::string source;      // the template text
  std::string origin;      // file it came from, for messages
  jinja::Object specials;  // bos_token, eos_token, ... strings (or null)
};

// The model dir's template, or nullopt when it has none. Throws "[data] ..."
// naming the file when a file is there but unreadable or malformed.
std::optional<HfChatTemplate> hf_chat_template_find(const std::string& model_dir);

// Template variables given as NAME=VALUE words (e.g. reasoning_effort=high,
// enable_thinking=false), added to vars: VALUE is read as JSON when it is
// JSON (true, 3, "x", [1]), else taken as a string. Throws "[data] ..."
// naming option for a word without '=', an empty or non-identifier NAME, or
// a NAME apply_chat_template sets itself (messages, tools, documents,
// add_generation_prompt).
void hf_chat_vars_assign(const std::vector<std::string>& words, jinja::Object& vars, const std::string& option);

// The variables apply_chat_template passes (see above). messages: a JSON
// array of message objects; tools: a JSON array or null.
jinja::Object hf_chat_vars(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                           bool add_generation_prompt, const jinja::Object& specials,
                           const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// The examples of one conversation under the loss-mask rule above (one when
// the template is prefix stable). Throws rt::Error "[template] ..." when the
// template raises.
std::vector<ChatExample> hf_chat_examples(const jinja::Template& tpl, const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools, const jinja::Object& specials,
                                          const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace rt
