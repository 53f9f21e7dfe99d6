// DataCursor: where a run stands in its training data, {epoch, index of the
// next train row in that epoch's order}. Datasets (data/) resume from it and
// checkpoints (io/checkpoint.h) store it, so it lives here, below both.
#pragma once
#include <cstdint>
#include <string>

namespace rt {

struct DataCursor {
  uint64_t epoch = 0;
  uint64_t index = 0;                             // next window, 0..W-1, in epoch's order
  std::string to_string() const;                  // "epoch=3 index=120"
  static DataCursor parse(const std::string& s);  // inverse of to_string; throws "[data] ..."
  bool operator==(const DataCursor&) const = default;
};

}  // namespace rt
