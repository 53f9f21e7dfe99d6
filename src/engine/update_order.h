// The order in which the streaming engine's optimizer phase updates units,
// and the chunks it copies their gradients out in.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rt {

// Forward order (0, 1, ..., U-1), so that the next forward finds each unit
// updated as it comes to it; delayed update: the next step trains on older
// weights and its backward needs the gradient buffers back first, so head
// and embedding (tied LM heads write the embedding's gradient) come before
// the last layer: U-1, 0, U-2, U-3, ..., 1.
std::vector<size_t> update_order(size_t n_units, bool delayed);

struct GradChunk {
  size_t u;      // unit
  int64_t b, e;  // elements [b, e) of the unit
};
// Every unit's elements in chunks of at most chunk_elems, units in `order`.
// With quantized moments (state/moment_quant.h) update_unit_range needs every
// chunk but a unit's last to end on a multiple of kQuantBlock (256; checked
// there): the CUDA engine's chunks are multiples of 4096 or whole units.
std::vector<GradChunk> grad_chunks(const std::vector<int64_t>& numel, const std::vector<size_t>& order,
                                   int64_t chunk_elems);

}  // namespace rt
