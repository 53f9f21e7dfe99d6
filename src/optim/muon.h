// Muon (Keller Jordan 2024, "Muon: an optimizer for hidden layers") for the
// 2-D weight matrices of the decoder layers; AdamW (optim/adamw.h) for every
// other tensor (embedding, LM head, norms, biases, routers), exactly as the
// AdamW modes run it. --optimizer muon | muon8bit | muon4bit (docs/lean_state.md).
//
// Per matrix W [R, C] (R = rows = the HF tensor's shape[0]) with gradient g,
// after global-norm clipping (grad_scale = the clip coefficient, as AdamW):
//   G  = g * grad_scale                        (fp32)
//   M  = mu * M + G                            (fp32, mu = momentum)
//   U  = G + mu * M     (nesterov, default)    or U = M
//   X  = U / (||U||_F + 1e-7)                  (norm in double, rounded to fp32)
//        transposed to [min(R,C), max(R,C)] so rows <= cols
//   5 x:  A = X X^T,  B = b A + c A A,  X = a X + B X
//        (a, b, c) = (3.4445, -4.7750, 2.0315), fp32 GEMMs (cpu/ops.h)
//   O  = X transposed back to [R, C]
//   W  = W * (1 - lr*wd)                       (skipped when wd == 0; AdamW's decoupled decay)
//   W  = W - (lr * scale) * O,   scale = 0.2 * sqrt(max(R, C))
// The scale is Moonshot's RMS matching ("Muon is scalable for LLM training",
// 2025): an orthogonalised update has RMS ~ 1/sqrt(max(R, C)), so 0.2 sqrt(max)
// brings it to AdamW's typical update RMS (~0.2) and Muon shares AdamW's lr.
// Constants lr*wd, lr*scale are computed in double and rounded to fp32 once.
// No bias correction (Muon has none). The output's singular values lie in
// ~[0.68, 1.2] (the quintic's oscillation band), not exactly 1.
//
// Where NS5 runs: an Orthogonalizer (below). None (nullptr): muon_orthogonalize
// on the CPU, the specification. The CUDA engine passes its GPU one
// (engine/cuda/muon_gpu.h: bf16 operands, fp32 accumulation) through
// OptimStep::orthogonalizer; everything else of the update stays on the CPU.
#pragma once
#include <cstdint>

#include "model/spec.h"
#include "state/split_master.h"

namespace rt {

enum class MasterStorage;  // state/host_state.h

struct MuonHyper {
  double momentum = -1;  // mu; < 0: the run's AdamW beta1 (--muon-momentum)
  bool nesterov = true;
};

inline constexpr double kMuonNsA = 3.4445, kMuonNsB = -4.7750, kMuonNsC = 2.0315;
inline constexpr int kMuonNsSteps = 5;
inline constexpr double kMuonNormEps = 1e-7;

// Which tensors Muon updates: muon_matrix (state/host_state.h).
// 0.2 * sqrt(max(rows, cols)) (see above).
double muon_scale(int64_t rows, int64_t cols);

// o[R, C] = NS5(u / (||u||_F + 1e-7)) as above (u, o: R*C floats, row-major,
// may not overlap). The CPU specification, fp32 throughout.
void muon_orthogonalize(const float* u, float* o, int64_t rows, int64_t cols);
// The five quintic steps on x [r, c] in place; r <= c (x already normalised).
void newton_schulz5(float* x, int64_t r, int64_t c);
// The CPU twin of the GPU orthogonaliser's numerics (engine/cuda/muon_gpu.h):
// muon_orthogonalize with every value the GPU holds in bf16 rounded to bf16
// (round to nearest even): X = bf16(u / d), then per step A = bf16(X X^T),
// B = bf16(c (A A) + b A), X = bf16(B X + a X), sums in fp32. Not bit-
// identical to the GPU (its GEMMs sum in another order); for the CI tests.
void muon_orthogonalize_bf16(const float* u, float* o, int64_t rows, int64_t cols);

// Runs o[R, C] = NS5(u / (||u||_F + 1e-7)) somewhere: the contract of
// muon_orthogonalize, with the implementation's own rounding. Called from one
// thread (the optimizer's); u, o: R*C floats, row-major, not overlapping.
//
// Pipelined form (lanes() > 0; the GPU's, engine/cuda/muon_gpu.h): up to
// lanes() matrices in flight, so that the caller prepares the next matrix
// and applies the last one while this one runs. The caller takes lanes
// 0, 1, .., lanes()-1, 0, .. in turn (from 0 again whenever none is in
// flight); per matrix on lane l:
//   float* u = input(l, n)    the lane's buffer for U (n = R*C floats); the
//                             lane's previous result must have been taken
//   submit(l, R, C)           NS5 of U starts; U is not touched again by the caller
//   const uint16_t* o = result(l)   waits; O as bf16 bit patterns (R*C),
//                             valid until the lane's next input()
// The result is O rounded to bf16, and orthogonalize() on the same U returns
// exactly those values widened to fp32 (an implementation whose O is not
// bf16-valued has lanes() == 0). muon_unit_update (optim/muon_unit.h) uses
// the pipelined form when it is offered: the same bits as orthogonalize().
class Orthogonalizer {
 public:
  virtual ~Orthogonalizer() = default;
  virtual void orthogonalize(const float* u, float* o, int64_t rows, int64_t cols) = 0;
  virtual int lanes() const { return 0; }
  virtual float* input(int lane, int64_t n);
  virtual void submit(int lane, int64_t rows, int64_t cols);
  virtual const uint16_t* result(int lane);
};

// One Muon step of one matrix: p, m, g: rows*cols floats; mu the momentum
// (resolved, in [0, 1)); bf16_out (nullable) receives the new weights;
// orth (nullable): where NS5 runs (nullptr: muon_orthogonalize). U and O live
// in muon_scratch slots 0 and 1 (below).
void muon_update_matrix(float* p, float* m, const float* g, int64_t rows, int64_t cols, double mu, bool nesterov,
                        double lr, double wd, float grad_scale, uint16_t* bf16_out = nullptr,
                        Orthogonalizer* orth = nullptr);

// The two halves of muon_update_matrix, for the pipelined form above (same
// bits): muon_momentum makes U (u: n floats) and the new momentum m from g;
// muon_apply_bf16 applies O given as bf16 bit patterns to n elements (all or
// a run) of a [rows, cols] matrix (decay, then the scaled step; bf16_out
// nullable). muon_check_hyper: the checks of both.
void muon_check_hyper(double mu, double lr, double wd);
void muon_momentum(float* m, const float* g, float* u, int64_t n, double mu, bool nesterov, float grad_scale);
void muon_apply_bf16(float* p, const uint16_t* o, int64_t n, int64_t rows, int64_t cols, double lr, double wd,
                     uint16_t* bf16_out);
// muon_apply_bf16 on elements [0, n) of a split master (state/split_master.h)
// in one pass: decoded, updated and encoded back 64 at a time (the bits of
// split_master_decode, muon_apply_bf16, split_master_encode).
void muon_apply_bf16_split(const SplitMaster& p, const uint16_t* o, int64_t n, int64_t rows, int64_t cols, double lr,
                           double wd);

// Scratch of the calling thread, slot 0..3, at least n floats, uninitialised,
// kept at the largest size asked until the thread ends: the optimizer updates
// one matrix after another, and fresh allocations cost page faults on every
// call (~0.2 s for U and O of a 68M-element matrix). Slots: 0 U, 1 O (here),
// 2 a split or bf16 master's decoded matrix (pipelined: a bf16 master's chunk), 3 the decoded muon8bit/muon4bit
// m and v windows (optim/muon_unit.cpp). What a thread keeps: muon_scratch_bytes.
float* muon_scratch(int slot, int64_t n);
// Bytes one thread's scratch holds after a Muon step of a model of spec s:
// U and O of its largest matrix (not with a pipelined orthogonaliser, whose
// own buffers hold them), + the decoded matrix (a split or bf16 master; when
// pipelined, a chunk of kMuonApplyChunk for a bf16 master and none for a
// split one, updated in place), + the m and v windows of the quantized update
// (quantized moments: a matrix's m, or a piece's m and v, + a block either side).
uint64_t muon_scratch_bytes(const ModelSpec& s, MasterStorage master, bool quantized, bool pipelined = false);
// Bytes the calling thread's scratch holds now.
uint64_t muon_scratch_held();

}  // namespace rt
