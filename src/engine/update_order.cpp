#include "engine/update_order.h"

#include <algorithm>

namespace rt {

std::vector<size_t> update_order(size_t U, bool delayed) {
  std::vector<size_t> order(U);
  if (!delayed) {
    for (size_t k = 0; k < U; ++k) order[k] = k;
  } else {
    order[0] = U - 1;
    order[1] = 0;
    for (size_t k = 2; k < U; ++k) order[k] = U - k;
  }
  return order;
}

std::vector<GradChunk> grad_chunks(const std::vector<int64_t>& numel, const std::vector<size_t>& order,
                                   int64_t chunk_elems) {
  std::vector<GradChunk> chunks;
  for (size_t u : order)
    for (int64_t b = 0; b < numel[u]; b += chunk_elems) chunks.push_back({u, b, std::min(numel[u], b + chunk_elems)});
  return chunks;
}

}  // namespace rt
