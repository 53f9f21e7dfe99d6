// Memory sizing of one decoder block (model/block.h) for planners (the CUDA
// engine's device plan, `ramtrain plan`): the bytes of a BlockActs and of a
// BlockScratch as functions of the batch shape and the MLP token chunk, and
// the chunk a plan should use. Pure functions: nothing is allocated, no
// backend is included; the counts come from the same buffer lists the
// constructors allocate from (BlockActs/BlockScratch::each_buffer).
//
// Why chunk the MLP and nothing else (Qwen2.5-7B: C 3584, F 18944, 28 x 128
// query heads, 4 KV heads; bf16 activations, B = 1; MiB):
//
//   one block                                  T = 16384   T = 32768
//   an N x C buffer (xn q att h hn, d_*)             112         224
//   an N x F buffer (g u a, d_a d_g d_u)             592        1184
//   BlockActs     unchunked                       2369.9      4739.8
//   BlockScratch  unchunked                       2480.0      4960.0
//   BlockActs     MLP chunks of 1024 tokens        704.9      1298.8
//   BlockScratch  MLP chunks of 1024 tokens        815.0      1519.0
//
// The six N x F tensors are 73% of an unchunked block; the q/k/v/o
// projections work on N x C tensors the attention needs whole anyway
// (chunking them frees no buffer), and attention stores no T x T. The whole
// device plan under 10 and 24 GiB, and what the engine's planner calls in
// which order: docs/long_sequences.md.
#pragma once
#include <cstdint>
#include <vector>

#include "model/block.h"
#include "model/spec.h"

namespace rt {

// Bytes of one BlockActs / BlockScratch whose act_t has act_elem_bytes (2: bf16,
// 4: fp32; statistics are fp32), each buffer rounded up to a multiple of
// align bytes (the allocator's granularity; 1: exact).
uint64_t block_acts_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align = 1);
uint64_t block_scratch_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align = 1);

// Bytes of one AttnActs (the attention half a selectively recomputed layer
// keeps, model/block.h), in the same units as block_acts_bytes.
uint64_t block_attn_acts_bytes(const ModelSpec& s, const BlockDims& dm, int act_elem_bytes, uint64_t align = 1);

// Recompute FLOPs per token of one layer's backward (a forward's GEMMs and
// attention; norms, RoPE and SwiGLU are not counted), by what the layer kept:
//   none:      the block forward without the down projection (y == nullptr)
//              = 2 C (QD + 2 KD) + 2 QD C + 2 QD T (causal attention) + mlp
//   attention: mlp only
//   all:       mlp when the MLP runs in token chunks (the backward recomputes
//              each chunk's gate/up), else 0
// where mlp = 4 C F for a dense layer (gate and up), the router 2 C E for an
// MoE layer (the experts recompute inside moe_backward either way: counted
// by neither). T: the sequence length.
enum class KeptPart { none, attention, all };
double layer_recompute_flops(const ModelSpec& s, const BlockDims& dm, KeptPart kept);

// How many layers keep all their activations (`all`, the last ones) and how
// many before those keep their attention half (`attention`) in `available`
// bytes. keep / keep_attn: a count, or -1 (auto). Auto fills the memory by
// recompute FLOPs saved per byte: attention halves first where they save
// more per byte than a whole layer's activations (always, once the MLP runs
// in chunks or the layer is an MoE layer), then whole layers replace
// attention halves while memory is left; explicit counts are taken as given
// (clamped to the layers) and auto fills what they leave.
struct KeptLayers {
  int64_t all = 0, attention = 0;
};
KeptLayers plan_kept_layers(const ModelSpec& s, const BlockDims& dm, uint64_t available, int act_elem_bytes,
                            uint64_t align, int64_t keep, int64_t keep_attn);

// The MLP token chunks a planner tries, largest first: the powers of two
// below N, down to kMinMlpChunkTokens (GEMMs of fewer rows lose efficiency
// and the N x C buffers dominate by then). Empty when N <= kMinMlpChunkTokens.
inline constexpr int64_t kMinMlpChunkTokens = 256;
std::vector<int64_t> mlp_chunk_candidates(int64_t N);

// The MLP token chunk for blocks of B x T tokens when `available` bytes are
// left for what grows with the chunk choice: one BlockActs per set in
// act_sets (the shared set plus each kept layer) and one BlockScratch.
// 0 when the unchunked block fits (the default path, bit-identical to no
// chunking); else the largest of mlp_chunk_candidates(B*T) that fits; -1 when
// none does.
int64_t pick_mlp_chunk_tokens(const ModelSpec& s, int64_t B, int64_t T, int act_elem_bytes, uint64_t available,
                              int64_t act_sets = 1, uint64_t align = 1);

}  // namespace rt
