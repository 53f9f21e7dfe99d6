// The shape every attention kernel gets (both kernel sets; attention.cu checks
// the call and makes it). Internal to the CUDA backend.
#pragma once

namespace rt::cuda {

struct AttnShape {
  int T, H, G, group;  // group = H / G
  int window;          // sliding window: row t sees keys j > t - window (0: none; the kWindow instances only)
  float scale_log2;    // log2(e) / sqrt(D)
  float scale;         // 1 / sqrt(D)
};

}  // namespace rt::cuda
