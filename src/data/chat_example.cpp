// One-call tokenization of a rendered conversation and its loss mask; see chat_example.h.
#include "data/chat_example.h"

#include <algorithm>

namespace rt {

std::vector<uint8_t> trained_from_spans(const std::vector<TokenSpan>& spans,
                                        const std::vector<std::pair<size_t, size_t>>& ranges) {
  std::vector<uint8_t> out(spans.size(), 0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const TokenSpan s = spans[i];
    // the first range ending after s.begin (ranges are sorted and disjoint)
    auto it = std::upper_bound(ranges.begin(), ranges.end(), s.begin,
                               [](size_t v, const std::pair<size_t, size_t>& r) { return v < r.second; });
    if (it == ranges.end()) continue;
    if (s.begin < s.end)
      out[i] = it->first < s.end;  // overlap: r.first < s.end and r.second > s.begin
    else
      out[i] = it->first < s.begin;  // empty: r.first < p < r.second
  }
  return out;
}

void chat_example_encode(const Tokenizer& tok, const ChatExample& ex, std::vector<int32_t>& ids,
                         std::vector<uint8_t>& trained) {
  std::vector<TokenSpan> spans;
  const std::vector<int32_t> e = tok.encode_with_offsets(ex.text, /*add_special=*/false, spans);
  const std::vector<uint8_t> m = trained_from_spans(spans, ex.trained);
  ids.insert(ids.end(), e.begin(), e.end());
  trained.insert(trained.end(), m.begin(), m.end());
}

}  // namespace rt
