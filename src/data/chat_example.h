// A rendered conversation (text + trained byte ranges) turned into token ids
// and a loss mask, as transformers' apply_chat_template(tokenize=True,
// return_assistant_tokens_mask=True) does it: the whole text goes to the
// tokenizer in ONE call (special-token strings become their ids, no template
// tokens are added), so a token may straddle the boundary between untrained
// and trained text (e.g. "<|im_start|>assistant\n" + "\n\nHi": the header's
// "\n" and the reply's "\n\n" are one token "\n\n\n", as HF makes it).
// The mask comes from each token's byte span (Tokenizer::encode_with_offsets):
//   a token is trained when its span overlaps a trained range [b, e), i.e. it
//   holds at least one trained byte. A token straddling a boundary is
//   trained: HF marks the tokens from char_to_token(b) to char_to_token(e-1)
//   inclusive, and TRL's assistant_only_loss uses that mask. An empty span
//   (no bytes of its own) at p is trained when b < p < e (it lies between
//   trained tokens, as HF's index range would include it).
// Our spans are HF's offsets without the ByteLevel post-processor's
// trim_offsets (which drops a token's leading/trailing spaces from its
// offsets): for a token of spaces alone at a range start HF's char_to_token
// finds no token; here it counts by its bytes.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace rt {

// One example of a rendered conversation: the text and its trained byte
// ranges [begin, end), sorted, not overlapping.
struct ChatExample {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;
};

// Appends the ids of ex.text to ids and one flag per id (1 = trained, by the
// rule above) to trained.
void chat_example_encode(const Tokenizer& tok, const ChatExample& ex, std::vector<int32_t>& ids,
                         std::vector<uint8_t>& trained);

// The mask rule alone: one flag per token span.
std::vector<uint8_t> trained_from_spans(const std::vector<TokenSpan>& spans,
                                        const std::vector<std::pair<size_t, size_t>>& ranges);

}  // namespace rt
