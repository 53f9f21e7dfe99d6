// Text generation from the CPU reference: temperature + top-k sampling with a
// seeded generator (the same seed gives the same text). Tokens are decoded one
// at a time with a key/value cache (engine/kv_decode.h): a new token costs one
// token's forward. Past the model's max_sequence() positions the newest three
// quarters of the context are fed again from position 0.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "state/host_state.h"

namespace rt {

struct SampleOptions {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: whole vocab
  uint64_t seed = 0;
  std::vector<int64_t> stop_ids;  // stop after emitting one of these
  int64_t vocab_limit = 0;        // > 0: only ids below it are sampled (padded vocabularies)
  // Checked before each new token: once true, generation stops and returns
  // the ids so far (e.g. &Trainer::stop_flag(), set by SIGINT/SIGTERM).
  const std::atomic<bool>* stop = nullptr;
};

// Returns only the new ids (the prompt is not repeated).
std::vector<int32_t> sample_tokens(const HostState& state, const std::vector<int32_t>& prompt,
                                   const SampleOptions& opt);

}  // namespace rt
