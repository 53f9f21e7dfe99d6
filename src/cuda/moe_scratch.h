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
// is at most kMoeGroupedMaxWork (2048 rows of OLMoE-1B-7B's 2048 x 1024: its
// 8k-token calls run grouped, its 32k-token calls looped, as measured best).
constexpr int64_t kMoeGroupedMaxWork = int64_t{2048} * 2048 * 1024;
inline bool moe_small_experts(int64_t N, int64_t K, int64_t E, int64_t C, int64_t F) {
  return static_cast<double>(N) * static_cast<double>(K) / static_cast<double>(E) * static_cast<double>(C) *
             static_cast<double>(F) <=
         static_cast<double>(kMoeGroupedMaxWork);
}

// Grouped expert GEMM calls of one moe_forward or moe_backward at most, each
// with up to 2 problems per expert and 3 device pointers per problem (the
// backward: the forward's gate+up and down again, d_a, the input gradients,
// and the weight gradients of down and of gate+up).
constexpr int64_t kMoeGroupedCalls = 6;

// Scratch of moe_forward and moe_backward: the N*K permuted rows and every
// expert's activations for them, about N*K*(8*C + 12*F) + N*(4*C + 2*E)
// bytes; each piece rounded up to 256 bytes.
inline size_t moe_scratch_bytes(const MoeDims& d) {
  const auto piece = [](int64_t n, size_t elem) { return (static_cast<size_t>(n) * elem + 255) / 256 * 256; };
  const int64_t NK = d.N * d.K;
  return 3 * piece(NK, 4) + piece(d.E + 1, 4)                    // idx, perm, row_of, offsets
         + 2 * piece(NK, 4)                                      // ord_row, ord_w
         + 2 * piece(NK, 4)                                      // w, dw
         + piece(NK * d.C, 2) + 3 * piece(NK * d.F, 2)           // xe, g, u, a
         + piece(NK * d.C, 2) + 3 * piece(NK * d.F, 2)           // d_o, d_a, d_g, d_u
         + piece(d.N * d.E, 2) + piece(NK * d.C, 4) + piece(d.N * d.C, 4)  // dl, o (dxe), dxr
         + piece(kMoeGroupedCalls * 6 * d.E, 8);  // the grouped GEMMs' pointer arrays
}

}  // namespace rt::cuda
