// One error family for ramtrain. User-facing failures are rt::Error exceptions
// whose message starts with a "[where]" prefix and names the file and the fix;
// main() catches them once, prints the message and exits non-zero.
// Shape and dtype checks use RT_CHECK and stay on in release builds.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace rt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenate anything streamable into a string.
template <class... A>
std::string cat(A&&... a) {
  std::ostringstream s;
  (s << ... << std::forward<A>(a));
  return s.str();
}

template <class... A>
[[noreturn]] void fail(A&&... a) {
  throw Error(cat(std::forward<A>(a)...));
}

}  // namespace rt

// RT_CHECK(cond, "[where] ", "message parts", ...): throws rt::Error when false.
#define RT_CHECK(cond, ...)               \
  do {                                    \
    if (!(cond)) ::rt::fail(__VA_ARGS__); \
  } while (0)
