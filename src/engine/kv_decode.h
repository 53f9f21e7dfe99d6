// Token-by-token decoding with a key/value cache on the CPU, for sampling:
// each step runs one token through every layer (block_forward's ops with N =
// 1: norms, projections, q/k norms, RoPE at the token's position, the MoE
// router and experts) and attends to the cached keys and values of the
// earlier positions, so a new token costs one token's forward instead of the
// whole context's. The hidden state it returns equals ModelRunner's
// forward_hidden row for that position up to fp32 summation order
// (tests/engine/kv_decode_test.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/cpu_ops.h"
#include "model/model.h"

namespace rt {

class KvDecoder {
 public:
  // capacity: the most positions the cache holds (the model's max_sequence()).
  KvDecoder(CpuOps& ops, const ModelSpec& s, const ModelWeightsT<float>& w, int64_t capacity);
  void reset() { n_ = 0; }
  int64_t size() const { return n_; }  // tokens in the cache (the next token's position)
  int64_t capacity() const { return cap_; }
  // Feeds token id at position size(); returns its final normed hidden state [C].
  const float* step(int32_t id);

 private:
  CpuOps& ops_;
  const ModelSpec& s_;
  const ModelWeightsT<float>& w_;
  int64_t cap_, n_ = 0;
  std::vector<float> k_, v_;  // [L][cap][G*D]
  std::vector<float> x_, xn_, q_, qr_, kr_, kn_, vn_, att_, h_, hn_, g_, u_, a_, y_, probs_, so_, sl_, rstd_, p_;
};

}  // namespace rt
