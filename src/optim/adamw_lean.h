// AdamW over a unit's lean storages (state/host_state.h): block-wise quantized
// moments (state/moment_quant.h) and/or a bf16 master (bf16-sr, bf16-kahan),
// also a split master under quantized moments. update_unit_range dispatches
// here; fp32 moments with an fp32 or split master keep optim/adamw.h's kernels.
//
// Per block of kQuantBlock unit elements (aligned to the unit's element 0):
// dequantize m, v (or load fp32), load the master as fp32 (decoded), run
// exactly adamw_update's element maths (optim/adamw_math.h) per tensor with its
// weight decay, then write the master back (fp32; split: encoded; bf16-sr:
// stochastically rounded; bf16-kahan: the fp32 update u = p' - p added to the
// bf16 p with a bf16 compensation c: y = u - c, t = bf16(p + y),
// c = bf16((t - p) - y), p = t) and requantize m, v with o.moment_rounding.
// Elements between tensors (padding) are carried, never updated.
// With AVX-512F, quantized moments under a split or bf16-sr master take a fused
// form of the same per-block steps (two loops per block, no calls between;
// the same ops per lane, so the same bits): adamw_lean.cpp fused_block_avx512.
// Randomness (stochastic rounding) is counter-based: a pure function of
// (o.rounding_seed, o.t, unit index, element or block index), so results do
// not depend on the thread count or on how [b, e) is cut.
// Range splits: with quantized moments b and e must be multiples of
// kQuantBlock (e may be the unit's end); then any split gives the same values
// as one call over the unit (the engine's 4096-element chunks qualify).
#pragma once
#include <cstdint>

#include "optim/unit_update.h"

namespace rt {

// Elements [b, e) of u; grad[e - b]; shadow_out: the unit's shadow receiving the
// new bf16 weights (fp32 master: any bf16 buffer of the unit's layout, or
// nullptr; shadow masters: one of the unit's shadows); shadow_in: the shadow
// holding the master before the update (shadow masters; == shadow_out in place).
void adamw_lean_update(StateUnit& u, int64_t b, int64_t e, const float* grad, const OptimStep& o, float clip_coef,
                       uint16_t* shadow_out, const uint16_t* shadow_in);

// Stores x[n], the new fp32 values of unit elements [b, b + n), into u's bf16
// master (bf16-sr or bf16-kahan) in place, its current shadow, rounded as
// adamw_lean_update stores its own: bf16-sr with the step's draws (a pure
// function of o.rounding_seed, o.t, the unit index and the element), bf16-kahan
// adding x - (the shadow's value) with the compensation. For updates that
// compute the new weights themselves (Muon, optim/muon_unit.h). Any split of
// [b, e) into calls gives the same bits.
void bf16_master_store(StateUnit& u, int64_t b, int64_t n, const float* x, const OptimStep& o);

// bf16 of x rounded stochastically: up in magnitude with probability
// (dropped low 16 bits) / 2^16, r16 uniform in [0, 2^16). NaN as f32_to_bf16.
uint16_t bf16_round_stochastic(float x, uint32_t r16);

}  // namespace rt
