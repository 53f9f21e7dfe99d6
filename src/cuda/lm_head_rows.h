// Rows of the LM head the CUDA kernels run on: the vocabulary rounded up to a
// multiple of 8 (the GEMMs' row widths; 32,002 in several Mistral fine-tunes
// becomes 32,008). Plain C++, so that the device plan counts the padded rows
// in CPU-only builds too. The rows past the vocabulary exist on the device
// only (zero weights, logits excluded from the softmax, zero gradients);
// checkpoints, exports and the host state never see them.
#pragma once
#include <cstdint>

namespace rt::cuda {

constexpr int64_t lm_head_rows(int64_t vocab) { return (vocab + 7) / 8 * 8; }

}  // namespace rt::cuda
