// Folded updates (--grads fold): each unit's AdamW update runs as soon as its
// whole step gradient exists, so no unit's gradient waits in host RAM for
// the global norm (the 4 B/param host gradient buffer is gone: the state is
// ~12 B/param with the split master).
//
// Clipping rule (the global norm is not known when the first units update):
// units fold in fold_order -- the head, then the layers from the last down,
// then the embedding, the order their gradients are complete (the head's is
// once the step's last head is queued, before the layers' backward) -- and
// unit u is clipped with the norm of the gradients folded up to and
// including u: coef_u = clip_coefficient(sqrt(sum_{v folded <= u} |g_v|^2)).
// So:
//  - a step whose global norm is within --max-grad-norm (or no clipping) is
//    bit-identical to global clipping: every partial norm is <= the global
//    one, every coef is 1;
//  - on a clipped step no unit is clipped more than global clipping would
//    clip it (partial norm <= global norm), the last unit (the embedding)
//    exactly as much, and a spike in a late layer is clipped at once for
//    every unit after it;
//  - it needs no state across steps (resume stays exact).
// A unit whose gradient is not finite is not updated (its norm is left out of
// the partial sums); units folded before it keep their update.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rt {

// The units of a model with n_layers layers in the order they fold.
std::vector<size_t> fold_order(int64_t n_layers);

// Deferred folds (cuda/optimizer_phase.h enable_fold_defer): of units whose
// sizes are numel (in fold order), the first ones whose gradients fit in
// fraction of all the elements and in max_bytes (fp32): their offsets in the
// aside buffer (each rounded up to 16 floats) and the buffer's length. The
// last unit (the embedding) is never deferred. fraction in [0, 1).
struct FoldDefer {
  std::vector<int64_t> at;
  int64_t elems = 0;
};
FoldDefer fold_defer_plan(const std::vector<int64_t>& numel, double fraction, uint64_t max_bytes);
// The share of the parameters deferred: RAMTRAIN_FOLD_DEFER (a number in
// [0, 1), e.g. 0.33; 0 defers nothing), unset: kFoldDeferShare, 0 (off):
// on the H100 it gained 4% where the CPU update binds (OLMoE 16 x 2048
// fold) and nothing at 64k tokens, for 4 B of host RAM per deferred
// parameter (docs/architecture.md).
inline constexpr double kFoldDeferShare = 0;
double fold_defer_share();

class FoldClip {
 public:
  explicit FoldClip(double max_norm) : max_norm_(max_norm) {}
  // The clip coefficient of the next unit in fold_order, whose gradient has
  // sum of squares sumsq (double, optim/adamw.h's sum_squares). Returns 0 for
  // a non-finite sumsq: the caller must skip that unit's update.
  float next(double sumsq);
  // Sum of squares of every finite gradient folded so far, and whether all were finite.
  double sumsq() const { return sq_; }
  bool all_finite() const { return finite_; }

 private:
  double max_norm_, sq_ = 0;
  bool finite_ = true;
};

}  // namespace rt
