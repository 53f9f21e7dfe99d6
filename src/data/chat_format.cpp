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
      break;
    case ChatFormat::mistral:
      begin_ = tok.bos_id().value_or(-1);
      if (!tok.eos_id())
        fail("[data] chat format mistral ends each assistant turn with EOS, but ", tok.describe(),
             " has no EOS token (tokenizer_config.json eos_token); pick the model's own format with --chat-format");
      end_of_turn_ = *tok.eos_id();
      break;
  }
}

void ChatTemplate::encode_append(std::string_view text, std::vector<int32_t>& ids, std::vector<uint8_t>& trained,
                                 uint8_t mask) const {
  if (text.empty()) return;
  const std::vector<int32_t> e = tok_.encode(text, /*add_special=*/false);
  ids.insert(ids.end(), e.begin(), e.end());
  trained.insert(trained.end(), e.size(), mask);
}

// The untrained opening of a turn.
void ChatTemplate::header_append(ChatRole role, std::vector<int32_t>& ids, std::vector<uint8_t>& trained) const {
  if (format_ == ChatFormat::chatml) {
    ids.push_back(begin_);
    trained.push_back(0);
    encode_append(std::string(chat_role_name(role)) + "\n", ids, trained, 0);
  } else {  // llama3
    ids.push_back(header_open_);
    trained.push_back(0);
    encode_append(chat_role_name(role), ids, trained, 0);
    ids.push_back(header_close_);
    trained.push_back(0);
    encode_append("\n\n", ids, trained, 0);
  }
}

std::string ChatTemplate::render(std::span<const ChatMessage> msgs, std::vector<int32_t>& ids,
                                 std::vector<uint8_t>& trained) const {
  if (format_ == ChatFormat::mistral) {
    size_t i = 0;
    std::string system;
    if (!msgs.empty() && msgs[0].role == ChatRole::system) system = msgs[i++].content;
    if (begin_ >= 0) {
      ids.push_back(begin_);
      trained.push_back(0);
    }
    for (size_t k = 0; i < msgs.size(); ++i, ++k) {
      const ChatRole want = k % 2 == 0 ? ChatRole::user : ChatRole::assistant;
      if (msgs[i].role != want)
        return cat("message ", i + 1, " is a ", chat_role_name(msgs[i].role),
                   " message where the mistral format needs ", chat_role_name(want),
                   " (a system message only first, then user and assistant alternating)");
      if (want == ChatRole::user) {
        const std::string user = k == 0 && !system.empty() ? system + "\n\n" + msgs[i].content : msgs[i].content;
        encode_append("[INST] " + user + " [/INST]", ids, trained, 0);
      } else {
        encode_append(msgs[i].content, ids, trained, 1);
        ids.push_back(end_of_turn_);
        trained.push_back(1);
      }
    }
    return "";
  }
  if (format_ == ChatFormat::llama3) {
    ids.push_back(begin_);
    trained.push_back(0);
  }
  for (const ChatMessage& m : msgs) {
    const uint8_t mask = m.role == ChatRole::assistant ? 1 : 0;
    header_append(m.role, ids, trained);
    encode_append(m.content, ids, trained, mask);
    ids.push_back(end_of_turn_);
    trained.push_back(mask);
    if (format_ == ChatFormat::chatml) encode_append("\n", ids, trained, 0);
  }
  return "";
}

std::vector<int32_t> ChatTemplate::render_prompt(std::string_view user_text) const {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  const ChatMessage user{ChatRole::user, std::string(user_text)};
  const std::string err = render(std::span<const ChatMessage>(&user, 1), ids, trained);
  RT_CHECK(err.empty(), "[data] ", err);
  if (format_ != ChatFormat::mistral) header_append(ChatRole::assistant, ids, trained);
  return ids;
}

}  // namespace rt
