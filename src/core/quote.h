// Quoting user input in messages. Every message that repeats a piece of the
// user's input (a data line, a JSON token, a field value, an option value)
// passes it through quote_input, so a 10 MB line gives a readable error.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace rt {

constexpr size_t kQuoteMaxBytes = 200;

// s itself when it has at most max_bytes bytes; else its first bytes (at most
// max_bytes, never cutting a UTF-8 sequence) followed by "... (N bytes in all)".
std::string quote_input(std::string_view s, size_t max_bytes = kQuoteMaxBytes);

}  // namespace rt
