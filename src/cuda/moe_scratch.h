// The shape of one MoE MLP call and the bytes of its scratch (cuda/moe.cu):
// plain C++, so that the device plan (engine/device_plan.cpp) counts the MoE
// workspace in CPU-only builds too. moe.cu carves the same pieces in the same
// order and checks that it lands on this sum.
#pragma once
#include <cstddef>
#include <cstdint>

namespace rt::cuda {

struct MoeDims {
  int64_t N, C, E, K, F;  // tokens, hidden, experts, experts per token, expert width
  bool norm_topk;
  // gpt-oss (cpu/moe.h MoeVariant): probs hold the logits, w = softmax of
  // the K selected; glu_limit > 0: the clamped SwiGLU with glu_alpha.
  bool topk_softmax = false;
  float glu_limit = 0.f;
  float glu_alpha = 1.f;
};

// The expert GEMMs' auto mode (cuda/ops.h MoeGemm::by_size): a call runs
// grouped when its average expert GEMM, N K / E rows x C x F multiply-adds,
// is at most kMoeGroupedMaxWork (4096 rows of OLMoE-1B-7B's 2048 x 1024: its
// 8k- and 32k-token calls run grouped, as measured best; bigger experts loop,
// where each 128-row chunk would read its expert's weights again).
constexpr int64_t kMoeGroupedMaxWork = int64_t{4096} * 2048 * 1024;
inline bool moe_small_experts(int64_t N, int64_t K, int64_t E, int64_t C, int64_t F) {
  return static_cast<double>(N) * static_cast<double>(K) / static_cast<double>(E) * static_cast<double>(C) *
             static_cast<double>(F) <=
         static_cast<double>(kMoeGroupedMaxWork);
}

// The grouped mode's chunk: every expert's permuted rows start at a multiple
// of kMoeChunk rows (its last chunk padded), so each kind of expert product
// runs as one batched GEMM over same-shaped chunks (cuda/moe.cu). Padded, the
// N*K rows take at most moe_max_chunks chunks (sum over e of ceil(R_e / T)
// <= floor(NK / T) + E); the call runs all of them, so the host needs no
// count: moe_padded_rows = T moe_max_chunks rows, the chunks past the rows in
// use computed and never read. The kernels that find a row's expert on the
// device take each expert's pointer as a parameter: at most
// kMoeMaxGroupedExperts experts run grouped (more loop).
constexpr int64_t kMoeChunk = 128;
constexpr int64_t kMoeMaxGroupedExperts = 512;
inline int64_t moe_max_chunks(int64_t NK, int64_t E) { return NK / kMoeChunk + E; }
inline int64_t moe_padded_rows(int64_t NK, int64_t E) { return kMoeChunk * moe_max_chunks(NK, E); }

// Pointer-array slots of the batched expert GEMM calls of one moe_forward or
// moe_backward, each with up to 2 problems per chunk and 3 device pointers
// per problem: 0 gate+up (the forward's, and again in the backward), 1 down
// (forward), 2 d_a and 3 the input gradients (backward).
constexpr int64_t kMoeGroupedCalls = 4;

// Scratch of moe_forward and moe_backward: the N*K permuted rows (padded)
// and every expert's activations for them, about P*(8*C + 12*F) + N*(4*C +
// 2*E) bytes for P = moe_padded_rows; each piece rounded up to 256 bytes.
inline size_t moe_scratch_bytes(const MoeDims& d) {
  const auto piece = [](int64_t n, size_t elem) { return (static_cast<size_t>(n) * elem + 255) / 256 * 256; };
  const int64_t NK = d.N * d.K, P = moe_padded_rows(NK, d.E);
  return 2 * piece(NK, 4) + piece(P, 4) + piece(2 * (d.E + 1), 4)         // idx, row_of, perm, offsets + starts
         + 2 * piece(NK, 4)                                               // ord_row, ord_w
         + 2 * piece(NK, 4)                                               // w, dw
         + piece(P * d.C, 2) + 3 * piece(P * d.F, 2)                      // xe, g, u, a
         + piece(P * d.C, 2) + 3 * piece(P * d.F, 2)                      // d_o, d_a, d_g, d_u
         + piece(d.N * d.E, 2) + piece(P * d.C, 4) + piece(d.N * d.C, 4)  // dl, o (dxe), dxr
         + piece(kMoeGroupedCalls * 6 * moe_max_chunks(NK, d.E), 8);      // the batched GEMMs' pointer arrays
}

}  // namespace rt::cuda
