// Block memory sizing (see block_memory.h): the buffer lists of BlockActs and
// BlockScratch walked over an ops type that allocates nothing.
#include "model/block_memory.h"

#include <algorithm>

#include "core/error.h"

namespace rt {

namespace {

// An ops type that only names element types: BlockActs<SizeOps<E>> and
// BlockScratch<SizeOps<E>> are instantiated for their static buffer lists,
// never constructed.
template <class E>
struct SizeOps {
  using act_t = E;
  using weight_t = E;
  template <class T>
  struct Buffer {
    T* data() const { return nullptr; }
  };
};

uint64_t rounded(int64_t n, uint64_t elem, uint64_t align) {
  const uint64_t b = static_cast<uint64_t>(n) * elem;
  return (b + align - 1) / align * align;
}

template <class E>
uint64_t acts_bytes(const ModelSpec& s, const BlockDims& dm, uint64_t align) {
  uint64_t b = 0;
  BlockActs<SizeOps<E>>::each_buffer(
      s, dm, [&](auto, int64_t n) { b += rounded(n, sizeof(E), align); },
      [&](auto, int64_t n) { b += rounded(n, sizeof(float), align); });
  return b;
}

template <class E>
uint64_t attn_acts_bytes(const ModelSpec& s, const BlockDims& dm, uint64_t align) {
  using Store = AttnActs<SizeOps<E>>;
  uint64_t b = 0;
  BlockActs<SizeOps<E>>::each_buffer(
      s, dm, [&](auto m, int64_t n) { b += Store::act_index(m, s) >= 0 ? rounded(n, sizeof(E), align) : 0; },
      [&](auto m, int64_t n) { b += Store::stat_index(m, s) >= 0 ? rounded(n, sizeof(float), align) : 0; });
  return b;
}

template <class E>
uint64_t scratch_bytes(const ModelSpec& s, const BlockDims& dm, uint64_t align) {
  uint64_t b = 0;
  BlockScratch<SizeOps<E>>::each_buffer(s, dm, [&](auto, int64_t n) { b += rounded(n, sizeof(E), align); });
  return b;
}

void check_args(const BlockDims& dm, int act_elem_bytes, uint64_t align) {
  check_block_dims(dm);
  RT_CHECK(act_elem_bytes == 2 || act_elem_bytes == 4,
           "[model] block sizes are known for 2-byte (bf16) and 4-byte "
           "(fp32) activations, got ",
           act_elem_bytes, " bytes");
  RT_CHECK(align > 0, "[model] block size alignment must be >= 1 byte");
}

}  // namespace

uint64_t block_acts_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align) {
  check_args(dm, act_elem_bytes, align);
  return act_elem_bytes == 2 ? acts_bytes<uint16_t>(s, dm, align) : acts_bytes<float>(s, dm, align);
}

uint64_t block_attn_acts_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align) {
  check_args(dm, act_elem_bytes, align);
  return act_elem_bytes == 2 ? attn_acts_bytes<uint16_t>(s, dm, align) : attn_acts_bytes<float>(s, dm, align);
}

double layer_recompute_flops(const ModelSpec& s, const BlockDims& dm, KeptPart kept) {
  const double C = static_cast<double>(s.hidden), QD = static_cast<double>(s.q_dim()),
               KD = static_cast<double>(s.kv_dim()), T = s.attention_span(dm.T);  // windows: fewer keys
  const double mlp = s.is_moe() ? 2.0 * C * static_cast<double>(s.moe.n_experts)
                                : 4.0 * C * static_cast<double>(s.intermediate);
  switch (kept) {
    case KeptPart::all:
      return !s.is_moe() && dm.mlp_chunked() ? mlp : 0.0;
    case KeptPart::attention:
      return mlp;
    case KeptPart::none:
      break;
  }
  return 2.0 * C * (QD + 2.0 * KD) + 2.0 * QD * C + 2.0 * QD * T + mlp;
}

KeptLayers plan_kept_layers(const ModelSpec& s, const BlockDims& dm, uint64_t available, int act_elem_bytes,
                            uint64_t align, int64_t keep, int64_t keep_attn) {
  RT_CHECK(keep >= -1, "[model] kept layers must be auto (-1) or a count >= 0, got ", keep);
  RT_CHECK(keep_attn >= -1, "[model] attention-kept layers must be auto (-1) or a count >= 0, got ", keep_attn);
  const int64_t L = s.n_layers;
  const uint64_t f = std::max<uint64_t>(block_acts_bytes(s, dm, act_elem_bytes, align), 1);
  const uint64_t a = std::max<uint64_t>(block_attn_acts_bytes(s, dm, act_elem_bytes, align), 1);
  KeptLayers k;
  k.all = keep >= 0 ? std::min(keep, L) : 0;
  k.attention = keep_attn >= 0 ? std::min(keep_attn, L - k.all) : 0;
  uint64_t used = static_cast<uint64_t>(k.all) * f + static_cast<uint64_t>(k.attention) * a;
  uint64_t left = available - std::min(available, used);
  const double saved_all = layer_recompute_flops(s, dm, KeptPart::none) - layer_recompute_flops(s, dm, KeptPart::all);
  const double saved_attn =
      layer_recompute_flops(s, dm, KeptPart::none) - layer_recompute_flops(s, dm, KeptPart::attention);
  // attention halves first when they save at least as much per byte as the
  // upgrade of an attention half to the whole layer (f - a bytes for
  // saved_all - saved_attn FLOPs)
  const bool attn_first = f <= a || saved_attn / static_cast<double>(a) >=
                                        (saved_all - saved_attn) / static_cast<double>(f - a);
  auto fill_attention = [&] {
    if (keep_attn >= 0) return;
    const int64_t n = std::min<int64_t>(L - k.all - k.attention, static_cast<int64_t>(left / a));
    k.attention += n;
    left -= static_cast<uint64_t>(n) * a;
  };
  if (keep < 0 && (!attn_first || keep_attn >= 0)) {  // whole layers first (or only)
    const int64_t n = std::min<int64_t>(L - k.all - k.attention, static_cast<int64_t>(left / f));
    k.all += n;
    left -= static_cast<uint64_t>(n) * f;
    fill_attention();
  } else {
    fill_attention();
    // upgrades: an attention half becomes a whole layer for f - a more bytes
    if (keep < 0 && keep_attn < 0 && f > a && saved_all > saved_attn) {
      const int64_t n = std::min<int64_t>(k.attention, static_cast<int64_t>(left / (f - a)));
      k.attention -= n;
      k.all += n;
      left -= static_cast<uint64_t>(n) * (f - a);
      // whole layers beyond the attention-kept ones (memory left after every layer kept its half)
      const int64_t more = std::min<int64_t>(L - k.all - k.attention, static_cast<int64_t>(left / f));
      k.all += more;
    }
  }
  return k;
}

uint64_t block_scratch_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align) {
  check_args(dm, act_elem_bytes, align);
  return act_elem_bytes == 2 ? scratch_bytes<uint16_t>(s, dm, align) : scratch_bytes<float>(s, dm, align);
}

std::vector<int64_t> mlp_chunk_candidates(int64_t N) {
  std::vector<int64_t> c;
  int64_t p = kMinMlpChunkTokens;
  while (p * 2 < N) p *= 2;
  for (; p >= kMinMlpChunkTokens && p < N; p /= 2) c.push_back(p);
  return c;
}

int64_t pick_mlp_chunk_tokens(const ModelSpec& s, int64_t B, int64_t T, int act_elem_bytes, uint64_t available,
                              int64_t act_sets, uint64_t align) {
  RT_CHECK(act_sets >= 1, "[model] pick_mlp_chunk_tokens needs at least one activation set, got ", act_sets);
  auto need = [&](int64_t chunk) {
    const BlockDims dm{B, T, chunk};
    return static_cast<uint64_t>(act_sets) * block_acts_bytes(s, dm, act_elem_bytes, align) +
           block_scratch_bytes(s, dm, act_elem_bytes, align);
  };
  if (need(0) <= available) return 0;
  for (int64_t c : mlp_chunk_candidates(B * T))
    if (need(c) <= available) return c;
  return -1;
}

}  // namespace rt
