// ExampleEncoder (data/finetune.h): one record -> token ids and loss flags.
// Record formats (docs/finetune_data.md):
//   text / {"text": s}
//   {"messages": [...], "tools"?: [...]}            OpenAI / HF chat
//   {"conversations": [{"from", "value"}...], "system"?, "tools"?}   ShareGPT
//   {"instruction", "input"?, "output", "system"?}  Alpaca
//   {"prompt": s, "completion": s}                  prompt/completion pair
// Chat-like records become one message list; the model's own chat template
// renders it when the encoder has one (use_hf_template), else the built-in
// ChatTemplate (roles system/user/assistant only).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/quote.h"
#include "data/finetune.h"

namespace rt {

ExampleEncoder::ExampleEncoder(const Tokenizer& tok, const ChatTemplate* chat, std::string no_chat_reason,
                               bool text_only, bool with_masks)
    : tok_(tok),
      chat_(chat),
      no_chat_reason_(std::move(no_chat_reason)),
      text_only_(text_only),
      with_masks_(with_masks) {
  // The template's prefix and suffix: encode(x, true) = prefix + encode(x, false) + suffix.
  const std::vector<int32_t> full = tok.encode("a", true), bare = tok.encode("a", false);
  auto it = std::search(full.begin(), full.end(), bare.begin(), bare.end());
  RT_CHECK(!bare.empty() && it != full.end(), "[data] ", tok.describe(),
           ": cannot find the text inside the tokenizer's template (encode with and without special tokens)");
  prefix_.assign(full.begin(), it);
  suffix_.assign(it + static_cast<std::ptrdiff_t>(bare.size()), full.end());
  if (tok.eos_id()) eos_ = *tok.eos_id();
}

void ExampleEncoder::use_hf_template(const jinja::Template* tpl, jinja::Object specials) {
  hf_ = tpl;
  hf_specials_ = std::move(specials);
}

void ExampleEncoder::encode_text(std::string_view text, bool first, bool last, EncodedPiece& out) const {
  out.kind = "text";
  if (first) out.ids = prefix_;
  const std::vector<int32_t> e = tok_.encode(text, false);
  out.ids.insert(out.ids.end(), e.begin(), e.end());
  if (last) {
    out.ids.insert(out.ids.end(), suffix_.begin(), suffix_.end());
    if (eos_ >= 0 && (suffix_.empty() || suffix_.back() != eos_)) out.ids.push_back(eos_);
  }
  if (with_masks_) out.trained.assign(out.ids.size(), 1);
}

namespace {

using ojson = nlohmann::ordered_json;

const char* json_type(const ojson& j) { return j.type_name(); }

// nlohmann's message without its "[json.exception...] parse error at line 1, column N: " prefix.
std::string json_error_text(const nlohmann::json::parse_error& e) {
  std::string w = e.what();
  const size_t c = w.find("column ");
  if (c != std::string::npos) {
    const size_t colon = w.find(": ", c);
    if (colon != std::string::npos) return quote_input(w.substr(colon + 2));  // "last read: '<the token>'"
  }
  return quote_input(w);
}

bool field_string(const ojson& j, const char* key, std::string& out, bool required, const RecordPiece& p,
                  EncodedPiece& e, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || (!required && it->is_null())) {
    if (required) e.set_bad("missing field", cat(p.where(), ": ", what, " has no \"", key, "\" field"));
    return !required;
  }
  if (!it->is_string()) {
    e.set_bad("wrong field type", cat(p.where(), ": ", what, " \"", key, "\" must be a string, got ", json_type(*it)));
    return false;
  }
  out = it->get<std::string>();
  return true;
}

// ShareGPT speaker names -> roles.
const char* sharegpt_role(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "model" || from == "chatgpt" || from == "bard" || from == "bing")
    return "assistant";
  if (from == "system") return "system";
  if (from == "tool" || from == "observation" || from == "function_response" || from == "ipython") return "tool";
  return nullptr;
}

}  // namespace

void ExampleEncoder::append_text(std::string_view text, uint8_t mask, EncodedPiece& out) const {
  if (text.empty()) return;
  const std::vector<int32_t> e = tok_.encode(text, false);
  out.ids.insert(out.ids.end(), e.begin(), e.end());
  out.trained.insert(out.trained.end(), e.size(), mask);
}

void ExampleEncoder::encode_chat(const RecordPiece& p, const nlohmann::ordered_json& j, const char* kind,
                                 EncodedPiece& out) const {
  out.kind = kind;
  const std::string skind = kind;
  if (text_only_) {
    out.set_bad(cat(skind, " record"),
                cat(p.where(), ": a", skind == "instruction" ? "n " : " ", skind,
                    " record, but tokenize writes plain token streams, which cannot keep loss masks, so it reads only "
                    "{\"text\": ...} records; give the .jsonl to `ramtrain train --data` instead"));
    return;
  }
  ojson msgs = ojson::array();
  ojson tools = nullptr;
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (!j["tools"].is_array()) {
      out.set_bad("wrong field type",
                  cat(p.where(), ": \"tools\" must be an array of tool schemas, got ", json_type(j["tools"])));
      return;
    }
    tools = j["tools"];
  }
  if (skind == "instruction") {
    std::string system, instr, input, output;
    if (!field_string(j, "system", system, false, p, out, "the instruction record")) return;
    if (!field_string(j, "instruction", instr, true, p, out, "the instruction record")) return;
    if (!field_string(j, "input", input, false, p, out, "the instruction record")) return;
    if (!field_string(j, "output", output, true, p, out, "the instruction record")) return;
    if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    msgs.push_back({{"role", "user"}, {"content", input.empty() ? instr : instr + "\n\n" + input}});
    msgs.push_back({{"role", "assistant"}, {"content", output}});
  } else {
    const bool sharegpt = skind == "sharegpt";
    const ojson& m = j[sharegpt ? "conversations" : "messages"];
    const char* field = sharegpt ? "\"conversations\"" : "\"messages\"";
    if (!m.is_array()) {
      out.set_bad("wrong field type",
                  cat(p.where(), ": ", field, " must be an array of ",
                      sharegpt ? "{\"from\", \"value\"}" : "{\"role\", \"content\"}", " objects, got ", json_type(m)));
      return;
    }
    if (m.empty()) {
      out.set_bad("empty conversation",
                  cat(p.where(), ": empty conversation (", field, " is []): nothing to train on"));
      return;
    }
    if (sharegpt && j.contains("system")) {
      std::string system;
      if (!field_string(j, "system", system, false, p, out, "the ShareGPT record")) return;
      if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
    }
    for (size_t i = 0; i < m.size(); ++i) {
      const ojson& x = m[i];
      const std::string what = cat("message ", i + 1);
      if (!x.is_object()) {
        out.set_bad("wrong field type", cat(p.where(), ": ", what, " must be an object, got ", json_type(x)));
        return;
      }
      if (sharegpt) {
        std::string from, value;
        if (!field_string(x, "from", from, true, p, out, what)) return;
        if (!field_string(x, "value", value, true, p, out, what)) return;
        const char* role = sharegpt_role(from);
        if (!role) {
          out.set_bad("unknown role", cat(p.where(), ": ", what, " has unknown \"from\": \"", quote_input(from),
                                          "\"; ShareGPT speakers are human/user, gpt/assistant, system and tool"));
          return;
        }
        msgs.push_back({{"role", role}, {"content", value}});
      } else {
        std::string role;
        if (!field_string(x, "role", role, true, p, out, what)) return;
        if (!x.contains("content") && !x.contains("tool_calls")) {
          out.set_bad("missing field", cat(p.where(), ": ", what, " has no \"content\" field"));
          return;
        }
        msgs.push_back(x);
      }
    }
  }
  std::vector<ChatMessage> cm;  // the built-in format's view: roles system/user/assistant, string content
  if (!hf_) {
    if (!chat_) fail("[data] ", p.where(), ": ", kind, " records need a chat format, but ", no_chat_reason_);
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ojson& x = msgs[i];
      std::string role, content;
      const std::string what = cat("message ", i + 1);
      if (!field_string(x, "role", role, true, p, out, what)) return;
      auto r = chat_role_parse(role);
      if (!r || x.contains("tool_calls")) {
        out.set_bad("unknown role", cat(p.where(), ": ", what, " has ",
                                        r ? "tool_calls" : cat("unknown role \"", quote_input(role), "\""),
                                        "; the roles are system, user and assistant (the built-in chat format ",
                                        chat_format_name(chat_->format()),
                                        "; a model dir with a chat_template renders tool roles and tool calls)"));
        return;
      }
      if (!field_string(x, "content", content, true, p, out, what)) return;
      cm.push_back({*r, std::move(content)});
    }
  }
  bool any_assistant = false;
  for (const auto& x : msgs) any_assistant |= x.value("role", "") == "assistant";
  if (!any_assistant) {
    out.set_bad("no assistant message",
                cat(p.where(), ": the conversation has no assistant message: nothing to train on"));
    return;
  }
  if (hf_) return encode_hf(p, msgs, tools, out);
  const std::string err = chat_->render(cm, out.ids, out.trained);
  if (!err.empty()) {
    out.set_bad("turn order", cat(p.where(), ": ", err));
    return;
  }
  if (!with_masks_) out.trained.clear();
}

// Renders with the model's template; each example's text is encoded in one
// tokenizer call and masked by token offsets (data/chat_example.h), as
// apply_chat_template(tokenize=True, return_assistant_tokens_mask=True) does.
// Examples after the first start with flag bit 1 set (example_start), which
// FinetuneDataset splits on.
void ExampleEncoder::encode_hf(const RecordPiece& p, const nlohmann::ordered_json& msgs,
                               const nlohmann::ordered_json& tools, EncodedPiece& out) const {
  std::vector<ChatExample> examples;
  try {
    examples = hf_chat_examples(*hf_, msgs, tools, hf_specials_);
  } catch (const Error& e) {
    out.set_bad("template refused", cat(p.where(), ": ", e.what()));
    return;
  }
  for (size_t k = 0; k < examples.size(); ++k) {
    const size_t first = out.ids.size();
    chat_example_encode(tok_, examples[k], out.ids, out.trained);
    if (k > 0 && out.ids.size() > first) out.trained[first] |= example_start;
  }
  if (!with_masks_) out.trained.clear();
}

void ExampleEncoder::encode(const RecordPiece& p, EncodedPiece& out) const {
  if (!p.jsonl) {
    encode_text(p.bytes, p.first, p.last, out);
    return;
  }
  ojson j;
  try {
    j = ojson::parse(p.bytes);
  } catch (const nlohmann::json::parse_error& e) {
    out.set_bad("malformed JSON", cat(p.where(), ":", e.byte, ": malformed JSON: ", json_error_text(e)));
    return;
  }
  if (!j.is_object()) {
    out.set_bad("not a JSON object", cat(p.where(), ": expected a JSON object, got ", json_type(j)));
    return;
  }
  if (j.contains("messages")) return encode_chat(p, j, "chat", out);
  if (j.contains("conversations")) return encode_chat(p, j, "sharegpt", out);
  if (j.contains("instruction") || j.contains("output")) return encode_chat(p, j, "instruction", out);
  if (j.contains("prompt") || j.contains("completion")) {
    out.kind = "prompt-completion";
    std::string prompt, completion;
    if (!field_string(j, "prompt", prompt, true, p, out, "the prompt/completion record")) return;
    if (!field_string(j, "completion", completion, true, p, out, "the prompt/completion record")) return;
    if (text_only_) {
      out.set_bad("prompt-completion record",
                  cat(p.where(),
                      ": a prompt/completion record, but tokenize writes plain token streams, which cannot "
                      "keep its loss mask; give the .jsonl to `ramtrain train --data` instead"));
      return;
    }
    // prefix (e.g. BOS) + prompt untrained, completion + suffix + EOS trained;
    // prompt + completion is one tokenizer call, masked by token offsets
    // (a token straddling the two is trained: data/chat_example.h)
    out.ids = prefix_;
    out.trained.assign(prefix_.size(), 0);
    if (!completion.empty())
      chat_example_encode(tok_, ChatExample{prompt + completion, {{prompt.size(), prompt.size() + completion.size()}}},
                          out.ids, out.trained);
    else
      append_text(prompt, 0, out);
    for (int32_t id : suffix_) {
      out.ids.push_back(id);
      out.trained.push_back(1);
    }
    if (eos_ >= 0 && (suffix_.empty() || suffix_.back() != eos_)) {
      out.ids.push_back(eos_);
      out.trained.push_back(1);
    }
    if (!with_masks_) out.trained.clear();
    return;
  }
  if (j.contains("text")) {
    std::string text;
    if (!field_string(j, "text", text, true, p, out, "the record")) return;
    if (text.empty()) {
      out.skip_reason = "empty texts";
      return;
    }
    return encode_text(text, true, true, out);
  }
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += cat(keys.empty() ? "" : ", ", "\"", it.key(), "\"");
  out.set_bad(
      "missing field",
      cat(p.where(), ": the record has no \"text\", \"messages\", \"conversations\", \"instruction\"/\"output\" ",
          "or \"prompt\"/\"completion\" field (its fields: ", keys.empty() ? "none" : quote_input(keys), ")"));
}

}  // namespace rt
