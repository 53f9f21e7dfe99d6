// Split master weights: an fp32 master held exactly as its bf16 shadow (the
// pinned copy the GPU loads), its low 16 bits, and one bit, so master + shadow
// cost 4.125 B/param instead of 6 (with fp32 Adam m, v: 12.125 B/param).
//
// Encoding of one fp32 x with bits u = (hi << 16) | lo:
//   shadow = f32_to_bf16(x)            (core/bf16.h: round to nearest even; NaN -> hi | 0x40)
//   rem    = lo                        (the low 16 bits, verbatim)
//   tie    = (shadow != hi)            (the shadow's upper half is not the master's)
// Decoding: hi = shadow - (tie ? (shadow is NaN ? 0x40 : 1) : 0); x = (hi << 16) | rem.
// Proof that decode(encode(x)) == x bit for bit, for all 2^32 patterns:
//  - x not NaN (incl. +-0, denormals, +-inf): f32_to_bf16 adds 0x7fff + (hi & 1) < 2^16
//    to u, so shadow is hi or hi + 1 (no 16-bit wrap: hi <= 0xff80 for non-NaN), and
//    tie == 1 exactly when it rounded up; so hi = shadow - tie. The shadow of a
//    non-NaN is never NaN (only u = +-inf has hi = 0x7f80/0xff80, and lo = 0 does
//    not round up), so decoding takes this branch.
//  - x NaN: shadow = hi | 0x40 (the quiet bit), which is a NaN; tie == 1 exactly
//    when hi's bit 6 was clear (a signalling NaN), and then hi = shadow - 0x40.
//    Sign and payload survive in hi and rem; nothing is canonicalised away.
// Why 16 bits of remainder cannot suffice (so the extra bit is not waste): for an
// even non-NaN shadow s, the masters rounding to s are hi = s with lo in
// [0, 0x8000] (32769 values) and hi = s - 1 with lo in [0x8000, 0xffff] (32768):
// 65537 > 2^16. The clash is the exact tie: (s - 1, 0x8000) rounds up to the even
// s, (s, 0x8000) rounds down to it, and both have rem 0x8000; tie tells them apart.
// A nudge instead of the bit would change the master (not bit-identical to the
// fp32 path). tests/state/split_master_exhaustive_test.cpp checks all 2^32 patterns.
//
// Layout: element i of a SplitMaster span is (shadow[i], rem[i], bit tie_first + i
// of the tie bitmap), bit k being bit k % 64 of word tie[k / 64]. The bitmap is
// addressed by an absolute bit index so a span can start anywhere in a unit.
// Concurrency contract (all functions here and adamw_update_split): calls on
// disjoint element ranges may run concurrently, even when the ranges cut the same
// 64-bit tie word: a word a call covers only in part is read and written with
// atomic operations (std::atomic_ref, relaxed; the thread pool's join orders them
// for later readers), whole words with plain loads and stores. Calls must not
// overlap in elements; a read (decode) may not run beside a write of the same
// elements. Inside one call, tasks are cut at multiples of kSplitBlock in tie-bit
// coordinates, so they never share a word. (The global pool itself is not
// reentrant: concurrent callers on several threads must each stay inside one
// kSplitBlock, which runs inline, or serialise their pool use, as for adamw_update.
// The engine's optimizer thread runs its chunks one after another, which needs
// nothing: chunk ends may fall anywhere.)
//
// How HostState holds it (state/host_state.h; the CUDA engine wires it):
//  - per unit: the bf16 shadow in pinned memory (as today: the H2D source; in
//    delayed-update mode there are two, and adamw_update_split reads the master's
//    upper half from the shadow of step t-1 and writes the one of step t);
//    rem (2 B/param, 64-byte aligned) and the tie bitmap ((numel + 63) / 64
//    words) in ordinary host memory next to m and v; no fp32 master arena. The
//    unit's bitmap is indexed by the element's offset in the unit: the span of
//    entry [lo, hi) is SplitMaster{shadow, rem, tie, 0}.at(lo). With tensors at
//    16-element offsets the vector stores of every whole tie word are aligned.
//  - update_unit_range(u, b, e, grad, o, clip_coef, shadow, shadow_prev): per entry
//    range [lo, hi) as today, calling
//      adamw_update_split(SplitMaster{shadow, u.rem(), u.tie(), 0}.at(lo), u.m() + lo,
//                         u.v() + lo, grad + (lo - b), hi - lo, o.hyper, o.t, o.lr,
//                         weight_decay_for(entry, o), clip_coef,
//                         shadow_prev ? shadow_prev + lo : nullptr)
//    (shadow_prev: the step t-1 shadow in delayed mode, else nullptr: in place). The
//    shadow is no longer optional: it is half of the master. Chunks need no
//    alignment (contract above). A skipped step in delayed mode copies the shadow
//    as today; rem and tie stay.
//  - memory per parameter: 2 (pinned shadow) + 2 (rem) + 0.125 (tie) + 8 (m, v) =
//    12.125 B (+2 B for the second shadow in delayed mode), against 14 today.
//  - traffic per parameter of one update: 28.25 B (shadow 2 + 2, rem 2 + 2, tie
//    0.25, m, v 16, g 4) against adamw_update's 30 (bench/optim_bench.cpp).
//  - init / load (HF weights or a checkpoint's fp32 "master/<name>"): fill fp32
//    per tensor (a bounded scratch buffer), then split_master_encode; save: decode
//    per tensor into a scratch buffer and write fp32 as today, so checkpoints stay
//    fp32 and compatible both ways. In delayed mode save decodes with the shadow of
//    the last applied step. Every other reader of the fp32 master (master_tensors
//    for checkpoints and HF export, master(name), weights()) decodes likewise.
//    The CPU backend (fp32 reference, which computes on the master directly)
//    keeps the fp32 arena.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>

#include "core/bf16.h"

namespace rt {

// Elements [0, n) of a split master (see above). Pointers address element 0.
struct SplitMaster {
  uint16_t* shadow = nullptr;  // bf16 bits: f32_to_bf16(master)
  uint16_t* rem = nullptr;     // the master's low 16 bits
  uint64_t* tie = nullptr;     // the bitmap, indexed by tie_first + i
  int64_t tie_first = 0;       // bit index of element 0 (>= 0)
  // The span starting at element k of this one.
  SplitMaster at(int64_t k) const { return {shadow + k, rem + k, tie, tie_first + k}; }
};

// Words a tie bitmap of n elements needs.
inline int64_t split_master_tie_words(int64_t n) { return (n + 63) / 64; }

// Scalar reference: the encoding of one value (returns the shadow).
inline uint16_t split_master_encode_one(float x, uint16_t* rem, bool* tie) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t s = f32_to_bf16(x);
  *rem = static_cast<uint16_t>(u);
  *tie = s != static_cast<uint16_t>(u >> 16);
  return s;
}

// Whether a bf16 bit pattern is a NaN.
inline bool bf16_is_nan(uint16_t s) { return (s & 0x7fffu) > 0x7f80u; }

// Scalar reference: the value a (shadow, rem, tie) triple holds.
inline float split_master_decode_one(uint16_t shadow, uint16_t rem, bool tie) {
  const uint32_t down = tie ? (bf16_is_nan(shadow) ? 0x40u : 1u) : 0u;
  const uint32_t u = ((static_cast<uint32_t>(shadow) - down) << 16) | rem;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// x[0, n) -> elements [0, n) of p (shadow, rem and tie bits written). Runs on the
// global thread pool; bit-identical to split_master_encode_one per element.
void split_master_encode(const float* x, int64_t n, const SplitMaster& p);
// Elements [0, n) of p -> x[0, n) (p.shadow, p.rem, p.tie only read).
void split_master_decode(const SplitMaster& p, int64_t n, float* x);

// Elements per task of the parallel loops over split masters (a multiple of 64).
inline constexpr int64_t kSplitBlock = 16384;

// Runs fn(b, e) on the global pool over [0, n) cut at the elements whose tie bit
// index (p.tie_first + i) is a multiple of kSplitBlock, so that tasks share a tie
// word only at the ends of [0, n). Task boundaries depend only on tie_first and n.
void split_master_parallel(const SplitMaster& p, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

// Building blocks for loops over a span (used by split_master.cpp and adamw.cpp).
// Walks [0, n) of p: word(i, w) for each [i, i + 64) that fills tie word *w;
// partial(i0, i1, w) for the (at most two) ranges that cover word *w only in part.
template <class Word, class Partial>
void split_master_walk(const SplitMaster& p, int64_t n, Word&& word, Partial&& partial) {
  int64_t i = 0;
  const int64_t off = p.tie_first & 63;
  if (off != 0 && n > 0) {
    i = n < 64 - off ? n : 64 - off;
    partial(int64_t{0}, i, p.tie + p.tie_first / 64);
  }
  for (; i + 64 <= n; i += 64) word(i, p.tie + (p.tie_first + i) / 64);
  if (i < n) partial(i, n, p.tie + (p.tie_first + i) / 64);
}

// One partial word: tie_out = fn(k, tie_in) for k in [i0, i1); the word is read
// and updated atomically, only the bits of [i0, i1) change (the contract above).
template <class Fn>
void split_master_partial(const SplitMaster& p, int64_t i0, int64_t i1, uint64_t* w, Fn&& fn) {
  std::atomic_ref<uint64_t> a(*w);
  const uint64_t old = a.load(std::memory_order_relaxed);
  uint64_t now = old;
  for (int64_t k = i0; k < i1; ++k) {
    const int bit = static_cast<int>((p.tie_first + k) & 63);
    const uint64_t t = fn(k, ((old >> bit) & 1u) != 0) ? 1u : 0u;
    now = (now & ~(uint64_t{1} << bit)) | (t << bit);
  }
  if (now != old) a.fetch_xor(now ^ old, std::memory_order_relaxed);
}

}  // namespace rt
