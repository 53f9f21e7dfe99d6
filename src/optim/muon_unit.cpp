#include "optim/muon_unit.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/adamw_lean.h"
#include "optim/muon.h"

namespace rt {

namespace {

// One piece of tensor k of u: a Muon matrix whole (c0 = 0, c = numel) with
// muon_update_matrix, or elements [c0, c0 + c) of another tensor with
// adamw_update. m: the piece's momentum / Adam m (unit element offsets[k] + c0),
// v: its Adam v (nullptr for a matrix); grad: the unit's gradient.
// fp32 master: in place. Split: a matrix decoded into scratch slot 2, updated
// and encoded back (which writes the shadow); other pieces in place by
// adamw_update_split (adamw_update bit for bit). bf16: decoded (a matrix into
// slot 2, a piece into `buf`), updated as fp32 and stored back by
// bf16_master_store (stochastic rounding or Kahan, as adamw_lean_update stores).
void update_piece(StateUnit& u, size_t k, int64_t c0, int64_t c, float* m, float* v, const float* grad,
                  const OptimStep& o, float clip_coef, uint16_t* bf16_shadow, std::vector<float>& buf) {
  const WeightEntry& e = u.entries[k];
  const int64_t at = u.offsets[k] + c0;
  const double wd = weight_decay_for(e, o);
  const float* g = grad + at;
  if (muon_matrix(e)) {
    RT_CHECK(c0 == 0 && c == e.numel(), "[muon] internal: a Muon matrix is updated whole");
    const double mu = muon_momentum(o);
    if (!u.shadow_master()) {
      muon_update_matrix(u.master() + at, m, g, e.shape[0], e.shape[1], mu, o.muon.nesterov, o.lr, wd, clip_coef,
                         bf16_shadow ? bf16_shadow + at : nullptr, o.orthogonalizer);
      return;
    }
    float* w = muon_scratch(2, c);
    u.read_master(at, c, w);
    muon_update_matrix(w, m, g, e.shape[0], e.shape[1], mu, o.muon.nesterov, o.lr, wd, clip_coef, nullptr,
                       o.orthogonalizer);
    if (u.split())
      u.write_master(at, c, w);
    else
      bf16_master_store(u, at, c, w, o);
    return;
  }
  if (!u.shadow_master())
    return adamw_update(u.master() + at, m, v, g, c, o.hyper, o.t, o.lr, wd, clip_coef,
                        bf16_shadow ? bf16_shadow + at : nullptr);
  if (u.split())
    return adamw_update_split(u.split_master(u.cur_shadow).at(at), m, v, g, c, o.hyper, o.t, o.lr, wd, clip_coef);
  buf.resize(static_cast<size_t>(c));
  u.read_master(at, c, buf.data());
  adamw_update(buf.data(), m, v, g, c, o.hyper, o.t, o.lr, wd, clip_coef);
  bf16_master_store(u, at, c, buf.data(), o);
}

// The pipelined form of a Muon matrix (optim/muon.h Orthogonalizer::lanes):
// matrix_begin makes U in the lane's input and submits it; matrix_finish
// applies the lane's bf16 O to the master as update_piece's matrix branch
// does (the same bits: O widened from bf16 is what orthogonalize returns).
void matrix_begin(StateUnit& u, size_t k, float* m, const float* grad, const OptimStep& o, float clip_coef, int lane) {
  const WeightEntry& e = u.entries[k];
  const double mu = muon_momentum(o);
  muon_check_hyper(mu, o.lr, weight_decay_for(e, o));
  const int64_t n = e.numel();
  float* x = o.orthogonalizer->input(lane, n);
  muon_momentum(m, grad + u.offsets[k], x, n, mu, o.muon.nesterov, clip_coef);
  o.orthogonalizer->submit(lane, e.shape[0], e.shape[1]);
}

// A split master is decoded, updated and encoded back in one pass, 64
// elements at a time (muon_apply_bf16_split); a bf16 master (stochastic
// rounding or Kahan) kMuonApplyChunk elements at a time, so the decoded chunk
// stays in the caches. Elementwise: the same bits as the whole matrix.
void matrix_finish(StateUnit& u, size_t k, const OptimStep& o, uint16_t* bf16_shadow, const uint16_t* ob) {
  const WeightEntry& e = u.entries[k];
  const int64_t at = u.offsets[k], n = e.numel(), R = e.shape[0], C = e.shape[1];
  const double wd = weight_decay_for(e, o);
  if (!u.shadow_master())
    return muon_apply_bf16(u.master() + at, ob, n, R, C, o.lr, wd, bf16_shadow ? bf16_shadow + at : nullptr);
  if (u.split()) {  // one pass: decoded, updated, encoded 64 elements at a time (the bits of the chunked form)
    u.check_weights_in_ram();
    RT_CHECK(!u.paged_out, "[muon] unit ", u.name,
             ": its master remainder is in the state tier's file; page it in first");
    return muon_apply_bf16_split(u.split_master(u.cur_shadow).at(at), ob, n, R, C, o.lr, wd);
  }
  float* w = muon_scratch(2, std::min(n, kMuonApplyChunk));
  for (int64_t c0 = 0; c0 < n; c0 += kMuonApplyChunk) {
    const int64_t c = std::min(kMuonApplyChunk, n - c0);
    u.read_master(at + c0, c, w);
    muon_apply_bf16(w, ob + c0, c, R, C, o.lr, wd, nullptr);
    bf16_master_store(u, at + c0, c, w, o);
  }
}

// The matrices in flight on the orthogonaliser's lanes, oldest first.
struct MatrixPipeline {
  StateUnit& u;
  const OptimStep& o;
  uint16_t* bf16_shadow;
  int lanes;
  struct Pending {
    size_t k;
    int lane;
  };
  std::vector<Pending> q;  // a ring of `lanes` would do; a unit has few matrices
  size_t head = 0;
  int next_lane = 0;

  void finish_oldest() {
    const Pending p = q[head++];
    matrix_finish(u, p.k, o, bf16_shadow, o.orthogonalizer->result(p.lane));
  }
  void begin(size_t k, float* m, const float* grad, float clip_coef) {
    if (q.size() - head == static_cast<size_t>(lanes)) finish_oldest();  // its lane is the next one
    matrix_begin(u, k, m, grad, o, clip_coef, next_lane);
    q.push_back({k, next_lane});
    next_lane = (next_lane + 1) % lanes;
  }
  void drain() {
    while (head < q.size()) finish_oldest();
  }
};

std::vector<size_t> entry_order(const StateUnit& u) {
  std::vector<size_t> o(u.entries.size());
  for (size_t k = 0; k < o.size(); ++k) o[k] = k;
  return o;
}

// The order a pipelined update takes a unit's tensors in (fp32 moments: no
// window asks for increasing offsets): its smallest Muon matrix first (the
// GPU waits for the first U) and its second smallest last (the host waits
// for the last O), the others as they come; the matrices are independent,
// so the bits are those of entry order. Qwen2's layer: k_proj, the norms,
// q_proj, o_proj, the MLP, v_proj.
std::vector<size_t> pipeline_order(const StateUnit& u) {
  std::vector<size_t> mats, order;
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (muon_matrix(u.entries[k])) mats.push_back(k);
  if (mats.size() < 3) return entry_order(u);
  std::vector<size_t> by_size = mats;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return u.entries[a].numel() < u.entries[b].numel(); });
  const size_t first = by_size[0], last = by_size[1];
  order.push_back(first);
  for (size_t k = 0; k < u.entries.size(); ++k)
    if (k != first && k != last) order.push_back(k);
  order.push_back(last);
  return order;
}

constexpr uint64_t kKeyMuonM = 0x6d756f6e6d000001ull, kKeyMuonV = 0x6d756f6e76000002ull;

// One quantized moment of a unit (m: signed, numel elements; or the packed v)
// decoded a window of whole blocks at a time into buf: blocks [b0, b1) are
// decoded, buf[0] = element b0 * kQuantBlock. Ranges are asked in increasing
// order; blocks before a range's first are final and encoded on the way
// (a block shared with the previous range stays decoded), the rest by finish().
// Each block is encoded once, from its final values, with the key of its index:
// the same codes as decoding and encoding the whole moment at once.
struct MomentWindow {
  MomentStorage storage;
  bool signed_code;
  uint8_t* codes;
  float* scales;
  int64_t len;  // elements of the moment
  QuantRounding rounding;
  uint64_t key, salt;
  float* buf;
  int64_t b0 = 0, b1 = 0;

  void encode(int64_t from, int64_t to) {  // blocks [from, to) of the window
    parallel_for(to - from, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t blk = from + i0; blk < from + i1; ++blk) {
        const int64_t first = blk * kQuantBlock, k = std::min(kQuantBlock, len - first);
        const uint64_t kb = quant_mix64(key ^ quant_mix64(static_cast<uint64_t>(blk)));
        quant_block_encode(storage, signed_code, rounding, kb ^ salt, buf + (first - b0 * kQuantBlock), k, codes, first,
                           scales + blk, /*muon=*/true);
      }
    });
  }
  // Elements [lo, hi) decoded; returns element lo's place in buf.
  float* at(int64_t lo, int64_t hi) {
    const int64_t f = lo / kQuantBlock, l = quant_blocks(hi);
    RT_CHECK(lo >= b0 * kQuantBlock && lo < hi && hi <= len, "[muon] internal: moment range [", lo, ", ", hi,
             ") out of order");
    if (f > b0) {  // blocks before f are final; a decoded block from f on moves to the front
      const int64_t keep_from = std::min(f, b1);
      encode(b0, keep_from);
      if (b1 > keep_from)
        std::memmove(buf, buf + (keep_from - b0) * kQuantBlock,
                     static_cast<size_t>((b1 - keep_from) * kQuantBlock) * 4);
      b0 = keep_from;
      b1 = std::max(b1, keep_from);
      if (b0 < f) {  // nothing decoded at f: start there
        b0 = b1 = f;
      }
    }
    if (l > b1) {
      const int64_t first = b1 * kQuantBlock, n = std::min(l * kQuantBlock, len) - first;
      quant_decode_range(first, n);
      b1 = l;
    }
    return buf + (lo - b0 * kQuantBlock);
  }
  void quant_decode_range(int64_t first, int64_t n) {  // whole blocks from `first` (a block start)
    parallel_for(quant_blocks(n), 16, [&](int64_t i0, int64_t i1) {
      for (int64_t j = i0; j < i1; ++j) {
        const int64_t e = first + j * kQuantBlock, k = std::min(kQuantBlock, len - e);
        quant_block_decode(storage, signed_code, codes, e, scales[e / kQuantBlock], k, buf + (e - b0 * kQuantBlock),
                           /*muon=*/true);
      }
    });
  }
  void finish() {
    if (b1 > b0) encode(b0, b1);
    // blocks never asked for (a moment's tail past its last tensor: none in HostState's layout) keep their codes
    b0 = b1;
  }
};

// Elements a window of one range may need: the range's blocks, one more for a
// range that starts inside a block.
int64_t window_floats(int64_t range) { return (quant_blocks(range) + 1) * kQuantBlock; }

// The longest range of m and of v that the quantized update asks a window for (see muon_unit_update).
void window_ranges(const StateUnit& u, int64_t piece, int64_t* rm, int64_t* rv) {
  *rm = *rv = 0;
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const int64_t n = u.entries[k].numel(), r = muon_matrix(u.entries[k]) ? n : std::min(n, piece);
    *rm = std::max(*rm, r);
    if (u.v_at(k) >= 0) *rv = std::max(*rv, r);
  }
}

}  // namespace

void muon_unit_update(StateUnit& u, const float* grad, const OptimStep& o, float clip_coef, uint16_t* bf16_shadow,
                      int64_t piece) {
  RT_CHECK(u.muon, "[muon] unit ", u.name, " is not a Muon unit");
  RT_CHECK(grad, "[muon] null gradient for unit ", u.name);
  RT_CHECK(piece >= 1, "[muon] piece of ", piece, " elements");
  // a shadow master (split: the CUDA engine's default; bf16-sr, bf16-kahan): updated in place, its one shadow
  // written by the update
  if (u.shadow_master())
    RT_CHECK(u.n_shadows == 1 && (!bf16_shadow || bf16_shadow == u.shadow(0)), "[muon] unit ", u.name, ": a ",
             master_storage_name(u.master_kind), " master is updated in place (one shadow, which the update writes)");
  std::vector<float> buf;  // a bf16 master's decoded piece
  // pipelined NS5 (optim/muon.h): each matrix's momentum and U now, its
  // update once its O is back, the other tensors' AdamW in between; every
  // matrix is done before this returns
  const int lanes = o.orthogonalizer ? o.orthogonalizer->lanes() : 0;
  MatrixPipeline pipe{u, o, bf16_shadow, lanes, {}, 0, 0};
  auto run = [&](size_t k, int64_t c0, int64_t c, float* m, float* v) {
    if (lanes > 0 && muon_matrix(u.entries[k])) return pipe.begin(k, m, grad, clip_coef);
    update_piece(u, k, c0, c, m, v, grad, o, clip_coef, bf16_shadow, buf);
  };
  if (!u.quantized()) {
    for (size_t k : lanes > 0 ? pipeline_order(u) : entry_order(u)) {
      const int64_t n = u.entries[k].numel(), step = muon_matrix(u.entries[k]) ? n : piece;
      for (int64_t c0 = 0; c0 < n; c0 += step) {
        const int64_t c = std::min(step, n - c0);
        run(k, c0, c, u.m() + u.offsets[k] + c0, u.v_at(k) >= 0 ? u.v() + u.v_at(k) + c0 : nullptr);
      }
    }
    pipe.drain();
    return;
  }
  // Quantized: tensor by tensor (a Muon matrix whole, the others in pieces of
  // `piece` elements), m and v decoded through windows of whole blocks in the
  // thread's scratch (slot 3: [m window | v window]), each block encoded once
  // when the update has passed it.
  int64_t rm = 0, rv = 0;
  window_ranges(u, piece, &rm, &rv);
  float* scratch = muon_scratch(3, window_floats(rm) + (rv ? window_floats(rv) : 0));
  const uint64_t key =
      quant_mix64(o.rounding_seed ^ quant_mix64(static_cast<uint64_t>(o.t) ^
                                                quant_mix64(static_cast<uint64_t>(u.index) + 0x6d756f6eull)));
  MomentWindow wm{u.moments, true, u.qm(), u.scale_m(), u.numel, o.moment_rounding, key, kKeyMuonM, scratch};
  MomentWindow wv{
      u.moments, false, u.qv(), u.scale_v(), u.v_len(), o.moment_rounding, key, kKeyMuonV, scratch + window_floats(rm)};
  for (size_t k = 0; k < u.entries.size(); ++k) {
    const WeightEntry& e = u.entries[k];
    const int64_t off = u.offsets[k], n = e.numel(), step = muon_matrix(e) ? n : piece;
    for (int64_t c0 = 0; c0 < n; c0 += step) {
      const int64_t c = std::min(step, n - c0), at = off + c0;
      float* m = wm.at(at, at + c);
      float* v = u.v_at(k) >= 0 ? wv.at(u.v_at(k) + c0, u.v_at(k) + c0 + c) : nullptr;
      run(k, c0, c, m, v);  // a matrix's momentum is final once begun: its blocks may be encoded from here on
    }
  }
  pipe.drain();
  wm.finish();
  wv.finish();
}

}  // namespace rt
