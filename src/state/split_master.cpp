// Bulk encode/decode of split masters (split_master.h). The per-word loops are
// plain integer code the compiler vectorises (bit ops only: no FP, so FTZ/DAZ or
// NaN quieting cannot touch the bits); the partial words at the ends of a range
// go through the scalar reference functions.
#include "state/split_master.h"

#include "core/error.h"
#include "core/thread_pool.h"

namespace rt {
namespace {

// Bits <-> bytes for one tie word, 8 at a time with multiplies (the shifts by a
// lane-dependent count that a plain loop needs do not vectorise on baseline x86-64).
inline uint64_t bytes_to_bits(const uint8_t* t) {  // t[j] in {0, 1}
  uint64_t bits = 0;
  for (int k = 0; k < 8; ++k) {
    uint64_t b;
    std::memcpy(&b, t + 8 * k, 8);
    bits |= ((b * 0x0102040810204080ull) >> 56) << (8 * k);  // bit 0 of byte j -> bit j of the top byte
  }
  return bits;
}
inline void bits_to_bytes(uint64_t bits, uint8_t* t) {  // t[j] = bit j
  for (int k = 0; k < 8; ++k) {
    const uint64_t spread = ((bits >> (8 * k)) & 0xffu) * 0x0101010101010101ull & 0x8040201008040201ull;
    const uint64_t b = ((spread + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> 7;  // byte j: bit j set?
    std::memcpy(t + 8 * k, &b, 8);
  }
}

// 64 elements filling one tie word.
void encode_word(const float* x, uint16_t* shadow, uint16_t* rem, uint64_t* w) {
  uint32_t u[64];
  std::memcpy(u, x, sizeof(u));
  uint8_t tie[64];
  for (int j = 0; j < 64; ++j) {
    const uint32_t hi = u[j] >> 16;
    const bool nan = (u[j] & 0x7fffffffu) > 0x7f800000u;
    const uint32_t s = nan ? (hi | 0x40u) : (u[j] + 0x7fffu + (hi & 1u)) >> 16;  // f32_to_bf16
    shadow[j] = static_cast<uint16_t>(s);
    rem[j] = static_cast<uint16_t>(u[j]);
    tie[j] = s != hi;
  }
  *w = bytes_to_bits(tie);
}

void decode_word(const uint16_t* shadow, const uint16_t* rem, uint64_t bits, float* x) {
  uint8_t tie[64];
  bits_to_bytes(bits, tie);
  uint32_t u[64];
  for (int j = 0; j < 64; ++j) {
    const uint32_t s = shadow[j];
    const uint32_t nan_down = (s & 0x7fffu) > 0x7f80u ? 0x40u : 1u;
    const uint32_t down = tie[j] ? nan_down : 0u;
    u[j] = ((s - down) << 16) | rem[j];
  }
  std::memcpy(x, u, sizeof(u));
}

void check_span(const char* what, const SplitMaster& p, int64_t n, const void* x) {
  RT_CHECK(n >= 0, "[", what, "] n = ", n, " is negative");
  RT_CHECK(p.tie_first >= 0, "[", what, "] tie_first = ", p.tie_first, " is negative");
  RT_CHECK(n == 0 || (p.shadow && p.rem && p.tie && x), "[", what, "] null buffer for n = ", n);
}

}  // namespace

void split_master_parallel(const SplitMaster& p, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // Cut points: the elements whose bit index is a multiple of kSplitBlock.
  const int64_t first_cut = (kSplitBlock - p.tie_first % kSplitBlock) % kSplitBlock;
  const int64_t head = first_cut < n ? first_cut : n;  // [0, head) is the partial first block
  const int64_t n_tasks = (head > 0 ? 1 : 0) + (n - head + kSplitBlock - 1) / kSplitBlock;
  global_pool().run(n_tasks, [&](int64_t t) {
    if (head > 0 && t == 0) return fn(0, head);
    const int64_t k = head > 0 ? t - 1 : t;
    const int64_t b = head + k * kSplitBlock;
    fn(b, b + kSplitBlock < n ? b + kSplitBlock : n);
  });
}

void split_master_encode(const float* x, int64_t n, const SplitMaster& p) {
  check_span("split_master_encode", p, n, x);
  split_master_parallel(p, n, [&](int64_t b, int64_t e) {
    const SplitMaster q = p.at(b);
    const float* xb = x + b;
    split_master_walk(
        q, e - b, [&](int64_t i, uint64_t* w) { encode_word(xb + i, q.shadow + i, q.rem + i, w); },
        [&](int64_t i0, int64_t i1, uint64_t* w) {
          split_master_partial(q, i0, i1, w, [&](int64_t k, bool) {
            bool t;
            q.shadow[k] = split_master_encode_one(xb[k], q.rem + k, &t);
            return t;
          });
        });
  });
}

void split_master_decode(const SplitMaster& p, int64_t n, float* x) {
  check_span("split_master_decode", p, n, x);
  split_master_parallel(p, n, [&](int64_t b, int64_t e) {
    const SplitMaster q = p.at(b);
    float* xb = x + b;
    split_master_walk(
        q, e - b, [&](int64_t i, uint64_t* w) { decode_word(q.shadow + i, q.rem + i, *w, xb + i); },
        [&](int64_t i0, int64_t i1, uint64_t* w) {
          split_master_partial(q, i0, i1, w, [&](int64_t k, bool t) {
            xb[k] = split_master_decode_one(q.shadow[k], q.rem[k], t);
            return t;
          });
        });
  });
}

}  // namespace rt
