// The shape every attention kernel gets (both kernel sets; attention.cu checks
// the call and makes it). Internal to the CUDA backend.
#pragma once

namespace rt::cuda {

struct AttnShape {
  int T, H, G, group;  // group = H / G
  int window;          // sliding window: row t sees keys j > t - window (0: none; the kWindow instances only)
  float scale_log2;    // log2(e) / sqrt(D)
  float scale;         // 1 / sqrt(D)
  // Gemma 2's attention-logit soft cap c (the kernels' CAP instances; attention/softmax.cuh
  // softcap_scores): in raw-score units K = c / scale,
  // cap_a2 = 2 log2(e) / K, cap_m2k = -2 K, cap_inv_k = 1 / K (all 0 without a cap)
  float cap_a2, cap_m2k, cap_k, cap_inv_k;
};

}  // namespace rt::cuda
