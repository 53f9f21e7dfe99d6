// tokenizer_bench: single-thread encode/decode throughput of a model dir's tokenizer.
// Usage: tokenizer_bench MODEL_DIR TEXT_FILE [REPS]
// Encodes TEXT_FILE as one call (whole text) and line by line (one call per
// line, as a data loader feeding documents would), REPS times each; prints the
// first (cold cache) and best MB/s, the token count and an FNV-1a checksum of
// the ids so the result can be compared with bench/tokenizer_bench.py (HF).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/tokenizer.h"

namespace {

uint64_t fnv1a(const std::vector<int32_t>& ids, uint64_t h = 1469598103934665603ull) {
  for (int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ull;
  }
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [REPS]\n", argv[0]);
    return 2;
  }
  try {
    const int reps = argc > 3 ? std::stoi(argv[3]) : 5;
    const auto tok = rt::tokenizer_load(argv[1]);
    const std::string text = rt::read_text_file(argv[2]);
    std::vector<std::string> lines;
    for (size_t b = 0; b < text.size();) {
      size_t e = text.find('\n', b);
      e = e == std::string::npos ? text.size() : e + 1;  // keep the newline with its line
      lines.push_back(text.substr(b, e - b));
      b = e;
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("tokenizer: %s\ntext: %s, %.3f MB, %zu lines\n", tok->describe().c_str(), argv[2], mb, lines.size());

    std::vector<int32_t> ids;
    double first = 0, best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ids = tok->encode(text, false);
      const double s = seconds_since(t0);
      if (r == 0) first = s;
      best = std::min(best, s);
    }
    std::printf("encode whole text : %zu tokens, checksum %016llx, first %.2f MB/s, best %.2f MB/s\n", ids.size(),
                static_cast<unsigned long long>(fnv1a(ids)), mb / first, mb / best);

    first = 0, best = 1e30;
    uint64_t h = 0;
    size_t n = 0;
    for (int r = 0; r < reps; ++r) {
      h = 1469598103934665603ull;
      n = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (const auto& l : lines) {
        const auto v = tok->encode(l, false);
        h = fnv1a(v, h);
        n += v.size();
      }
      const double s = seconds_since(t0);
      if (r == 0) first = s;
      best = std::min(best, s);
    }
    std::printf("encode per line   : %zu tokens, checksum %016llx, first %.2f MB/s, best %.2f MB/s\n", n,
                static_cast<unsigned long long>(h), mb / first, mb / best);

    best = 1e30;
    std::string back;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      back = tok->decode(ids, false);
      best = std::min(best, seconds_since(t0));
    }
    std::printf("decode            : best %.2f MB/s, round trip %s\n", mb / best, back == text ? "exact" : "DIFFERS");
  } catch (const rt::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
