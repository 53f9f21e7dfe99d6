// Block-wise quantized Adam moments (--optimizer adamw8bit | adamw4bit), after
// Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2021):
// a unit's moments are cut into blocks of kQuantBlock elements (aligned to the
// unit's element 0); each block stores one fp32 scale, absmax = max |x| over
// the block, and per element the index of a level of a fixed code of
// magnitudes in [0, 1], so x ~ sign * level[q] * absmax.
//
// Codes (levels sorted ascending, the top one exactly 1, so the block's
// largest element is stored exactly):
//   m8: 1 sign bit + 7-bit minifloat magnitude "e4m3" (0 and 127 levels)
//   v8: 8-bit minifloat magnitude "e5m3" (256 levels, no 0: see below)
//   m4: 1 sign bit + 3-bit dynamic magnitude (8 levels, 0 included)
//   v4: 4-bit magnitude, powers of two 2^-15 .. 2^0 (16 levels, no 0)
// Minifloat (the 8-bit codes): the levels are a window of consecutive fp32
// values truncated to 3 mantissa bits, ending at 1.0: level j of the window
// has the fp32 bits (base + j) << 20, so the index of y = |x| / absmax in
// [0, 1] is computed from y's bits (no table) and decoding is a shift and an
// add. m8: 0, then 127 window levels (base 890: 1.25 x 2^-16 = 1.9e-5 .. 1,
// 16 binades); v8: 256 window levels (base 761: 1.125 x 2^-32 = 2.6e-10 .. 1,
// 32 binades: m's range squared, as v ~ g^2). Relative spacing 1/8 .. 1/16
// per binade, uniform in log; relative error of nearest rounding over
// log-uniform inputs from the smallest level to 1: max 1/17 = 5.88%, mean
// 2.24% (m8) / 2.25% (v8); sqrt(v), which the update uses, half of that
// (tests/state/moment_quant_test.cpp `MinifloatRelativeErrorMatchesTheSpacing`
// prints them). The dynamic tree codes they replace (below) were finer near
// the absmax and coarser below: over [1e-2, 1] max 11.0% / mean 1.98% (m8),
// 6.2% / 1.0% (v8); over their whole range max 71% / 82%, mean 12% / 15%.
// Why e5m3 for v rather than e4m4 (half the error, 16 binades): v ~ g^2
// needs twice m's range, else the v of elements whose gradient is below 2^-8
// of the block's largest rounds up (measured on the noisy quadratic of
// tests/optim/adamw_lean_test.cpp, 300 steps, end loss vs fp32 AdamW,
// stochastic rounding: e5m3 +1.4%, e4m4 +7.3%, the dynamic code +3.8%).
// The dynamic tree code that held the 8-bit moments in checkpoints before
// moment_code is kept for decoding those only (quant_code_m8_dynamic,
// quant_recode_dynamic8).
// "Dynamic" (m4, and the earlier 8-bit codes) is the paper's dynamic tree code,
// rebuilt here from its description: for exponent E = 0, 1, ..., the levels
// of decade E are 10^-E x the midpoints of 2^(F(E)) equal steps over [0.1, 1],
// F(E) shrinking by one bit per decade, the whole code then divided by its
// top level. Relative spacing at the top of m4: 50%; smallest nonzero level
// ~6e-3 (m4), 2^-15 (v4).
// The second moment has no 0 level: a v rounded to 0 under a nonzero m would
// turn the step into m / eps. Values below the smallest level round up to it
// (a smaller step, never a larger one); a block whose v are all 0 has absmax 0
// and decodes to exact zeros. m8 below its smallest level l: nearest gives l
// from l / 2 up, else 0; stochastic gives l with probability y / l (unbiased
// to the draw's 2^-24).
//
// Rounding (QuantRounding): nearest, or stochastic: between the levels
// a <= x < b, b with probability (x - a) / (b - a) (unbiased), drawn from a
// counter-based hash of (seed, element), so results do not depend on the
// thread count. Minifloat codes: nearest adds half a level step (2^19) to y's
// bits and truncates (ties, y exactly halfway: up); stochastic adds the
// draw's top 20 bits and truncates, which is exact: within a step the fp32
// values are evenly spaced, so the carry happens with probability
// (y - a) / (b - a) exactly. 4-bit codes (ties down) are table driven: the
// bf16 prefix (top 16 bits) of x in [0, 1] indexes a table of the levels
// below it; one compare of x's low 16 bits finishes (tables are checked at
// build time to hold at most one level or midpoint per prefix). Encode and
// decode run 16 at a time with AVX-512F or 8 at a time with AVX2 when the CPU has it
// (8-bit codes: the same integer maths per lane; 4-bit codes: the index as
// the count of mids or levels below x by register compares or a binary
// search over one register, which is what the tables give; the hash's lanes
// computed together), else scalar; all paths give the same bits
// (tests/state/moment_quant_test.cpp checks it).
// Non-finite moments cannot be stored: a block holding one gets a non-finite
// absmax and decodes to NaN (the step is poisoned visibly, never silently).
//
// Storage per unit of n elements, nb = ceil(n / kQuantBlock) blocks:
//   8-bit: m codes n bytes, v codes n bytes; 4-bit: n/2 bytes each (element i
//   in the low nibble of byte i/2 when i is even, high nibble when odd);
//   scales: nb fp32 for m, nb for v. So 2.03 (8-bit) or 1.03 (4-bit) B/param.
#pragma once
#include <cstdint>
#include <vector>

namespace rt {

enum class MomentStorage { fp32, q8, q4 };
const char* moment_storage_name(MomentStorage s);  // "adamw", "adamw8bit", "adamw4bit": the --optimizer value
enum class QuantRounding { nearest, stochastic };
const char* quant_rounding_name(QuantRounding r);

inline constexpr int64_t kQuantBlock = 256;
inline int64_t quant_blocks(int64_t n) { return (n + kQuantBlock - 1) / kQuantBlock; }
// Bytes of the codes of one moment of n elements.
inline int64_t quant_code_bytes(MomentStorage s, int64_t n) { return s == MomentStorage::q8 ? n : (n + 1) / 2; }
// Host bytes per element of both moments (codes + scales, rounding of the last block aside).
double moment_bytes_per_param(MomentStorage s);

// A code: n sorted levels in [0, 1] (the last 1) and its lookup tables.
struct QuantCode {
  int n = 0;
  bool has_zero = false;
  // minifloat codes (shift > 0): window level j has the fp32 bits (base + j) << shift
  // (index j + has_zero); the tables below are then unused (levels and mids are set).
  int shift = 0;
  int32_t base = 0;
  float level[256] = {};
  float mid[256] = {};  // mid[k] = (level[k] + level[k + 1]) / 2, in fp32
  // Per bf16 prefix p (x's top 16 bits), packed as count << 17 | t, so one
  // lookup and one integer compare give the index: count + (low16(x) >= t),
  // t = the low 16 bits of the one mid (level) inside the prefix that the
  // compare decides (+1 for "x > mid"), or 0x10000 (never) when none lies in it.
  // (int32 so the AVX2 path gathers them directly.)
  std::vector<int32_t> nearest_key;  // count: mids < the prefix's smallest value; t: x > that next mid
  std::vector<int32_t> floor_key;    // count: levels <= the prefix's smallest value; t: x >= that next level
};
const QuantCode& quant_code_m8();
const QuantCode& quant_code_v8();
const QuantCode& quant_code_m4();
const QuantCode& quant_code_v4();
// m4n: 1 sign bit + 3-bit magnitude at normal quantiles (NF4's negative half:
// 0, .0911, .1848, .2844, .3949, .5251, .6962, 1): the m code of a Muon unit's
// 4-bit moments (muon4bit; `muon` below). Muon re-rounds its momentum every
// step and Newton-Schulz does not average the error away: against m4 it ends
// tiny-byte's 200-step run at +0.99% instead of +2.44% of muon's validation
// loss (docs/lean_state.md).
const QuantCode& quant_code_m4n();
// The 8-bit dynamic tree codes of checkpoints before moment_code (levels only).
const QuantCode& quant_code_m8_dynamic();
const QuantCode& quant_code_v8_dynamic();

// The code set of a storage as checkpoints record it (unit metadata "moment_code"):
// q8 "m8e4m3-v8e5m3", q4 "m4dynamic-v4pow2"; fp32 "".
// A Muon unit's q4 (muon): "m4normal-v4pow2".
const char* quant_code_id(MomentStorage s, bool muon = false);
inline constexpr const char* kQuantCode8Dynamic = "dynamic";  // q8 files without moment_code
// Re-encodes one moment of n elements held in the 8-bit dynamic code (codes
// from element 0, one absmax per block) into the current 8-bit code, in place:
// decoded with the old levels, encoded with nearest rounding (scales rewritten:
// the same absmax, as the old encode stored each block's largest element
// exactly). Blocks in parallel on the global pool.
void quant_recode_dynamic8(bool signed_code, uint8_t* codes, float* scales, int64_t n);

// Nearest level index of x in [0, 1] (x is clamped to [0, 1]; no-zero codes:
// at least level 0; ties: minifloat codes up, table codes down).
int quant_index_nearest(const QuantCode& c, float x);
// Stochastic rounding with u in [0, 1) (minifloat codes use u's top 24 bits).
int quant_index_stochastic(const QuantCode& c, float x, float u);

// Counter-based uniform in [0, 1) with 24 bits: a pure function of (key, i).
inline uint64_t quant_mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// The per-element draw of stochastic rounding: a 32-bit mixer (Wellons'
// lowbias32) of the key folded to 32 bits plus the counter times the golden
// ratio, top 24 bits; 32-bit lane maths, so 8 lanes are drawn together.
inline uint32_t quant_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
inline uint32_t quant_key32(uint64_t key) { return static_cast<uint32_t>(key ^ (key >> 32)); }
inline constexpr uint32_t kQuantCounterStep = 0x9e3779b9u;
inline float quant_uniform(uint64_t key, uint64_t i) {
  return static_cast<float>(quant_mix32(quant_key32(key) + static_cast<uint32_t>(i) * kQuantCounterStep) >> 8) *
         0x1.0p-24f;
}

// The SIMD paths of encode/decode: AVX-512F (16 lanes) where the CPU has it,
// else AVX2 (8 lanes), else scalar; all give the same bits. quant_set_simd(false)
// forces the scalar one, quant_set_simd(true, false) at most AVX2 (tests,
// benchmarks; optim's set_simd_level forwards here). Returns whether a SIMD
// path is now in use; quant_avx512_active() whether it is the AVX-512 one.
bool quant_simd_active();
bool quant_avx512_active();
bool quant_set_simd(bool on, bool avx512 = true);

// One moment of one block of k <= kQuantBlock elements: x[k] -> codes + scale.
// signed_code: m (sign + magnitude), else v (x >= 0 required: a negative v is
// stored as its magnitude). codes: the moment's code array, the block's element
// 0 at element index `first` (so 4-bit blocks share no byte with their
// neighbours: first is a multiple of kQuantBlock). key: the stochastic
// rounding key of this block's moment (the element index i in [0, k) is the counter).
// muon: a Muon unit's moments (signed q4: the m4n code; otherwise the same).
void quant_block_encode(MomentStorage s, bool signed_code, QuantRounding r, uint64_t key, const float* x, int64_t k,
                        uint8_t* codes, int64_t first, float* scale, bool muon = false);
// quant_block_encode with the block's absmax known: amax = max |x| over the
// block with NaN ignored (from 0), finite = whether every |x| is finite, as
// quant_block_encode computes them; then the same codes and scale.
void quant_block_encode_absmax(MomentStorage s, bool signed_code, QuantRounding r, uint64_t key, const float* x,
                               int64_t k, uint8_t* codes, int64_t first, float* scale, float amax, bool finite,
                               bool muon = false);
void quant_block_decode(MomentStorage s, bool signed_code, const uint8_t* codes, int64_t first, float scale, int64_t k,
                        float* x, bool muon = false);
// Every block of one moment of n elements (codes from element 0, one scale per
// block) decoded into x[n], blocks in parallel on the global pool.
void quant_decode(MomentStorage s, bool signed_code, const uint8_t* codes, const float* scales, int64_t n, float* x,
                  bool muon = false);

}  // namespace rt
