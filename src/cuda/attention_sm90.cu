// Causal GQA attention for Hopper (compute capability 9.0, built for sm_90a
// only): the same maths and outputs as the mma.sync kernels of attention.cu,
// with the tiles moved by the Tensor Memory Accelerator and multiplied by
// warpgroup MMAs (wgmma), FlashAttention-3 style.
//
// Every kernel is warp-specialised: warpgroup 0 is the producer (one thread
// issues the TMA copies; the warpgroup gives most of its registers away with
// setmaxnreg), warpgroups 1 and 2 are consumers with 240 registers each. Tiles
// move through a ring of shared-memory stages, each with a "full" mbarrier (the
// TMA completes its byte count) and an "empty" mbarrier (each of the 8
// consumer warps arrives once it no longer reads the stage), so the two
// consumer warpgroups run at their own pace: one's softmax overlaps the
// other's GEMMs.
//
// Shared-memory tiles are [rows][D] bf16 in the canonical 128-byte-swizzle
// layout of wgmma: D/64 column blocks of rows x 128 bytes, 16-byte chunk c of
// row r stored at chunk c ^ (r & 7). The TMA writes exactly this (a box of 64
// elements x rows with CU_TENSOR_MAP_SWIZZLE_128B per column block). A tile is
// read K-major (k = d contiguous: Q K^T, dO V^T, K Q^T, V dO^T) or MN-major
// (the tile's rows are the k dimension: P V, P^T dO, dS^T Q, dS K).
//
// forward:  block = 128 query rows of one head (64 per consumer), 128-key
//           tiles up to the diagonal, online softmax in fp32 (raw-score max,
//           one FFMA + ex2.approx.ftz per element, as in attention.cu).
// dK/dV:    block = 128 keys of one kv head (64 per consumer); loops over the
//           query heads of the group and the 64-row query tiles at or after
//           the diagonal; dK, dV stay in registers (fixed order, no atomics).
// dQ:       block = 128 query rows of one head (64 per consumer); 64-key tiles;
//           dQ in registers.
// delta = rowsum(dO * O) comes from attention.cu's kernel. Deterministic: no
// atomics, a fixed reduction order. Sliding windows and packed documents run
// the DOC code paths (ROWS: attention.cu's header); sinks join the forward's
// last step (softmax_row_finish).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <mutex>

#include "cuda/attention/epilogue.cuh"
#include "cuda/attention/mask.cuh"
#include "cuda/attention/sm90_primitives.cuh"
#include "cuda/attention/softmax.cuh"
#include "cuda/attention/utils.cuh"
#include "cuda/attention_sm90.h"
#include "cuda/check.h"
#include "cuda/kernel_util.cuh"

namespace rt::cuda::sm90 {
namespace {

using namespace attn;

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RT_SM90_DEVICE 1
#endif

// ---------------------------------------------------------------- forward

template <int D>
struct Fwd {
  static constexpr int BM = 128, BN = 128, S = 2;
  static constexpr int Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr int BAR_OFF = Q_BYTES + S * 2 * KV_BYTES;
  static constexpr int SMEM = 1024 + BAR_OFF + Bars<S>::kBytes;
};

// DOC: rows with a first key (packed documents doc [B,T], see ops.h, and/or a
// sliding window: row_first_key), as in attention.cu: key tiles before the
// block's first row's start skipped, keys before a row's start masked. CAP:
// Gemma 2's soft cap on the scores before the masks (softcap_scores).
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(kThreads, 1)
    forward_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                   const __grid_constant__ CUtensorMap tv, bf16* __restrict__ out, float* __restrict__ lse, AttnShape s,
                   const int32_t* __restrict__ doc, const bf16* __restrict__ sinks) {
#ifdef RT_SM90_DEVICE
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = Fwd<D>;
  const uint32_t base = smem_base_1k();
  const uint32_t sq = base;
  auto sk = [&](int st) { return base + static_cast<uint32_t>(C::Q_BYTES + st * 2 * C::KV_BYTES); };
  auto sv = [&](int st) { return sk(st) + static_cast<uint32_t>(C::KV_BYTES); };
  const Bars<C::S> bar{base + C::BAR_OFF};

  // grid (B*H, query blocks), x fastest: every head's heaviest (last) query block first
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.group;
  const int q0 = qb * C::BM;
  const int n_tiles = (min(s.T, q0 + C::BM) - 1) / C::BN + 1;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  const int j0 = DOC ? row_first_key<ROWS>(docb, q0, s.window) / C::BN : 0;  // first key tile any row of the block sees
  if (threadIdx.x == 0) bar.init();
  __syncthreads();

  if (threadIdx.x < 128) {  // producer warpgroup
    regs_shrink<24>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar.once(), C::Q_BYTES);
      for (int c = 0; c < D / 64; ++c) tma_load(sq + c * C::BM * 128, &tq, bar.once(), c * 64, h, q0, b);
      produce_kv_tiles<C, D>(bar, sk, &tk, &tv, g, b, j0, n_tiles);
    }
    return;
  }
  regs_grow<240>();
  const int w = threadIdx.x / 128 - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int wrow0 = q0 + 64 * w;                         // first query row of this warpgroup
  const int row_base = wrow0 + 16 * warp + (lane >> 2);  // this thread's rows: row_base, row_base + 8
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float sc[C::BN / 2];
  // DOC: this thread's rows' document starts, and the warpgroup's first and last
  int row_start[2] = {}, wg_start0 = 0, wg_start1 = 0;
  if constexpr (DOC) {
    row_start[0] = row_first_key<ROWS>(docb, min(row_base, s.T - 1), s.window);
    row_start[1] = row_first_key<ROWS>(docb, min(row_base + 8, s.T - 1), s.window);
    wg_start0 = row_first_key<ROWS>(docb, min(wrow0, s.T - 1), s.window);
    wg_start1 = row_first_key<ROWS>(docb, min(wrow0 + 63, s.T - 1), s.window);
  }
  mbar_wait(bar.once(), 0);

  for (int j = j0; j < n_tiles; ++j) {
    const int st = (j - j0) % C::S;
    mbar_wait(bar.full(st), ((j - j0) / C::S) & 1);
    const int k0 = j * C::BN;
    // else every key of the tile is after every row of this warpgroup (or, DOC, before every row's document)
    if (k0 <= wrow0 + 63 && (!DOC || k0 + C::BN > wg_start0)) {
      wgmma_fence();
      gemm_ss<C::BN, D, C::BM>(sc, sq, 64 * w, sk(st));
      wgmma_wait<0>();
      reg_fence(sc);
      if constexpr (CAP) softcap_scores(sc, s);
      if (k0 + C::BN - 1 > wrow0) mask_causal_scores(sc, k0, row_base);  // the diagonal tile
      if (DOC && k0 < wg_start1) mask_doc_rows(sc, k0, row_start, -INFINITY);
      softmax_online(sc, o, m, l, s.scale_log2);
      uint32_t pa[C::BN / 16][4];
      frag_to_a(pa, sc);
      gemm_rs<D, C::BN>(o, pa, sv(st));
      wgmma_wait<0>();
      reg_fence(o);
    }
    release_stage(bar.empty(st));
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float t = softmax_row_sum(l[r]);
    const int row = row_base + 8 * r;
    if (row < s.T) {
      float row_lse;
      const float f = softmax_row_finish(m[r], t, s.scale, sinks, h, row_lse);
      store_row(out + ((static_cast<int64_t>(b) * s.T + row) * s.H + h) * D, o, r, f);
      if ((lane & 3) == 0) lse[static_cast<int64_t>(bh) * s.T + row] = row_lse;
    }
  }
#endif
}

// ---------------------------------------------------------------- dK, dV

template <int D, bool DOC = false>
struct Dkdv {
  static constexpr int BN = 128, BM = 64, S = D == 128 ? 3 : 4;  // BN keys per block, BM query rows per tile
  static constexpr int KV_BYTES = BN * D * 2, QT_BYTES = BM * D * 2;
  static constexpr int ROW_OFF = 2 * KV_BYTES + S * 2 * QT_BYTES;  // [S][lse*log2e, delta][BM] fp32
  static constexpr int DOC_OFF = ROW_OFF + S * 2 * BM * 4;         // DOC: [S][document start][BM] int32
  static constexpr int BAR_OFF = DOC_OFF + (DOC ? S * BM * 4 : 0);
  static constexpr int SMEM = 1024 + BAR_OFF + Bars<S>::kBytes;
};

// DOC: packed documents (doc [B,T]): query tiles after the last row that sees a
// key of the block skipped, queries of other documents masked. CAP: the soft
// cap; the factor 1 - tanh^2 needs z' and dP^T together, so both products are
// awaited before P replaces z' (softcap_dp_cols; the dV product then no
// longer overlaps dP^T's).
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(kThreads, 1)
    dkdv_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo,
                const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, bf16* __restrict__ dk,
                bf16* __restrict__ dv, const float* __restrict__ lse, const float* __restrict__ delta, AttnShape s,
                const int32_t* __restrict__ doc) {
#ifdef RT_SM90_DEVICE
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = Dkdv<D, DOC>;
  const uint32_t base = smem_base_1k();
  const uint32_t sk = base, sv = base + C::KV_BYTES;
  auto sq = [&](int st) { return base + static_cast<uint32_t>(2 * C::KV_BYTES + st * 2 * C::QT_BYTES); };
  auto sdo = [&](int st) { return sq(st) + static_cast<uint32_t>(C::QT_BYTES); };
  const Bars<C::S> bar{base + C::BAR_OFF};

  const int kb = blockIdx.y;  // grid (B*G, key blocks): the first key blocks (most query tiles) start first
  const int bg = blockIdx.x, b = bg / s.G, g = bg % s.G;
  const int key0 = kb * C::BN;
  const int i_start = key0 / C::BM;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  // DOC: query rows from t_end on belong to documents that start after this block's last key
  const int t_end = DOC ? doc_rows_end<ROWS>(docb, s.window, key0, s.T, min(key0 + C::BN, s.T) - 1) : s.T;
  const int n_i = (t_end + C::BM - 1) / C::BM - i_start;
  const int n_iter = s.group * n_i;
  float* rows = reinterpret_cast<float*>(smem_aligned() + C::ROW_OFF);  // stage st: lse at 2*BM*st, delta after
  int* starts = reinterpret_cast<int*>(smem_aligned() + C::DOC_OFF);    // DOC: stage st at BM*st
  if (threadIdx.x == 0) bar.init(1 + 32);
  __syncthreads();

  if (threadIdx.x < 128) {
    regs_shrink<24>();
    if (threadIdx.x >= 32 && threadIdx.x < 64) {  // warp 1: each query tile's lse (log2 units) and delta
      const int ln = threadIdx.x - 32;
      for (int it = 0; it < n_iter; ++it) {
        const int st = it % C::S, use = it / C::S;
        if (use > 0) mbar_wait(bar.empty(st), (use - 1) & 1);
        const int h = g * s.group + it / n_i, qr0 = (i_start + it % n_i) * C::BM;
        const int64_t lo = (static_cast<int64_t>(b) * s.H + h) * s.T;
        for (int i = ln; i < C::BM; i += 32) {
          const int q = qr0 + i;
          rows[2 * C::BM * st + i] = q < s.T ? lse[lo + q] * kLog2e : INFINITY;  // rows past T: P = 0
          rows[2 * C::BM * st + C::BM + i] = q < s.T ? delta[lo + q] : 0.f;
          if constexpr (DOC) starts[C::BM * st + i] = q < s.T ? row_first_key<ROWS>(docb, q, s.window) : 0;
        }
        mbar_arrive(bar.full(st));  // release: the stores above are seen by whoever waits on full
      }
    }
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar.once(), 2 * C::KV_BYTES);
      for (int c = 0; c < D / 64; ++c) {
        tma_load(sk + c * C::BN * 128, &tk, bar.once(), c * 64, g, key0, b);
        tma_load(sv + c * C::BN * 128, &tv, bar.once(), c * 64, g, key0, b);
      }
      for (int it = 0; it < n_iter; ++it) {
        const int st = it % C::S, use = it / C::S;
        if (use > 0) mbar_wait(bar.empty(st), (use - 1) & 1);
        mbar_arrive_expect_tx(bar.full(st), 2 * C::QT_BYTES);
        const int h = g * s.group + it / n_i, qr0 = (i_start + it % n_i) * C::BM;
        for (int c = 0; c < D / 64; ++c) {
          tma_load(sq(st) + c * C::BM * 128, &tq, bar.full(st), c * 64, h, qr0, b);
          tma_load(sdo(st) + c * C::BM * 128, &tdo, bar.full(st), c * 64, h, qr0, b);
        }
      }
    }
    return;
  }
  regs_grow<240>();
  const int w = threadIdx.x / 128 - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int wkey0 = key0 + 64 * w;                   // first key of this warpgroup
  const int krow = wkey0 + 16 * warp + (lane >> 2);  // this thread's keys: krow, krow + 8
  float dka[D / 2], dva[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dka[i] = dva[i] = 0.f;
  float pt[C::BM / 2], dpt[C::BM / 2];
  mbar_wait(bar.once(), 0);

  for (int it = 0; it < n_iter; ++it) {
    const int st = it % C::S;
    const int qr0 = (i_start + it % n_i) * C::BM;
    mbar_wait(bar.full(st), (it / C::S) & 1);
    // else every query of the tile is before every key here (or, DOC, in a later document): P = 0
    if (qr0 + C::BM - 1 >= wkey0 && (!DOC || starts[C::BM * st] <= wkey0 + 63)) {
      wgmma_fence();
      gemm_ss<C::BM, D, C::BN>(pt, sk, 64 * w, sq(st));    // S^T = K_w Q^T
      gemm_ss<C::BM, D, C::BN>(dpt, sv, 64 * w, sdo(st));  // dP^T = V_w dO^T
      const float* lsc = rows + 2 * C::BM * st;            // the tile's lse * log2(e)
      const float* dl = lsc + C::BM;
      wgmma_wait<1>();
      reg_fence(pt);
      if constexpr (CAP) {  // S^T capped; dpt = (dP^T - delta) (1 - tanh^2)
        wgmma_wait<0>();
        reg_fence(dpt);
        softcap_scores(pt, s);
        softcap_dp_cols(dpt, pt, dl, s.cap_inv_k);
      }
      const bool need_mask = qr0 < wkey0 + 63;
      probs_cols(pt, s.scale_log2, lsc, need_mask, qr0, krow);
      // DOC: the tile's last row starts its document after this warp's first key
      if (DOC && starts[C::BM * st + min(C::BM, s.T - qr0) - 1] > wkey0 + 16 * warp)
        mask_doc_cols(pt, starts + C::BM * st, krow);
      uint32_t pa[C::BM / 16][4];
      frag_to_a(pa, pt);
      gemm_rs<D, C::BM>(dva, pa, sdo(st));  // dV += P^T dO
      wgmma_wait<1>();                      // dP^T
      reg_fence(dpt);
      if constexpr (CAP)
        dscores_capped(dpt, pt);  // dS^T = P^T * dpt
      else
        dscores_cols(dpt, pt, dl);
      uint32_t da[C::BM / 16][4];
      frag_to_a(da, dpt);
      gemm_rs<D, C::BM>(dka, da, sq(st));  // dK += dS^T Q
      wgmma_wait<0>();
      reg_fence(dva);
      reg_fence(dka);
    }
    release_stage(bar.empty(st));
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = krow + 8 * r;
    if (key >= s.T) continue;
    const int64_t off = ((static_cast<int64_t>(b) * s.T + key) * s.G + g) * D;
    store_row(dk + off, dka, r, s.scale);
    store_row(dv + off, dva, r, 1.f);
  }
#endif
}

// ---------------------------------------------------------------- dQ

template <int D>
struct Dq {
  static constexpr int BM = 128, BN = 64, S = D == 128 ? 3 : 4;  // BM query rows per block, BN keys per tile
  static constexpr int Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr int BAR_OFF = 2 * Q_BYTES + S * 2 * KV_BYTES;
  static constexpr int SMEM = 1024 + BAR_OFF + Bars<S>::kBytes;
};

// DOC: packed documents (doc [B,T]), as in the forward.
// CAP: as in dK/dV (both products awaited first).
template <int D, int ROWS, bool CAP>
__global__ void __launch_bounds__(kThreads, 1)
    dq_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tdo,
              const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, bf16* __restrict__ dq,
              const float* __restrict__ lse, const float* __restrict__ delta, AttnShape s,
              const int32_t* __restrict__ doc) {
#ifdef RT_SM90_DEVICE
  constexpr bool DOC = ROWS != kCausal;  // rows with a first key
  using C = Dq<D>;
  const uint32_t base = smem_base_1k();
  const uint32_t sq = base, sdo = base + C::Q_BYTES;
  auto sk = [&](int st) { return base + static_cast<uint32_t>(2 * C::Q_BYTES + st * 2 * C::KV_BYTES); };
  auto sv = [&](int st) { return sk(st) + static_cast<uint32_t>(C::KV_BYTES); };
  const Bars<C::S> bar{base + C::BAR_OFF};

  const int qb = gridDim.y - 1 - blockIdx.y;  // heaviest first, as in the forward
  const int bh = blockIdx.x, b = bh / s.H, h = bh % s.H, g = h / s.group;
  const int q0 = qb * C::BM;
  const int n_tiles = (min(s.T, q0 + C::BM) - 1) / C::BN + 1;
  const int32_t* docb = DOC && (ROWS == kDocs || doc) ? doc + static_cast<int64_t>(b) * s.T : nullptr;
  const int j0 = DOC ? row_first_key<ROWS>(docb, q0, s.window) / C::BN : 0;  // first key tile any row of the block sees
  if (threadIdx.x == 0) bar.init();
  __syncthreads();

  if (threadIdx.x < 128) {
    regs_shrink<24>();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar.once(), 2 * C::Q_BYTES);
      for (int c = 0; c < D / 64; ++c) {
        tma_load(sq + c * C::BM * 128, &tq, bar.once(), c * 64, h, q0, b);
        tma_load(sdo + c * C::BM * 128, &tdo, bar.once(), c * 64, h, q0, b);
      }
      produce_kv_tiles<C, D>(bar, sk, &tk, &tv, g, b, j0, n_tiles);
    }
    return;
  }
  regs_grow<240>();
  const int w = threadIdx.x / 128 - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int wrow0 = q0 + 64 * w;
  const int row_base = wrow0 + 16 * warp + (lane >> 2);  // rows row_base, row_base + 8
  float row_lse[2], row_delta[2];
  row_stats_load(row_lse, row_delta, lse, delta, bh, row_base, s.T);
  float dqa[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dqa[i] = 0.f;
  float p[C::BN / 2], dp[C::BN / 2];
  // DOC: this thread's rows' document starts, and the warpgroup's first and last
  int row_start[2] = {}, wg_start0 = 0, wg_start1 = 0;
  if constexpr (DOC) {
    row_start[0] = row_first_key<ROWS>(docb, min(row_base, s.T - 1), s.window);
    row_start[1] = row_first_key<ROWS>(docb, min(row_base + 8, s.T - 1), s.window);
    wg_start0 = row_first_key<ROWS>(docb, min(wrow0, s.T - 1), s.window);
    wg_start1 = row_first_key<ROWS>(docb, min(wrow0 + 63, s.T - 1), s.window);
  }
  mbar_wait(bar.once(), 0);

  for (int j = j0; j < n_tiles; ++j) {
    const int st = (j - j0) % C::S;
    mbar_wait(bar.full(st), ((j - j0) / C::S) & 1);
    const int k0 = j * C::BN;
    // else every key of the tile is after every row of this warpgroup (or, DOC, before every row's document)
    if (k0 <= wrow0 + 63 && (!DOC || k0 + C::BN > wg_start0)) {
      wgmma_fence();
      gemm_ss<C::BN, D, C::BM>(p, sq, 64 * w, sk(st));    // S = Q_w K^T
      gemm_ss<C::BN, D, C::BM>(dp, sdo, 64 * w, sv(st));  // dP = dO_w V^T
      wgmma_wait<1>();
      reg_fence(p);
      if constexpr (CAP) {  // S capped; dp = (dP - delta) (1 - tanh^2)
        wgmma_wait<0>();
        reg_fence(dp);
        softcap_scores(p, s);
        softcap_dp_rows(dp, p, row_delta, s.cap_inv_k);
      }
      const bool need_mask = k0 + C::BN - 1 > wrow0;
      probs_rows(p, s.scale_log2, row_lse, need_mask, k0, row_base);
      if (DOC && k0 < wg_start1) mask_doc_rows(p, k0, row_start, 0.f);
      wgmma_wait<0>();
      reg_fence(dp);
      if constexpr (CAP)
        dscores_capped(dp, p);  // dS = P * dp
      else
        dscores_rows(dp, p, row_delta);
      uint32_t da[C::BN / 16][4];
      frag_to_a(da, dp);
      gemm_rs<D, C::BN>(dqa, da, sk(st));  // dQ += dS K
      wgmma_wait<0>();
      reg_fence(dqa);
    }
    release_stage(bar.empty(st));
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    if (row >= s.T) continue;
    store_row(dq + ((static_cast<int64_t>(b) * s.T + row) * s.H + h) * D, dqa, r, s.scale);
  }
#endif
}

// ---------------------------------------------------------------- host side

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    cudaGetLastError();
  });
  RT_CHECK(fn != nullptr,
           "[cuda attention] the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver); set "
           "RAMTRAIN_ATTENTION=mma to use the mma.sync kernels");
  return fn;
}

// [B, T, heads, D] bf16 as a 4-D tensor map (d, head, t, b); boxes of 64 d x `rows` t with the
// 128-byte swizzle. Rows past T read as zeros.
CUtensorMap tensor_map(const bf16* p, int64_t B, int64_t T, int64_t heads, int64_t D, int rows, const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(D * 2), static_cast<cuuint64_t>(heads * D * 2),
                                 static_cast<cuuint64_t>(T * heads * D * 2)};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<bf16*>(p), dims, strides, box,
                                 elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RT_CHECK(r == CUDA_SUCCESS, "[cuda attention] cuTensorMapEncodeTiled failed for ", what, " (error ",
           static_cast<int>(r), ", B=", B, " T=", T, " heads=", heads, " D=", D, ")");
  return map;
}

template <int D, int ROWS, bool CAP>
void forward_launch(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, const AttnShape& s,
                    const int32_t* doc, const bf16* sinks, cudaStream_t stream) {
  using C = Fwd<D>;
  const int64_t T = s.T, H = s.H, G = s.G;
  const CUtensorMap tq = tensor_map(q, B, T, H, D, C::BM, "q"), tk = tensor_map(k, B, T, G, D, C::BN, "k"),
                    tv = tensor_map(v, B, T, G, D, C::BN, "v");
  smem_allow(forward_kernel<D, ROWS, CAP>, C::SMEM);
  const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>(detail::ceil_div(T, C::BM)));
  forward_kernel<D, ROWS, CAP><<<grid, kThreads, C::SMEM, stream>>>(tq, tk, tv, out, lse, s, doc, sinks);
  CUDA_CHECK_LAUNCH();
}

template <int D, int ROWS, bool CAP>
void backward_launch(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                     const float* lse, const float* delta, int64_t B, const AttnShape& s, const int32_t* doc,
                     cudaStream_t stream) {
  const int64_t T = s.T, H = s.H, G = s.G;
  {
    using C = Dkdv<D, ROWS != kCausal>;
    const CUtensorMap tq = tensor_map(q, B, T, H, D, C::BM, "q"), tdo = tensor_map(dout, B, T, H, D, C::BM, "dout"),
                      tk = tensor_map(k, B, T, G, D, C::BN, "k"), tv = tensor_map(v, B, T, G, D, C::BN, "v");
    smem_allow(dkdv_kernel<D, ROWS, CAP>, C::SMEM);
    const dim3 grid(static_cast<unsigned>(B * G), static_cast<unsigned>(detail::ceil_div(T, C::BN)));
    dkdv_kernel<D, ROWS, CAP><<<grid, kThreads, C::SMEM, stream>>>(tq, tdo, tk, tv, dk, dv, lse, delta, s, doc);
    CUDA_CHECK_LAUNCH();
  }
  {
    using C = Dq<D>;
    const CUtensorMap tq = tensor_map(q, B, T, H, D, C::BM, "q"), tdo = tensor_map(dout, B, T, H, D, C::BM, "dout"),
                      tk = tensor_map(k, B, T, G, D, C::BN, "k"), tv = tensor_map(v, B, T, G, D, C::BN, "v");
    smem_allow(dq_kernel<D, ROWS, CAP>, C::SMEM);
    const dim3 grid(static_cast<unsigned>(B * H), static_cast<unsigned>(detail::ceil_div(T, C::BM)));
    dq_kernel<D, ROWS, CAP><<<grid, kThreads, C::SMEM, stream>>>(tq, tdo, tk, tv, dq, lse, delta, s, doc);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool device_supported() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  // per device, asked once: every attention call comes here (0 unknown, 1 no, 2 yes)
  static std::atomic<int> known[64];
  if (dev >= 0 && dev < 64 && known[dev].load() != 0) return known[dev].load() == 2;
  int major = 0, minor = 0;
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!ok) cudaGetLastError();
  ok = ok && major == 9 && minor == 0;  // sm_90a code runs on compute capability 9.0 only
  if (dev >= 0 && dev < 64) known[dev].store(ok ? 2 : 1);
  return ok;
}

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                       const AttnShape& s, int64_t D, cudaStream_t stream, const int32_t* doc_start,
                       const bf16* sinks) {
  rows_dispatch(doc_start, s, [&](auto rows) {
    cap_dispatch(s, [&](auto cap) {
      constexpr int R = decltype(rows)::value;
      constexpr bool CAP = decltype(cap)::value;
      if (D == 64)
        forward_launch<64, R, CAP>(out, lse, q, k, v, B, s, doc_start, sinks, stream);
      else
        forward_launch<128, R, CAP>(out, lse, q, k, v, B, s, doc_start, sinks, stream);
    });
  });
}

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                        const float* lse, const float* delta, int64_t B, const AttnShape& s, int64_t D,
                        cudaStream_t stream, const int32_t* doc_start) {
  rows_dispatch(doc_start, s, [&](auto rows) {
    cap_dispatch(s, [&](auto cap) {
      constexpr int R = decltype(rows)::value;
      constexpr bool CAP = decltype(cap)::value;
      if (D == 64)
        backward_launch<64, R, CAP>(dq, dk, dv, dout, q, k, v, lse, delta, B, s, doc_start, stream);
      else
        backward_launch<128, R, CAP>(dq, dk, dv, dout, q, k, v, lse, delta, B, s, doc_start, stream);
    });
  });
}

}  // namespace rt::cuda::sm90
