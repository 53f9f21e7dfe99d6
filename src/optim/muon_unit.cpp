#include "optim/muon_unit.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/adamw_lean.h"
#include "optim/muon.h"

namespace rt {

namespace {

constexpr int64_t kBf16Chunk = int64_t(1) << 20;  // elements of a non-matrix tensor decoded at a time (bf16 masters)

// The tensors of u: Muon matrices with muon_update_matrix, others with adamw_update
// (m in the unit layout, v packed: u.v_at). Split master: each Muon matrix
// decoded into scratch slot 2, updated and encoded back (which writes the
// shadow); the other tensors updated in place by adamw_update_split (adamw_update
// bit for bit). bf16 master: each Muon matrix decoded into scratch slot 2, the
// other tensors kBf16Chunk elements at a time into a buffer of the call, updated
// as fp32 and stored back by bf16_master_store (stochastic rounding or Kahan,
// as adamw_lean_update stores).
void update_tensors(StateUnit& u, float* m, float* v, const float* grad, const OptimStep& o, float clip_coef,
                    uint16_t* bf16_shadow) {
  const double mu = muon_momentum(o);
  std::vector<float> chunk;  // bf16 masters: a non-matrix tensor's decoded piece
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const WeightEntry& e = u.entries[k];
    const int64_t off = u.offsets[k], n = e.numel();
    const double wd = weight_decay_for(e, o);
    if (master_is_bf16(u.master_kind)) {
      if (muon_matrix(e)) {
        float* w = muon_scratch(2, n);
        u.read_master(off, n, w);
        muon_update_matrix(w, m + off, grad + off, e.shape[0], e.shape[1], mu, o.muon.nesterov, o.lr, wd, clip_coef,
                           nullptr, o.orthogonalizer);
        bf16_master_store(u, off, n, w, o);
        continue;
      }
      chunk.resize(static_cast<size_t>(std::min(n, kBf16Chunk)));
      for (int64_t c0 = 0; c0 < n; c0 += kBf16Chunk) {  // elementwise: any cut gives the same values
        const int64_t c = std::min(kBf16Chunk, n - c0), at = off + c0;
        u.read_master(at, c, chunk.data());
        adamw_update(chunk.data(), m + at, v + u.v_at(k) + c0, grad + at, c, o.hyper, o.t, o.lr, wd, clip_coef);
        bf16_master_store(u, at, c, chunk.data(), o);
      }
      continue;
    }
    if (u.split()) {
      if (muon_matrix(e)) {
        float* w = muon_scratch(2, n);
        u.read_master(off, n, w);
        muon_update_matrix(w, m + off, grad + off, e.shape[0], e.shape[1], mu, o.muon.nesterov, o.lr, wd, clip_coef,
                           nullptr, o.orthogonalizer);
        u.write_master(off, n, w);
      } else {
        adamw_update_split(u.split_master(u.cur_shadow).at(off), m + off, v + u.v_at(k), grad + off, n, o.hyper, o.t,
                           o.lr, wd, clip_coef);
      }
      continue;
    }
    uint16_t* out = bf16_shadow ? bf16_shadow + off : nullptr;
    if (muon_matrix(e))
      muon_update_matrix(u.master() + off, m + off, grad + off, e.shape[0], e.shape[1], mu, o.muon.nesterov, o.lr, wd,
                         clip_coef, out, o.orthogonalizer);
    else
      adamw_update(u.master() + off, m + off, v + u.v_at(k), grad + off, n, o.hyper, o.t, o.lr, wd, clip_coef, out);
  }
}

constexpr uint64_t kKeyMuonM = 0x6d756f6e6d000001ull, kKeyMuonV = 0x6d756f6e76000002ull;

}  // namespace

void muon_unit_update(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow) {
  RT_CHECK(u.muon, "[muon] unit ", u.name, " is not a Muon unit");
  RT_CHECK(grad, "[muon] null gradient for unit ", u.name);
  // a shadow master (split: the CUDA engine's default; bf16-sr, bf16-kahan): updated in place, its one shadow
  // written by the update
  if (u.shadow_master())
    RT_CHECK(u.n_shadows == 1 && (!bf16_shadow || bf16_shadow == u.shadow(0)), "[muon] unit ", u.name, ": a ",
             master_storage_name(u.master_kind), " master is updated in place (one shadow, which the update writes)");
  if (!u.quantized()) return update_tensors(u, u.m(), u.v(), grad, o, clip_coef, bf16_shadow);
  // the decoded m and v: a layer's in the thread's scratch (slot 3, kept), the
  // embedding's and head's (no Muon matrix; the largest units) in a buffer of their own
  const int64_t n = u.numel, nv = u.v_len();
  const bool layer = std::any_of(u.entries.begin(), u.entries.end(), [](const WeightEntry& e) { return e.layer >= 0; });
  HostBuffer own;
  if (!layer) own = HostBuffer(static_cast<size_t>(n + nv), cat("the decoded ", optimizer_name(UpdateRule::muon, u.moments), " moments of ", u.name));
  float* m = layer ? muon_scratch(3, n + nv) : own.p;
  float* v = m + n;
  auto blocks = [&](int64_t len, const std::function<void(int64_t blk, int64_t first, int64_t k)>& f) {
    parallel_for(quant_blocks(len), 64, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) f(blk, blk * kQuantBlock, std::min(kQuantBlock, len - blk * kQuantBlock));
    });
  };
  quant_decode(u.moments, true, u.qm(), u.scale_m(), n, m);
  quant_decode(u.moments, false, u.qv(), u.scale_v(), nv, v);
  update_tensors(u, m, v, grad, o, clip_coef, bf16_shadow);
  const uint64_t key = quant_mix64(o.rounding_seed ^ quant_mix64(static_cast<uint64_t>(o.t) ^
                                                                 quant_mix64(static_cast<uint64_t>(u.index) + 0x6d756f6eull)));
  blocks(n, [&](int64_t blk, int64_t first, int64_t k) {
    const uint64_t kb = quant_mix64(key ^ quant_mix64(static_cast<uint64_t>(blk)));
    quant_block_encode(u.moments, true, o.moment_rounding, kb ^ kKeyMuonM, m + first, k, u.qm(), first,
                       u.scale_m() + blk);
  });
  blocks(nv, [&](int64_t blk, int64_t first, int64_t k) {
    const uint64_t kb = quant_mix64(key ^ quant_mix64(static_cast<uint64_t>(blk)));
    quant_block_encode(u.moments, false, o.moment_rounding, kb ^ kKeyMuonV, v + first, k, u.qv(), first,
                       u.scale_v() + blk);
  });
}

}  // namespace rt
