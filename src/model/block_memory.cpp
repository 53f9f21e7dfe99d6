// Block memory sizing (see block_memory.h): the buffer lists of BlockActs and
// BlockScratch walked over an ops type that allocates nothing.
#include "model/block_memory.h"

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
