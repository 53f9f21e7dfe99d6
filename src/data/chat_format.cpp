#include "data/chat_format.h"

#include "core/error.h"

namespace rt {

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::chatml:
      return "chatml";
    case ChatFormat::llama3:
      return "llama3";
    case ChatFormat::mistral:
      return "mistral";
  }
  return "?";
}

ChatFormat chat_format_parse(const std::string& s) {
  if (s == "chatml") return ChatFormat::chatml;
  if (s == "llama3") return ChatFormat::llama3;
  if (s == "mistral") return ChatFormat::mistral;
  fail("[data] unknown chat format '", s, "': use chatml (Qwen), llama3 (Llama-3) or mistral ([INST])");
}

std::optional<ChatRole> chat_role_parse(std::string_view s) {
  if (s == "system") return ChatRole::system;
  if (s == "user") return ChatRole::user;
  if (s == "assistant") return ChatRole::assistant;
  return std::nullopt;
}

const char* chat_role_name(ChatRole r) {
  switch (r) {
    case ChatRole::system:
      return "system";
    case ChatRole::user:
      return "user";
    case ChatRole::assistant:
      return "assistant";
  }
  return "?";
}

std::optional<ChatFormat> chat_format_detect(const Tokenizer& tok, Family family, std::string* why) {
  if (tok.token_to_id("<|im_start|>") && tok.token_to_id("<|im_end|>")) return ChatFormat::chatml;
  if (tok.token_to_id("<|start_header_id|>") && tok.token_to_id("<|end_header_id|>") && tok.token_to_id("<|eot_id|>") &&
      tok.token_to_id("<|begin_of_text|>"))
    return ChatFormat::llama3;
  if ((family == Family::mistral || family == Family::llama) && tok.bos_id() && tok.eos_id())
    return ChatFormat::mistral;
  if (why)
    *why = cat("cannot tell the chat format of ", tok.describe(), " (", family_name(family),
               " family): it has neither <|im_start|>/<|im_end|> (chatml) nor the Llama-3 header tokens, and ",
               (family == Family::mistral || family == Family::llama) ? "no BOS/EOS for [INST] (mistral)"
                                                                      : "the family has no [INST] format",
               "; pass --chat-format chatml|llama3|mistral");
  return std::nullopt;
}

namespace {

int32_t special_id(const Tokenizer& tok, const char* name, ChatFormat f) {
  auto id = tok.token_to_id(name);
  if (!id)
    fail("[data] chat format ", chat_format_name(f), " needs the special token ", name, ", which ", tok.describe(),
         " does not have; pick the model's own format with --chat-format");
  return *id;
}

// The text of special token id, checked to encode back to that one id (the
// rendered text goes to the tokenizer as one string).
std::string special_text(const Tokenizer& tok, int32_t id, ChatFormat f) {
  const int32_t one[1] = {id};
  std::string s = tok.decode(one, /*skip_special=*/false);
  const std::vector<int32_t> back = tok.encode(s, false);
  if (back.size() != 1 || back[0] != id)
    fail("[data] chat format ", chat_format_name(f), ": token ", id, " of ", tok.describe(), " decodes to '", s,
         "', which does not encode back to that token (it is not an added/special token of the tokenizer); pick "
         "the model's own format with --chat-format or use a model dir with a chat_template");
  return s;
}

}  // namespace

ChatTemplate::ChatTemplate(const Tokenizer& tok, ChatFormat format) : tok_(tok), format_(format) {
  switch (format) {
    case ChatFormat::chatml:
      begin_ = special_id(tok, "<|im_start|>", format);
      end_of_turn_ = special_id(tok, "<|im_end|>", format);
      break;
    case ChatFormat::llama3:
      begin_ = special_id(tok, "<|begin_of_text|>", format);
      header_open_ = special_id(tok, "<|start_header_id|>", format);
      header_close_ = special_id(tok, "<|end_header_id|>", format);
      end_of_turn_ = special_id(tok, "<|eot_id|>", format);
      header_open_text_ = special_text(tok, header_open_, format);
      header_close_text_ = special_text(tok, header_close_, format);
      break;
    case ChatFormat::mistral:
      begin_ = tok.bos_id().value_or(-1);
      if (!tok.eos_id())
        fail("[data] chat format mistral ends each assistant turn with EOS, but ", tok.describe(),
             " has no EOS token (tokenizer_config.json eos_token); pick the model's own format with --chat-format");
      end_of_turn_ = *tok.eos_id();
      break;
  }
  if (begin_ >= 0) begin_text_ = special_text(tok, begin_, format);
  end_of_turn_text_ = special_text(tok, end_of_turn_, format);
}

// The untrained opening of a turn.
void ChatTemplate::header_append(ChatRole role, std::string& text) const {
  if (format_ == ChatFormat::chatml) {
    text += begin_text_;
    text += chat_role_name(role);
    text += '\n';
  } else {  // llama3
    text += header_open_text_;
    text += chat_role_name(role);
    text += header_close_text_;
    text += "\n\n";
  }
}

std::string ChatTemplate::render_text(std::span<const ChatMessage> msgs, ChatExample& ex) const {
  std::string& text = ex.text;
  if (format_ == ChatFormat::mistral) {
    size_t i = 0;
    std::string system;
    if (!msgs.empty() && msgs[0].role == ChatRole::system) system = msgs[i++].content;
    text += begin_text_;
    for (size_t k = 0; i < msgs.size(); ++i, ++k) {
      const ChatRole want = k % 2 == 0 ? ChatRole::user : ChatRole::assistant;
      if (msgs[i].role != want)
        return cat("message ", i + 1, " is a ", chat_role_name(msgs[i].role),
                   " message where the mistral format needs ", chat_role_name(want),
                   " (a system message only first, then user and assistant alternating)");
      if (want == ChatRole::user) {
        const std::string user = k == 0 && !system.empty() ? system + "\n\n" + msgs[i].content : msgs[i].content;
        text += "[INST] " + user + " [/INST]";
      } else {
        const size_t b = text.size();
        text += msgs[i].content;
        text += end_of_turn_text_;
        ex.trained.emplace_back(b, text.size());
      }
    }
    return "";
  }
  if (format_ == ChatFormat::llama3) text += begin_text_;
  for (const ChatMessage& m : msgs) {
    header_append(m.role, text);
    const size_t b = text.size();
    text += m.content;
    text += end_of_turn_text_;
    if (m.role == ChatRole::assistant) ex.trained.emplace_back(b, text.size());
    if (format_ == ChatFormat::chatml) text += '\n';
  }
  return "";
}

std::string ChatTemplate::render(std::span<const ChatMessage> msgs, std::vector<int32_t>& ids,
                                 std::vector<uint8_t>& trained) const {
  ChatExample ex;
  std::string err = render_text(msgs, ex);
  if (!err.empty()) return err;
  chat_example_encode(tok_, ex, ids, trained);
  return "";
}

std::vector<int32_t> ChatTemplate::render_prompt(std::string_view user_text) const {
  ChatExample ex;
  const ChatMessage user{ChatRole::user, std::string(user_text)};
  const std::string err = render_text(std::span<const ChatMessage>(&user, 1), ex);
  RT_CHECK(err.empty(), "[data] ", err);
  if (format_ != ChatFormat::mistral) header_append(ChatRole::assistant, ex.text);
  return tok_.encode(ex.text, /*add_special=*/false);
}

}  // namespace rt
