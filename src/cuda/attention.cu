// Causal GQA attention: the public entry points (shape and pointer checks,
// the choice of kernels) and the mma_sync kernels, FlashAttention-2 style,
// bf16 mma.sync (m16n8k16) with fp32 accumulators; sm_80 and newer. D in
// {64, 96, 128, 256}; any T (partial tiles are zero-filled and masked). On
// compute capability 9.0 the calls with D in {64, 128} go to the TMA + wgmma
// kernels of attention_sm90.cu instead (set_attention_kernels /
// RAMTRAIN_ATTENTION choose otherwise); both use the delta kernel below. The
// softmax, mask and epilogue pieces both sets share are in attention/, this
// set's tile loads and MMA helpers in attention/mma_sm80.cuh.
//
// Shared-memory tiles are [rows][DP] bf16 (DP = D, or 128 for D = 96) with
// 16-byte chunks XOR-swizzled by (row & 7), so cp.async stores and ldmatrix
// loads are bank-conflict free. Tile shapes per D: FwdCfg, DkdvCfg, DqCfg
// (the ones below are those of D = 64 and 128; every shape fits the 99 KiB of
// shared memory an sm_86/89 block may have).
// Each warp owns 16 rows (32 in the forward) of its block's tile. Softmax
// works on raw scores: p = 2^(s * scale*log2e - m * scale*log2e), one FFMA and
// one ex2.approx.ftz per element (lse is stored in natural-log units).
//
// forward:   block = 128 query rows of one head (4 warps of 32 rows); loops over 64-key
//            tiles up to the diagonal (double-buffered cp.async); online softmax;
//            writes out and lse (natural log).
// backward:  delta = rowsum(dO * O) (fp32) first; then
//            dkdv kernel: block = 64 keys of one kv head (4 warps); loops over
//              every query head of the group and every 64-row query tile at or
//              after the diagonal; dK, dV stay in registers (fixed order, no atomics);
//            dq kernel:   block = 64 query rows of one head (4 warps); loops
//              over the key tiles; dQ in registers.
// Packed documents (doc_start) and sliding windows (window): in the kernels'
// DOC code paths each query row t has a first key, row_first_key = its
// document's start and/or t - window + 1 (attention/mask.cuh); a block starts
// at the first key tile its rows see (dK/dV: stops after the last query tile
// that sees the block's keys) and masks the rest per element, so a window of
// W costs O(T W), not O(T^2). Template argument ROWS: kCausal (the plain
// causal kernels), kDocs, kWindow (windows get their own instances, so the
// documents' kernels keep their registers). gpt-oss's sinks join the
// forward's last step (softmax_row_finish: lse and out include them); the
// backward kernels are unchanged and d sink is one more sum (attention/sinks.h).
// Gemma 2's attention-logit soft cap: template argument CAP (instances of
// their own, so the others compile as before; both kernel sets): the raw
// scores are capped in place before the masks, z' = K tanh(z / K) with K =
// cap sqrt(D) (softcap_scores), and everything after is unchanged, lse
// included (that of the capped scores). The backward kernels compute dP
// while the tile still holds z' and fold (dP - delta)(1 - tanh^2) in before P
// replaces it (softcap_dp_rows/cols), then dS = P * that.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/attention/epilogue.cuh"
#include "cuda/attention/mask.cuh"
#include "cuda/attention/mma_sm80.cuh"
#include "cuda/attention/sinks.h"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/utils.cuh"
#include "cuda/attention_sm90.h"
#include "cuda/check.h"
#include "cuda/kernel_util.cuh"
#include "cuda/ops.h"

namespace rt::cuda {
namespace {

using namespace attn;

// ---------------------------------------------------------------- forward

// Tile shapes (tuning constants; the bench builds variants with -D).
#ifndef RAMTRAIN_ATTN_FWD_MT
#define RAMTRAIN_ATTN_FWD_MT 2
#endif
// Per head_dim: MT 16-row m-tiles per warp, WARPS warps (BR = 16 MT WARPS
// query rows per block), BC keys per tile; every shape keeps the shared
// memory under 99 KiB (the per-block limit of sm_86 / sm_89) and the fp32
// output accumulator (MT x D/2 registers per thread) under ~128 registers.
// D = 256 takes one m-tile per warp and 32-key tiles.
template <int D>
struct FwdCfg {
  static constexpr int MT = D == 256 ? 1 : RAMTRAIN_ATTN_FWD_MT;
  static constexpr int WARPS = D == 256 ? 4 : 8 / MT;
  static constexpr int BR = 16 * MT * WARPS, BC = D == 256 ? 32 : 64, DP = tile_width(D);
  static constexpr int SMEM = (BR * DP + 4 * BC * DP) * 2;  // Q, [2 stages][K, V]
  static_assert(SMEM <= 99 * 1024, "forward tile shape over the sm_86/89 shared-memory limit");
};

// Warp w owns rows [w*16*MT, (w+1)*16*MT) of the block's query tile. DOC:
// packed documents (doc [B,T], see ops.h): key tiles before the block's first
// document start are skipped, keys before a row's start masked. CAP: Gemma
// 2's soft cap on the scores before the masks (softcap_scores).
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(32 * FwdCfg<D>::WARPS, 8 / FwdCfg<D>::WARPS)
    attention_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ q,
                             const bf16* __restrict__ k, const bf16* __restrict__ v, AttnShape s,
                             const int32_t* __restrict__ doc, const bf16* __restrict__ sinks) {
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = FwdCfg<D>;
  constexpr int NT = 32 * C::WARPS, MT = C::MT, WR = 16 * MT, DP = C::DP;
  constexpr int kFwdBR = C::BR, kFwdBC = C::BC;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem);
  const uint32_t skv = sq + kFwdBR * DP * 2;  // [2 stages][K, V][BC][DP]
  auto sk = [&](int st) { return skv + static_cast<uint32_t>((st * 2) * kFwdBC * DP * 2); };
  auto sv = [&](int st) { return skv + static_cast<uint32_t>((st * 2 + 1) * kFwdBC * DP * 2); };

  // grid (B*H, query blocks): blocks are dispatched x fastest, so every head's
  // heaviest (last, longest causal row) query block starts first: longest-first
  // over the whole grid, which keeps the SMs busy to the end.
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = qb * kFwdBR;
  const int64_t ldq = static_cast<int64_t>(s.H) * D, ldkv = static_cast<int64_t>(s.G) * D;
  const bf16* qp = q + (static_cast<int64_t>(b) * s.T + q0) * ldq + h * D;
  const bf16* kp = k + static_cast<int64_t>(b) * s.T * ldkv + g * D;
  const bf16* vp = v + static_cast<int64_t>(b) * s.T * ldkv + g * D;

  tile_load<kFwdBR, D, NT>(sq, qp, ldq, s.T - q0, q);
  const int last_key = min(s.T, q0 + kFwdBR) - 1;
  const int n_tiles = last_key / kFwdBC + 1;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  const int j0 = DOC ? row_first_key<ROWS>(docb, q0, s.window) / kFwdBC : 0;  // the block's rows' first key tile
  tile_load<kFwdBC, D, NT>(sk(0), kp + j0 * kFwdBC * ldkv, ldkv, s.T - j0 * kFwdBC, k);
  tile_load<kFwdBC, D, NT>(sv(0), vp + j0 * kFwdBC * ldkv, ldkv, s.T - j0 * kFwdBC, v);
  cp_async_commit();

  float o[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) frag_zero(o[mt]);
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  const int warp_row0 = q0 + warp * WR;
  const int row_base = warp_row0 + (lane >> 2);  // rows row_base + 16*mt + {0, 8}
  // DOC: document starts of this thread's rows and the first / last of the warp's rows
  int row_start[MT][2] = {}, warp_start0 = 0, warp_start1 = 0;
  if constexpr (DOC) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        row_start[mt][r] = row_first_key<ROWS>(docb, min(row_base + mt * 16 + 8 * r, s.T - 1), s.window);
    warp_start0 = row_first_key<ROWS>(docb, min(warp_row0, s.T - 1), s.window);
    warp_start1 = row_first_key<ROWS>(docb, min(warp_row0 + WR - 1, s.T - 1), s.window);
  }

  for (int j = j0; j < n_tiles; ++j) {
    const int st = (j - j0) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < n_tiles) {
      const int k0 = (j + 1) * kFwdBC;
      tile_load<kFwdBC, D, NT>(sk(st ^ 1), kp + k0 * ldkv, ldkv, s.T - k0, k);
      tile_load<kFwdBC, D, NT>(sv(st ^ 1), vp + k0 * ldkv, ldkv, s.T - k0, v);
    }
    cp_async_commit();
    const int k0 = j * kFwdBC;
    if (k0 > warp_row0 + WR - 1) continue;            // every key of this tile is after every row of this warp
    if (DOC && k0 + kFwdBC <= warp_start0) continue;  // every key before every row's document

    float sc[MT][kFwdBC / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) frag_zero(sc[mt]);
    mma_rows_rows_mt<D, kFwdBC, MT>(sc, sq, warp * WR, sk(st));

    const bool need_mask = k0 + kFwdBC - 1 > warp_row0;
    const bool need_doc_mask = DOC && k0 < warp_start1;
    uint32_t pa[MT][kFwdBC / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (CAP) softcap_scores(sc[mt], s);
      if (need_mask) mask_causal_scores(sc[mt], k0, row_base + mt * 16);
      if (need_doc_mask) mask_doc_rows(sc[mt], k0, row_start[mt], -INFINITY);
      softmax_online(sc[mt], o[mt], m[mt], l[mt], s.scale_log2);
      frag_to_a(pa[mt], sc[mt]);
    }
    mma_regs_trans_mt<D, kFwdBC, MT>(o, pa, sv(st));
  }

  // finish: normalise, store out and lse
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float t = softmax_row_sum(l[mt][r]);
      const int row = row_base + mt * 16 + r * 8;
      if (row < s.T) {
        float row_lse;
        const float f = softmax_row_finish(m[mt][r], t, s.scale, sinks, h, row_lse);
        store_row(out + (static_cast<int64_t>(b) * s.T + row) * ldq + h * D, o[mt], r, f);
        if ((lane & 3) == 0) lse[static_cast<int64_t>(bh) * s.T + row] = row_lse;
      }
    }
  }
}

// ---------------------------------------------------------------- backward

// delta[b,h,t] = sum_d dout * out; one warp per (b, t, h) row.
template <int D>
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int64_t rows, int T, int H) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float acc = 0.f;
  for (int d = lane * 8; d < D; d += 256) {
    float a[8], c[8];
    detail::bf16x8_to_float(*reinterpret_cast<const detail::bf16x8*>(dout + row * D + d), a);
    detail::bf16x8_to_float(*reinterpret_cast<const detail::bf16x8*>(out + row * D + d), c);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += a[i] * c[i];
  }
  acc = detail::warp_sum(acc);
  if (lane == 0) {
    const int64_t h = row % H, bt = row / H, t = bt % T, b = bt / T;
    delta[(b * H + h) * T + t] = acc;
  }
}

// Per head_dim: BC = 64 keys per block (4 warps of 16), BR query rows per
// tile; at D = 256 the dK, dV accumulators (2 x D/2 registers per thread)
// would not fit, so each block keeps DS = 2 slices of DO = D/2 columns
// (blockIdx.z picks one) and recomputes P and dS per slice, with 16-row query
// tiles to stay under 99 KiB of shared memory.
template <int D>
struct DkdvCfg {
  static constexpr int WARPS = 4, BC = 16 * WARPS, BR = D == 256 ? 16 : 64, DS = D == 256 ? 2 : 1, DO = D / DS;
  static constexpr int DP = tile_width(D);
  static constexpr int SMEM = (2 * BC * DP + 4 * BR * DP) * 2 + 4 * BR * 4;  // K, V, [2][Q, dO], [2][lse, delta]
  static constexpr int SMEM_DOC = SMEM + 2 * BR * 4;                         // + [2][document start]
  static_assert(SMEM_DOC <= 99 * 1024, "dK/dV tile shape over the sm_86/89 shared-memory limit");
};

// DOC: packed documents (doc [B,T]): the query tiles after the last row that
// sees a key of the block are skipped, queries of other documents masked.
// CAP: the soft cap; dP is computed before P replaces the capped scores
// (softcap_dp_cols).
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(32 * DkdvCfg<D>::WARPS, 8 / DkdvCfg<D>::WARPS)
    attention_backward_dkdv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv, const bf16* __restrict__ dout,
                                   const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                   const float* __restrict__ lse, const float* __restrict__ delta, AttnShape s,
                                   const int32_t* __restrict__ doc) {
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = DkdvCfg<D>;
  constexpr int NT = 32 * C::WARPS, kBwdBC = C::BC, kBwdBR = C::BR, DP = C::DP, DO = C::DO;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sk = smem_u32(smem);
  const uint32_t sv = sk + kBwdBC * DP * 2;
  const uint32_t sqd = sv + kBwdBC * DP * 2;  // [2 stages][Q, dO][BR][D]
  auto sq = [&](int st) { return sqd + static_cast<uint32_t>((st * 2) * kBwdBR * DP * 2); };
  auto sdo = [&](int st) { return sqd + static_cast<uint32_t>((st * 2 + 1) * kBwdBR * DP * 2); };
  float* s_lse = reinterpret_cast<float*>(smem + (2 * kBwdBC * DP + 4 * kBwdBR * DP) * 2);  // [2][BR]
  float* s_delta = s_lse + 2 * kBwdBR;                                                      // [2][BR]
  int* s_doc = reinterpret_cast<int*>(s_delta + 2 * kBwdBR);                                // [2][BR] (DOC)

  const int kb = blockIdx.y;  // grid (B*G, key blocks): the first key blocks (most query tiles) start first
  const int bg = blockIdx.x, b = bg / s.G, g = bg % s.G;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int key0 = kb * kBwdBC;
  const int64_t ldq = static_cast<int64_t>(s.H) * D, ldkv = static_cast<int64_t>(s.G) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * s.T + key0) * ldkv + g * D;

  tile_load<kBwdBC, D, NT>(sk, k + kv_off, ldkv, s.T - key0, k);
  tile_load<kBwdBC, D, NT>(sv, v + kv_off, ldkv, s.T - key0, v);

  const int i_start = key0 / kBwdBR;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  // DOC: query rows from t_end on belong to documents that start after this block's last key
  const int t_end = DOC ? doc_rows_end<ROWS>(docb, s.window, key0, s.T, min(key0 + kBwdBC, s.T) - 1) : s.T;
  const int n_i = (t_end + kBwdBR - 1) / kBwdBR - i_start;
  const int n_iter = s.group * n_i;

  auto issue = [&](int it, int st) {
    const int h = g * s.group + it / n_i;
    const int qr0 = (i_start + it % n_i) * kBwdBR;
    const int64_t off = (static_cast<int64_t>(b) * s.T + qr0) * ldq + h * D;
    tile_load<kBwdBR, D, NT>(sq(st), q + off, ldq, s.T - qr0, q);
    tile_load<kBwdBR, D, NT>(sdo(st), dout + off, ldq, s.T - qr0, dout);
    const int64_t lo = (static_cast<int64_t>(b) * s.H + h) * s.T;
    for (int i = threadIdx.x; i < kBwdBR; i += NT) {
      const int t = qr0 + i;
      s_lse[st * kBwdBR + i] = t < s.T ? lse[lo + t] * kLog2e : INFINITY;
      s_delta[st * kBwdBR + i] = t < s.T ? delta[lo + t] : 0.f;
      if constexpr (DOC) s_doc[st * kBwdBR + i] = t < s.T ? row_first_key<ROWS>(docb, t, s.window) : 0;
    }
  };
  issue(0, 0);
  cp_async_commit();

  const int dc0 = C::DS == 1 ? 0 : static_cast<int>(blockIdx.z) * DO;  // this block's dK, dV columns [dc0, dc0 + DO)
  float dka[DO / 8][4], dva[DO / 8][4];
  frag_zero(dka);
  frag_zero(dva);
  const int krow = key0 + warp * 16 + (lane >> 2);  // keys krow, krow + 8

  for (int it = 0; it < n_iter; ++it) {
    const int st = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_iter) issue(it + 1, st ^ 1);
    cp_async_commit();
    const int qr0 = (i_start + it % n_i) * kBwdBR;

    // S^T (16 keys x BR queries) = K_w Q^T ; P^T = exp2(S^T * c - lse)
    float p[kBwdBR / 8][4];
    frag_zero(p);
    mma_rows_rows<D, kBwdBR>(p, sk, warp * 16, sq(st));
    float dp[kBwdBR / 8][4];
    if constexpr (CAP) {  // S^T capped; dP^T = V_w dO^T; dp = (dP^T - delta) (1 - tanh^2)
      softcap_scores(p, s);
      frag_zero(dp);
      mma_rows_rows<D, kBwdBR>(dp, sv, warp * 16, sdo(st));
      softcap_dp_cols(dp, p, s_delta + st * kBwdBR, s.cap_inv_k);
    }
    const bool need_mask = qr0 < key0 + warp * 16 + 15;
    probs_cols(p, s.scale_log2, s_lse + st * kBwdBR, need_mask, qr0, krow);
    // DOC: the tile's last row starts its document after this warp's first key
    if (DOC && s_doc[st * kBwdBR + min(kBwdBR, s.T - qr0) - 1] > key0 + warp * 16)
      mask_doc_cols(p, s_doc + st * kBwdBR, krow);
    if constexpr (CAP) {
      dscores_capped(dp, p);  // dS^T = P^T * dp
    } else {
      // dP^T = V_w dO^T ; dS^T = P^T * (dP^T - delta)
      frag_zero(dp);
      mma_rows_rows<D, kBwdBR>(dp, sv, warp * 16, sdo(st));
      dscores_cols(dp, p, s_delta + st * kBwdBR);
    }
    uint32_t pa[kBwdBR / 16][4], dsa[kBwdBR / 16][4];
    frag_to_a(pa, p);
    frag_to_a(dsa, dp);
    mma_regs_trans<D, kBwdBR, DO>(dva, pa, sdo(st), dc0 / 8);  // dV += P^T dO
    mma_regs_trans<D, kBwdBR, DO>(dka, dsa, sq(st), dc0 / 8);  // dK += dS^T Q
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = krow + r * 8;
    if (key >= s.T) continue;
    const int64_t off = (static_cast<int64_t>(b) * s.T + key) * ldkv + g * D + dc0;
    store_row(dk + off, dka, r, s.scale);
    store_row(dv + off, dva, r, 1.f);
  }
}

// Per head_dim: BR = 64 query rows per block (4 warps of 16), BC keys per
// tile (16 at D = 256, to stay under 99 KiB of shared memory).
template <int D>
struct DqCfg {
  static constexpr int WARPS = 4, BR = 16 * WARPS, BC = D == 256 ? 16 : 64, DP = tile_width(D);
  static constexpr int SMEM = (2 * BR * DP + 4 * BC * DP) * 2;  // Q, dO, [2 stages][K, V]
  static_assert(SMEM <= 99 * 1024, "dQ tile shape over the sm_86/89 shared-memory limit");
};

// DOC: packed documents (doc [B,T]): as in the forward. CAP: as in dK/dV.
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(32 * DqCfg<D>::WARPS, 8 / DqCfg<D>::WARPS)
    attention_backward_dq_kernel(bf16* __restrict__ dq, const bf16* __restrict__ dout, const bf16* __restrict__ q,
                                 const bf16* __restrict__ k, const bf16* __restrict__ v, const float* __restrict__ lse,
                                 const float* __restrict__ delta, AttnShape s, const int32_t* __restrict__ doc) {
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = DqCfg<D>;
  constexpr int NT = 32 * C::WARPS, kDqBR = C::BR, kDqBC = C::BC, DP = C::DP;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem);
  const uint32_t sdo = sq + kDqBR * DP * 2;
  const uint32_t skv = sdo + kDqBR * DP * 2;
  auto sk = [&](int st) { return skv + static_cast<uint32_t>((st * 2) * kDqBC * DP * 2); };
  auto sv = [&](int st) { return skv + static_cast<uint32_t>((st * 2 + 1) * kDqBC * DP * 2); };

  const int qb = gridDim.y - 1 - blockIdx.y;  // grid (B*H, query blocks), heaviest first as in the forward
  const int bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int q0 = qb * kDqBR;
  const int64_t ldq = static_cast<int64_t>(s.H) * D, ldkv = static_cast<int64_t>(s.G) * D;
  const int64_t qoff = (static_cast<int64_t>(b) * s.T + q0) * ldq + h * D;
  const bf16* kp = k + static_cast<int64_t>(b) * s.T * ldkv + g * D;
  const bf16* vp = v + static_cast<int64_t>(b) * s.T * ldkv + g * D;

  tile_load<kDqBR, D, NT>(sq, q + qoff, ldq, s.T - q0, q);
  tile_load<kDqBR, D, NT>(sdo, dout + qoff, ldq, s.T - q0, dout);
  const int n_tiles = (min(s.T, q0 + kDqBR) - 1) / kDqBC + 1;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  const int j0 = DOC ? row_first_key<ROWS>(docb, q0, s.window) / kDqBC : 0;  // first key tile any row of the block sees
  tile_load<kDqBC, D, NT>(sk(0), kp + j0 * kDqBC * ldkv, ldkv, s.T - j0 * kDqBC, k);
  tile_load<kDqBC, D, NT>(sv(0), vp + j0 * kDqBC * ldkv, ldkv, s.T - j0 * kDqBC, v);
  cp_async_commit();

  const int row_base = q0 + warp * 16 + (lane >> 2);
  float row_lse[2], row_delta[2];
  row_stats_load(row_lse, row_delta, lse, delta, bh, row_base, s.T);
  int row_start[2] = {}, warp_start1 = 0;  // DOC: this thread's rows' and the warp's last row's document start
  if constexpr (DOC) {
    row_start[0] = row_first_key<ROWS>(docb, min(row_base, s.T - 1), s.window);
    row_start[1] = row_first_key<ROWS>(docb, min(row_base + 8, s.T - 1), s.window);
    warp_start1 = row_first_key<ROWS>(docb, min(q0 + warp * 16 + 15, s.T - 1), s.window);
  }
  float dqa[D / 8][4];
  frag_zero(dqa);

  for (int j = j0; j < n_tiles; ++j) {
    const int st = (j - j0) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < n_tiles) {
      const int k0 = (j + 1) * kDqBC;
      tile_load<kDqBC, D, NT>(sk(st ^ 1), kp + k0 * ldkv, ldkv, s.T - k0, k);
      tile_load<kDqBC, D, NT>(sv(st ^ 1), vp + k0 * ldkv, ldkv, s.T - k0, v);
    }
    cp_async_commit();
    const int k0 = j * kDqBC;

    float p[kDqBC / 8][4];
    frag_zero(p);
    mma_rows_rows<D, kDqBC>(p, sq, warp * 16, sk(st));
    float dp[kDqBC / 8][4];
    if constexpr (CAP) {  // S capped; dP = dO V^T; dp = (dP - delta) (1 - tanh^2)
      softcap_scores(p, s);
      frag_zero(dp);
      mma_rows_rows<D, kDqBC>(dp, sdo, warp * 16, sv(st));
      softcap_dp_rows(dp, p, row_delta, s.cap_inv_k);
    }
    const bool need_mask = k0 + kDqBC - 1 > q0 + warp * 16;
    probs_rows(p, s.scale_log2, row_lse, need_mask, k0, row_base);
    if (DOC && k0 < warp_start1) mask_doc_rows(p, k0, row_start, 0.f);
    if constexpr (CAP) {
      dscores_capped(dp, p);  // dS = P * dp
    } else {
      frag_zero(dp);
      mma_rows_rows<D, kDqBC>(dp, sdo, warp * 16, sv(st));  // dP = dO V^T
      dscores_rows(dp, p, row_delta);
    }
    uint32_t dsa[kDqBC / 16][4];
    frag_to_a(dsa, dp);
    mma_regs_trans<D, kDqBC>(dqa, dsa, sk(st));  // dQ += dS K
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + r * 8;
    if (row >= s.T) continue;
    store_row(dq + (static_cast<int64_t>(b) * s.T + row) * ldq + h * D, dqa, r, s.scale);
  }
}

// ---------------------------------------------------------------- launch

AttnShape shape_make(int64_t B, int64_t T, int64_t H, int64_t G, int64_t D, int64_t window, float softcap,
                     const char* where) {
  RT_CHECK(D == 64 || D == 96 || D == 128 || D == 256, "[cuda ", where, "] head_dim must be 64, 96, 128 or 256, got ",
           D);
  RT_CHECK(H > 0 && G > 0 && H % G == 0, "[cuda ", where, "] heads H=", H, " must be a multiple of kv heads G=", G);
  // grids are (B*H or B*G, T / 64-row tiles): gridDim.y <= 65535
  RT_CHECK(B > 0 && T > 0 && T <= int64_t{65535} * 64 && B * H < (int64_t{1} << 31), "[cuda ", where,
           "] shape out of range: B=", B, " T=", T, " (at most ", int64_t{65535} * 64, ") H=", H);
  RT_CHECK(window >= 0, "[cuda ", where, "] window ", window, " must be >= 0 (0: none)");
  RT_CHECK(softcap >= 0.f && std::isfinite(softcap), "[cuda ", where, "] softcap ", softcap,
           " must be finite and >= 0 (0: none)");
  AttnShape s{};
  s.T = static_cast<int>(T);
  s.H = static_cast<int>(H);
  s.G = static_cast<int>(G);
  s.group = static_cast<int>(H / G);
  s.window = window < T ? static_cast<int>(window) : 0;  // a window of at least T masks nothing
  s.scale = 1.f / sqrtf(static_cast<float>(D));
  s.scale_log2 = s.scale * kLog2e;
  if (softcap > 0.f) {  // raw-score units (shape.h): K = softcap / scale
    const double K = static_cast<double>(softcap) * std::sqrt(static_cast<double>(D));
    s.cap_k = static_cast<float>(K);
    s.cap_m2k = static_cast<float>(-2.0 * K);
    s.cap_a2 = static_cast<float>(2.0 * 1.4426950408889634 / K);
    s.cap_inv_k = static_cast<float>(1.0 / K);
  }
  return s;
}

// Calls f(std::integral_constant<int, D>) for a head_dim shape_make accepted.
template <class F>
void head_dim_dispatch(int64_t D, F&& f) {
  switch (D) {
    case 64:
      f(std::integral_constant<int, 64>{});
      return;
    case 96:
      f(std::integral_constant<int, 96>{});
      return;
    case 128:
      f(std::integral_constant<int, 128>{});
      return;
    case 256:
      f(std::integral_constant<int, 256>{});
      return;
  }
  fail("[cuda attention] head_dim ", D, " has no kernels");
}

template <int D, int ROWS, bool CAP>
void forward_launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, AttnShape s,
                    const int32_t* doc, const bf16* sinks, cudaStream_t stream) {
  using C = FwdCfg<D>;
  smem_allow(attention_forward_kernel<D, ROWS, CAP>, C::SMEM);
  dim3 grid(static_cast<unsigned>(B * s.H), static_cast<unsigned>(detail::ceil_div(s.T, C::BR)));
  attention_forward_kernel<D, ROWS, CAP><<<grid, 32 * C::WARPS, C::SMEM, stream>>>(out, lse, q, k, v, s, doc, sinks);
  CUDA_CHECK_LAUNCH();
}

// delta[b,h,t] = rowsum(dO * O), the first step of either backward
void delta_launch(int64_t D, float* delta, const bf16* dout, const bf16* out, int64_t B, AttnShape s,
                  cudaStream_t stream) {
  const int64_t rows = B * s.T * s.H;
  const unsigned blocks = static_cast<unsigned>(detail::ceil_div(rows, 8));
  head_dim_dispatch(D, [&](auto d) {
    attention_delta_kernel<decltype(d)::value><<<blocks, 256, 0, stream>>>(delta, dout, out, rows, s.T, s.H);
  });
  CUDA_CHECK_LAUNCH();
}

template <int D, int ROWS, bool CAP>
void backward_launch(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                     const bf16* out, const float* lse, float* delta, int64_t B, AttnShape s, const int32_t* doc,
                     cudaStream_t stream) {
  delta_launch(D, delta, dout, out, B, s, stream);
  using CK = DkdvCfg<D>;
  constexpr int smem_kv = ROWS != kCausal ? CK::SMEM_DOC : CK::SMEM;
  smem_allow(attention_backward_dkdv_kernel<D, ROWS, CAP>, smem_kv);
  dim3 grid_kv(static_cast<unsigned>(B * s.G), static_cast<unsigned>(detail::ceil_div(s.T, CK::BC)), CK::DS);
  attention_backward_dkdv_kernel<D, ROWS, CAP>
      <<<grid_kv, 32 * CK::WARPS, smem_kv, stream>>>(dk, dv, dout, q, k, v, lse, delta, s, doc);
  CUDA_CHECK_LAUNCH();
  using CQ = DqCfg<D>;
  smem_allow(attention_backward_dq_kernel<D, ROWS, CAP>, CQ::SMEM);
  dim3 grid_q(static_cast<unsigned>(B * s.H), static_cast<unsigned>(detail::ceil_div(s.T, CQ::BR)));
  attention_backward_dq_kernel<D, ROWS, CAP>
      <<<grid_q, 32 * CQ::WARPS, CQ::SMEM, stream>>>(dq, dout, q, k, v, lse, delta, s, doc);
  CUDA_CHECK_LAUNCH();
}

void check_ptrs(const char* where, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) detail::check_aligned(p, where);
}

// -1: not chosen yet (read RAMTRAIN_ATTENTION on first use)
std::atomic<int> g_kernels{-1};

AttentionKernels kernels_chosen() {
  int k = g_kernels.load();
  if (k < 0) {
    const char* env = std::getenv("RAMTRAIN_ATTENTION");
    AttentionKernels e = AttentionKernels::automatic;
    if (env && *env) {
      if (std::strcmp(env, "mma") == 0)
        e = AttentionKernels::mma_sync;
      else if (std::strcmp(env, "wgmma") == 0)
        e = AttentionKernels::wgmma;
      else if (std::strcmp(env, "masked") == 0)
        e = AttentionKernels::masked;
      else if (std::strcmp(env, "auto") != 0)
        fail("[cuda attention] RAMTRAIN_ATTENTION=", env, " is not one of auto, mma, wgmma, masked");
    }
    int expected = -1;
    g_kernels.compare_exchange_strong(expected, static_cast<int>(e));
    k = g_kernels.load();
  }
  return static_cast<AttentionKernels>(k);
}

// The wgmma kernels have head_dim 64 and 128 only: other head dims run the
// mma.sync kernels whatever was chosen.
bool wgmma_head_dim(int64_t D) { return D == 64 || D == 128; }

bool use_wgmma(const char* where, int64_t D) {
  if (!wgmma_head_dim(D)) return false;
  const AttentionKernels k = kernels_chosen();
  if (k == AttentionKernels::automatic || k == AttentionKernels::masked) return sm90::device_supported();
  if (k == AttentionKernels::wgmma)
    RT_CHECK(sm90::device_supported(), "[cuda ", where,
             "] the wgmma attention kernels need a GPU of compute capability 9.0 (H100/H200); unset "
             "RAMTRAIN_ATTENTION or set it to mma");
  return k == AttentionKernels::wgmma;
}

// RAMTRAIN_ATTENTION=masked: windows, sinks and the soft cap on the one-warp-per-row fallback
bool masked_on_fallback(int64_t T, int64_t window, const bf16* sinks, float softcap) {
  return ((window > 0 && window < T) || sinks || softcap > 0.f) && kernels_chosen() == AttentionKernels::masked;
}

}  // namespace

void set_attention_kernels(AttentionKernels k) { g_kernels.store(static_cast<int>(k)); }

AttentionKernels attention_kernels_in_use(int64_t D, float softcap) {
  const AttentionKernels k = kernels_chosen();
  if (softcap > 0.f && k == AttentionKernels::masked) return AttentionKernels::masked;
  if (!wgmma_head_dim(D)) return AttentionKernels::mma_sync;
  if (k != AttentionKernels::automatic && k != AttentionKernels::masked) return k;
  return sm90::device_supported() ? AttentionKernels::wgmma : AttentionKernels::mma_sync;
}

const char* attention_kernels_name(AttentionKernels k) {
  switch (k) {
    case AttentionKernels::automatic:
      return "automatic";
    case AttentionKernels::mma_sync:
      return "mma_sync";
    case AttentionKernels::wgmma:
      return "wgmma";
    case AttentionKernels::masked:
      return "masked";
  }
  return "?";
}

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T,
                       int64_t H, int64_t G, int64_t D, cudaStream_t stream, const int32_t* doc_start, int64_t window,
                       const bf16* sinks, float softcap) {
  const AttnShape s = shape_make(B, T, H, G, D, window, softcap, "attention_forward");
  check_ptrs("attention_forward", {out, q, k, v});
  if (masked_on_fallback(T, window, sinks, softcap)) {
    attention_masked_forward(out, lse, q, k, v, B, T, H, G, D, window, softcap, stream, doc_start, sinks);
    return;
  }
  if (use_wgmma("attention_forward", D)) {
    sm90::attention_forward(out, lse, q, k, v, B, s, D, stream, doc_start, sinks);
    return;
  }
  head_dim_dispatch(D, [&](auto d) {
    rows_dispatch(doc_start, s, [&](auto rows) {
      cap_dispatch(s, [&](auto cap) {
        forward_launch<decltype(d)::value, decltype(rows)::value, decltype(cap)::value>(out, lse, q, k, v, B, s,
                                                                                        doc_start, sinks, stream);
      });
    });
  });
}

size_t attention_backward_scratch_bytes(int64_t B, int64_t T, int64_t H) {
  return static_cast<size_t>(B * H * T) * sizeof(float);
}

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                        Scratch scratch, cudaStream_t stream, const int32_t* doc_start, int64_t window,
                        const bf16* sinks, float* dsinks, float softcap) {
  RT_CHECK(!dsinks || sinks, "[cuda attention_backward] a sink gradient without sinks");
  const AttnShape s = shape_make(B, T, H, G, D, window, softcap, "attention_backward");
  check_ptrs("attention_backward", {dq, dk, dv, dout, q, k, v, out});
  if (masked_on_fallback(T, window, sinks, softcap)) {
    attention_masked_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, G, D, window, softcap, scratch, stream,
                              doc_start, sinks, dsinks);
    return;
  }
  const size_t need = attention_backward_scratch_bytes(B, T, H);
  RT_CHECK(scratch.bytes >= need, "[cuda attention_backward] scratch has ", scratch.bytes, " bytes, needs ", need,
           " (attention_backward_scratch_bytes)");
  float* delta = static_cast<float*>(scratch.ptr);
  if (use_wgmma("attention_backward", D)) {
    delta_launch(D, delta, dout, out, B, s, stream);
    sm90::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, B, s, D, stream, doc_start);
  } else {
    head_dim_dispatch(D, [&](auto d) {
      rows_dispatch(doc_start, s, [&](auto rows) {
        cap_dispatch(s, [&](auto cap) {
          backward_launch<decltype(d)::value, decltype(rows)::value, decltype(cap)::value>(
              dq, dk, dv, dout, q, k, v, out, lse, delta, B, s, doc_start, stream);
        });
      });
    });
  }
  // the forward folded the sinks into lse and out (softmax_row_finish): dq, dk, dv need nothing more
  if (dsinks) attention_sink_grad(dsinks, sinks, lse, delta, B, H, T, stream);
}

}  // namespace rt::cuda
