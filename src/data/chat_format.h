// Chat formats: conversations rendered into token ids with a per-token loss
// mask, in the format a model family was trained with.
//   chatml   (Qwen):    <|im_start|>ROLE\nCONTENT<|im_end|>\n  per message
//   llama3   (Llama-3): <|begin_of_text|> then per message
//                       <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
//   mistral  ([INST]):  BOS [INST] USER [/INST]ASSISTANT EOS [INST] ... ; a system
//                       message is put before the first user message + "\n\n".
// Rendering writes the conversation as one string (special tokens as their
// text, checked to encode back to their ids) and tokenizes it in one call;
// the mask comes from token offsets (data/chat_example.h: a token holding any
// trained byte is trained), so the ids are those of the whole rendered string,
// as HF's apply_chat_template gives them.
// Trained tokens (mask 1): the content of every assistant message and the
// end-of-turn token that closes it (<|im_end|>, <|eot_id|>, EOS); everything
// else (system, user, role headers, the "\n" after <|im_end|>) has mask 0.
// Content is encoded as HF does: special-token strings inside it become
// special tokens. No default system prompt is added.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_example.h"
#include "model/spec.h"
#include "tokenizer/tokenizer.h"

namespace rt {

enum class ChatFormat { chatml, llama3, mistral };
enum class ChatRole { system, user, assistant };

const char* chat_format_name(ChatFormat f);
ChatFormat chat_format_parse(const std::string& s);  // throws "[data] ..." listing the names
std::optional<ChatRole> chat_role_parse(std::string_view s);
const char* chat_role_name(ChatRole r);

struct ChatMessage {
  ChatRole role;
  std::string content;
};

// The format of a tokenizer + family: chatml when the tokenizer has
// <|im_start|>/<|im_end|>, llama3 when it has the Llama-3 header tokens,
// mistral for the llama/mistral families with BOS and EOS; otherwise nullopt
// and *why says what is missing (and to pass --chat-format).
std::optional<ChatFormat> chat_format_detect(const Tokenizer& tok, Family family, std::string* why);

class ChatTemplate {
 public:
  // Looks up the special tokens the format needs; throws "[data] ..." naming
  // the missing token and the tokenizer.
  ChatTemplate(const Tokenizer& tok, ChatFormat format);

  // Appends the rendering of msgs to ids and its mask to trained (one byte
  // per id). Returns "" or a message saying why the conversation cannot be
  // rendered in this format (mistral: system only first, then user and
  // assistant alternating, starting with user).
  std::string render(std::span<const ChatMessage> msgs, std::vector<int32_t>& ids, std::vector<uint8_t>& trained) const;
  // The rendered text and its trained byte ranges (appended to ex); "" or
  // why the conversation cannot be rendered, as render().
  std::string render_text(std::span<const ChatMessage> msgs, ChatExample& ex) const;
  // A generation prompt: user_text as the only user turn, then the opening of
  // the assistant turn (ChatML: "<|im_start|>assistant\n").
  std::vector<int32_t> render_prompt(std::string_view user_text) const;
  // The token that ends an assistant turn: stop sampling there.
  int32_t end_of_turn_id() const { return end_of_turn_; }
  ChatFormat format() const { return format_; }

 private:
  void header_append(ChatRole role, std::string& text) const;

  const Tokenizer& tok_;
  ChatFormat format_;
  int32_t begin_ = -1;  // chatml <|im_start|>, llama3 <|begin_of_text|>, mistral BOS (-1: none)
  int32_t header_open_ = -1, header_close_ = -1;  // llama3 <|start_header_id|>, <|end_header_id|>
  int32_t end_of_turn_ = -1;
  std::string begin_text_, header_open_text_, header_close_text_, end_of_turn_text_;  // their token texts
};

}  // namespace rt
