// Muon over one HostState unit (--optimizer muon | muon8bit | muon4bit): Muon
// (optim/muon.h) for the unit's Muon matrices (muon_matrix), AdamW for its
// other tensors. update_unit_range dispatches here when the unit's `muon` is set.
// Storage (state/host_state.h): a matrix's momentum is its m; it has no v
// (the unit's v is packed: the other tensors' only).
//   fp32 moments (muon): each other tensor runs adamw_update exactly as the
//     AdamW mode does (bit-identical), each matrix muon_update_matrix on its m.
//   8- or 4-bit moments (muon8bit, muon4bit: state/moment_quant.h's codes):
//     tensor by tensor (a matrix whole, the others in pieces of kMuonPiece
//     elements), the piece's m and v decoded to fp32 through windows of whole
//     blocks in the thread's scratch (optim/muon.h muon_scratch_bytes), updated as above,
//     and each block re-encoded once the update has passed it, with
//     o.moment_rounding (stochastic: keyed by (o.rounding_seed, o.t, unit
//     index, block), so independent of threads and of the piece size). The
//     other tensors' Adam moments share the unit's codes: adamw8bit's, or for
//     4-bit the m4n code for m (a Muon unit's, state/moment_quant.h) and v4.
// Muon updates whole matrices: the range is the whole unit, in place. The
// master: fp32, or split (the CUDA engine's default, one shadow): each Muon
// matrix decoded to fp32 (muon_scratch slot 2), updated as on fp32 storage
// and encoded back (which writes the shadow); the other tensors through
// adamw_update_split: bit-identical to fp32 storage. Or bf16 (--master bf16-sr
// | bf16-kahan, one shadow): each tensor decoded to fp32 (a Muon matrix into
// slot 2, the others in pieces), updated as on fp32 storage and stored with
// the master's rounding (optim/adamw_lean.h bf16_master_store: the draws and
// the Kahan step of adamw_lean_update).
// NS5 runs where o.orthogonalizer says (optim/muon.h; nullptr: the CPU spec).
// A pipelined one (lanes() > 0, the GPU's): each matrix's momentum pass
// writes U into a lane and submits it; the matrix's weight update runs when
// a lane is needed again (or at the unit's end), so the host's passes of
// the next and the last matrix (and the other tensors' AdamW) overlap this
// one's NS5; with fp32 moments the unit's smallest matrix goes first and its
// second smallest last (the pipeline's ends wait on them). The same bits as
// the one-at-a-time calls.
#pragma once
#include <cstdint>

#include "optim/unit_update.h"

namespace rt {

// Elements of a non-matrix tensor updated (and, quantized or bf16, decoded) at a time.
inline constexpr int64_t kMuonPiece = int64_t(1) << 20;
// Elements of a Muon matrix's bf16 master (stochastic rounding, Kahan) decoded, updated and
// stored at a time by the pipelined form (muon_scratch slot 2 holds one).
inline constexpr int64_t kMuonApplyChunk = int64_t(1) << 20;

// u.muon must be set; grad[u.numel]; bf16_shadow (nullable) as update_unit's.
// piece: kMuonPiece, or (tests) any other length >= 1: the same bits.
void muon_unit_update(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow,
                      int64_t piece = kMuonPiece);

// The momentum mu a step uses: o.muon.momentum, or AdamW's beta1 when that is < 0.
inline double muon_momentum(const OptimStep& o) {
  return o.muon.momentum >= 0 ? o.muon.momentum : o.hyper.beta1;
}

}  // namespace rt
