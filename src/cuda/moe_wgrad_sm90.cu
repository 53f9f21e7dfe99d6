// Every expert's weight gradients of one MoE layer call in one launch, for
// Hopper (compute capability 9.0, built for sm_90a only; moe_wgrad_sm90.h is
// the contract, cuda/moe.cu the caller, issue 32).
//
// Why: cuBLAS takes an fp32 += GEMM per expert (OLMoE: 3 x 64 a layer call,
// each a 1024 x 2048 output of 64 tiles of 128 x 256 on 132 SMs, ~14 us),
// and no grouped cuBLAS call takes fp32 outputs. Here one persistent grid
// of #SMs blocks walks every (product, expert, output tile) job in order,
// the tiles of one expert's product next to each other (its operands stay
// in L2), and skips experts without rows; the row counts are read on the
// device (starts), so the host waits for nothing.
//
// A job: out[e][m0:m0+128, n0:n0+BN] += a_e^T b_e over the expert's padded
// rows in 64-row steps. Both operands are the permuted rows, row-major, so
// a stage holds a 64-row slab of a (128 columns) and of b (BN columns),
// copied by the TMA in the 128-byte-swizzle layout (64-column blocks of
// 64 rows x 128 bytes) and read MN-major by wgmma (the rows are k). As the
// attention kernels (attention_sm90.cu): warpgroup 0 produces (one thread
// issues the copies into a ring of S stages with full/empty mbarriers),
// two consumer warpgroups each take 64 rows (of M) of the tile, one
// m64nBNk16 wgmma per 16 rows, accumulating in fp32 registers, and add
// their accumulators to the fp32 gradient once, at the end of the job
// (grad + sum: one rounding; the sum over the rows in a fixed order, so the
// bits never depend on scheduling). The producer runs into the next job
// while the consumers add, so the copies of its first stages overlap; with
// two blocks per SM (RAMTRAIN_MOE_WGRAD_TILE=128x2) one block's epilogue
// also overlaps the other's MMAs.
//
// Padding rows (kMoeChunk's) are zeros in every operand that reaches a
// gradient (cuda/moe.cu: d_o, d_g, d_u and xe), so the 64-row steps over the
// padded rows add exact zeros. Rows and columns of a tile past M or N are
// read as zeros (TMA) and not written.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cuda/attention/sm90_primitives.cuh"
#include "cuda/check.h"
#include "cuda/moe_scratch.h"
#include "cuda/moe_wgrad_sm90.h"
#include "cuda/tma_sm90.h"

namespace rt::cuda::sm90 {
namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define RT_SM90_DEVICE 1
#endif

// Thread roles. One block per SM (B 1): a producer warpgroup (threads 0-127; it gives its registers to
// the consumers with setmaxnreg) and 2 consumer warpgroups (128-383). Two blocks per SM (B 2): the 2
// consumer warpgroups (0-255; a warpgroup's first warp must be a multiple of 4) and one producer warp
// (256-287), no setmaxnreg: 288 threads of up to 112 registers, two blocks in the register file.
template <int B>
struct Roles {
  static_assert(B == 1 || B == 2, "one or two blocks per SM");
  static constexpr int kThreads = B == 1 ? 384 : 288;
  static __device__ __forceinline__ bool producer() { return B == 1 ? threadIdx.x < 128 : threadIdx.x >= 256; }
  static __device__ __forceinline__ bool leader() { return threadIdx.x == (B == 1 ? 0 : 256); }  // issues the copies
  static __device__ __forceinline__ int consumer_thread() { return B == 1 ? threadIdx.x - 128 : threadIdx.x; }
};

template <int BN, int S>
struct Cfg {
  static constexpr int BM = 128, BK = 64;  // tile rows (of M), stage rows (of k)
  static constexpr int BLOCK = BK * 128;   // one 64-column block of a stage: 64 rows x 128 bytes
  static constexpr int A_BYTES = 2 * BLOCK, B_BYTES = BN / 64 * BLOCK, STAGE = A_BYTES + B_BYTES;
  static constexpr int BAR_OFF = S * STAGE;
  static constexpr int SMEM = 1024 + BAR_OFF + Bars<S>::kBytes;
};

// The kernel's parameters (CUtensorMap is 64-byte aligned: so is Params; ~13 KB with 512 experts, within
// the 32 KB of kernel parameters CUDA 12.1+ takes).
struct Params {
  CUtensorMap a[kMaxWgradProducts], b[kMaxWgradProducts];  // [P, M] and [P, N], boxes of 64 columns x 64 rows
  float* out[kMaxWgradProducts][kMoeMaxGroupedExperts];
  int M[kMaxWgradProducts], N[kMaxWgradProducts];
  int tiles_n[kMaxWgradProducts], tiles[kMaxWgradProducts];  // tiles along N, in all
  int np, E, tmax;                                           // products, experts, max tiles of a product
};

// TMA: a box of a 2-D tensor map (column c0, row c1) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// clang-format off
#define RT_WG_REGS128                                                                          \
  RT_WG_REGS64                                                                                 \
  ", " RT_WG_R16(64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79)               \
  ", " RT_WG_R16(80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95)               \
  ", " RT_WG_R16(96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111)   \
  ", " RT_WG_R16(112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127)
#define RT_WG_F128(d)                                                                          \
  RT_WG_F64(d), RT_WG_F8(d, 64), RT_WG_F8(d, 72), RT_WG_F8(d, 80), RT_WG_F8(d, 88),            \
      RT_WG_F8(d, 96), RT_WG_F8(d, 104), RT_WG_F8(d, 112), RT_WG_F8(d, 120)
// clang-format on

// d (+)= A(64x16, smem, MN-major) * B(16xN, smem, MN-major), fp32 accumulators, N = 128 or 256.
__device__ __forceinline__ void wgmma_tt(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RT_WG_REGS64 "}, %64, %65, p, 1, 1, 1, 1;\n}\n"
      : RT_WG_F64(d)
      : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmma_tt(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" RT_WG_REGS128 "}, %128, %129, p, 1, 1, 1, 1;\n}\n"
      : RT_WG_F128(d)
      : "l"(a), "l"(b), "r"(1));
}

struct Job {
  int p, e, m0, n0, r0, nk;  // product, expert, tile origin, first row, 64-row steps
};
// Job t of the flat list (product, expert, tile), tiles fastest; false: nothing to do
// (a tile past this product's, or an expert without rows).
template <int BN>
__device__ __forceinline__ bool job_of(int64_t t, const Params& prm, const int32_t* starts, Job* j) {
  const int tile = static_cast<int>(t % prm.tmax);
  const int64_t pe = t / prm.tmax;
  const int e = static_cast<int>(pe % prm.E), p = static_cast<int>(pe / prm.E);
  if (tile >= prm.tiles[p]) return false;
  const int r0 = starts[e], r1 = starts[e + 1];
  if (r1 <= r0) return false;
  j->p = p, j->e = e, j->r0 = r0, j->nk = (r1 - r0) / 64;
  j->m0 = tile / prm.tiles_n[p] * 128, j->n0 = tile % prm.tiles_n[p] * BN;
  return true;
}

// B: blocks per SM (1, or 2 so that one block's epilogue overlaps the other's MMAs; Roles).
template <int BN, int S, int B>
__global__ void __launch_bounds__(Roles<B>::kThreads, B)
    wgrad_kernel(const __grid_constant__ Params prm, const int32_t* __restrict__ starts) {
#ifdef RT_SM90_DEVICE
  using C = Cfg<BN, S>;
  const uint32_t base = smem_base_1k();
  auto sa = [&](int st) { return base + static_cast<uint32_t>(st * C::STAGE); };
  auto sb = [&](int st) { return sa(st) + static_cast<uint32_t>(C::A_BYTES); };
  const Bars<S> bar{base + C::BAR_OFF};
  if (threadIdx.x == 0) bar.init();
  __syncthreads();
  const int64_t total = static_cast<int64_t>(prm.np) * prm.E * prm.tmax;

  using R = Roles<B>;
  if (R::producer()) {
    if constexpr (B == 1) regs_shrink<40>();
    if (R::leader()) {
      uint32_t it = 0;  // stage uses so far, over all jobs (the consumers count the same)
      for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
        Job j;
        if (!job_of<BN>(t, prm, starts, &j)) continue;
        const CUtensorMap *ta = &prm.a[j.p], *tb = &prm.b[j.p];
        for (int i = 0; i < j.nk; ++i, ++it) {
          const int st = static_cast<int>(it % S);
          const uint32_t use = it / S;
          if (use > 0) mbar_wait(bar.empty(st), (use - 1) & 1);
          mbar_arrive_expect_tx(bar.full(st), C::STAGE);
          const int k = j.r0 + i * C::BK;
#pragma unroll
          for (int c = 0; c < 2; ++c) tma_load_2d(sa(st) + c * C::BLOCK, ta, bar.full(st), j.m0 + 64 * c, k);
#pragma unroll
          for (int c = 0; c < BN / 64; ++c) tma_load_2d(sb(st) + c * C::BLOCK, tb, bar.full(st), j.n0 + 64 * c, k);
        }
      }
    }
    return;
  }
  if constexpr (B == 1) regs_grow<232>();
  const int ct = R::consumer_thread(), w = ct / 128, warp = (ct >> 5) & 3, lane = ct & 31;
  uint32_t it = 0;
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    Job j;
    if (!job_of<BN>(t, prm, starts, &j)) continue;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    reg_fence(acc);
    for (int i = 0; i < j.nk; ++i, ++it) {
      const int st = static_cast<int>(it % S);
      mbar_wait(bar.full(st), (it / S) & 1);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C::BK / 16; ++kk)  // 16 rows (k) a step: +16 x 128 bytes in every block
        wgmma_tt(acc, desc_make(sa(st) + w * C::BLOCK + kk * 2048, C::BLOCK, 1024),
                 desc_make(sb(st) + kk * 2048, C::BLOCK, 1024));
      wgmma_commit();
      wgmma_wait<1>();  // the previous step's group is done: its stage is free
      if (i > 0) release_stage(bar.empty(static_cast<int>((it - 1) % S)));
    }
    wgmma_wait<0>();
    reg_fence(acc);
    release_stage(bar.empty(static_cast<int>((it - 1) % S)));
    // out += acc: rows m0 + 64 w + 16 warp + lane / 4 (+ 8), columns n0 + 8 jn + 2 (lane % 4) (+ 1). In
    // chunks of JC column groups, all loads of a chunk before its stores: the compiler cannot move a load
    // above a store to the same array, and one load, add and store at a time would wait on memory 2 BN / 8
    // times per job (measured: 5.3 ms a call at OLMoE's shape, 3.7x the chunked estimate).
    float* out = prm.out[j.p][j.e];
    const int M = prm.M[j.p], N = prm.N[j.p];
    const int row0 = j.m0 + 64 * w + 16 * warp + (lane >> 2), col0 = j.n0 + 2 * (lane & 3);
    constexpr int JC = B == 1 ? 8 : 4;  // B 2: fewer registers
#pragma unroll
    for (int c0 = 0; c0 < BN / 8; c0 += JC) {
      float2 v[2][JC];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int jn = 0; jn < JC; ++jn) {
          const int row = row0 + 8 * h, col = col0 + 8 * (c0 + jn);  // N is even: col + 1 < N when col < N
          v[h][jn] = row < M && col < N ? *reinterpret_cast<const float2*>(out + static_cast<int64_t>(row) * N + col)
                                        : make_float2(0.f, 0.f);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int jn = 0; jn < JC; ++jn) {
          const int row = row0 + 8 * h, col = col0 + 8 * (c0 + jn);
          if (row >= M || col >= N) continue;
          v[h][jn].x += acc[4 * (c0 + jn) + 2 * h];
          v[h][jn].y += acc[4 * (c0 + jn) + 2 * h + 1];
          *reinterpret_cast<float2*>(out + static_cast<int64_t>(row) * N + col) = v[h][jn];
        }
    }
  }
#endif
}

// [rows, cols] bf16 row-major as a 2-D tensor map (column, row); boxes of 64 columns x 64 rows
// with the 128-byte swizzle. Columns past cols read as zeros.
CUtensorMap rows_map(const bf16* p, int64_t rows, int64_t cols, const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols * 2)};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder("cuda moe", "set RAMTRAIN_MOE_WGRAD_KERNEL=0 to use cuBLAS")(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(p), dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RT_CHECK(r == CUDA_SUCCESS, "[cuda moe] cuTensorMapEncodeTiled failed for the weight gradients' ", what, " (error ",
           static_cast<int>(r), ", rows ", rows, ", cols ", cols, ")");
  return map;
}

int sm_count() {
  int dev = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  static std::atomic<int> known[64];  // per device, asked once
  if (dev >= 0 && dev < 64 && known[dev].load() > 0) return known[dev].load();
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < 64) known[dev].store(n);
  return n;
}

template <int BN, int S, int B>
void launch(Params& prm, const WgradProduct* ps, int np, const int32_t* starts, int64_t E, cudaStream_t stream) {
  using C = Cfg<BN, S>;
  static_assert(B * (C::SMEM + 1024) <= 228 * 1024, "the blocks of one SM must fit its shared memory");
  int tmax = 0;
  for (int i = 0; i < np; ++i) {
    prm.tiles_n[i] = static_cast<int>((ps[i].N + BN - 1) / BN);
    prm.tiles[i] = static_cast<int>((ps[i].M + C::BM - 1) / C::BM) * prm.tiles_n[i];
    tmax = std::max(tmax, prm.tiles[i]);
  }
  prm.tmax = tmax;
  const int64_t total = static_cast<int64_t>(np) * E * tmax;
  const int grid = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(B) * sm_count(), total));
  CUDA_CHECK(cudaFuncSetAttribute(wgrad_kernel<BN, S, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  wgrad_kernel<BN, S, B><<<grid, Roles<B>::kThreads, C::SMEM, stream>>>(prm, starts);
  CUDA_CHECK_LAUNCH();
}

// RAMTRAIN_MOE_WGRAD_TILE, a measurement knob: 256 (default: 128 x 256 tiles, 4 stages, one block per
// SM), 128 (128 x 128, 6 stages, one block) or 128x2 (128 x 128, 3 stages, two blocks per SM, so that
// one block's epilogue overlaps the other's MMAs).
enum class TileCfg { w256, w128, w128x2 };
// Read at every call (tests switch it between runs).
TileCfg tile_cfg() {
  const char* v = std::getenv("RAMTRAIN_MOE_WGRAD_TILE");
  if (!v || !*v || std::strcmp(v, "256") == 0) return TileCfg::w256;
  if (std::strcmp(v, "128") == 0) return TileCfg::w128;
  RT_CHECK(std::strcmp(v, "128x2") == 0, "[cuda moe] RAMTRAIN_MOE_WGRAD_TILE=", v,
           ": use 256, 128 or 128x2 (unset: 256)");
  return TileCfg::w128x2;
}

bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace

bool wgrad_shapes_ok(const WgradProduct* ps, int np, int64_t E) {
  if (np < 1 || np > kMaxWgradProducts || E < 1 || E > kMoeMaxGroupedExperts) return false;
  for (int i = 0; i < np; ++i) {
    const WgradProduct& p = ps[i];
    if (p.M <= 0 || p.N <= 0 || p.M % 8 != 0 || p.N % 8 != 0 || p.M > (1 << 24) || p.N > (1 << 24)) return false;
    if (!p.a || !p.b || !p.out || !aligned(p.a, 16) || !aligned(p.b, 16)) return false;
    for (int64_t e = 0; e < E; ++e)
      if (!p.out[e] || !aligned(p.out[e], 8)) return false;
  }
  return true;
}

void moe_weight_grads(const WgradProduct* ps, int np, const int32_t* starts, int64_t E, int64_t P,
                      cudaStream_t stream) {
  RT_CHECK(wgrad_shapes_ok(ps, np, E) && P > 0 && P % 64 == 0,
           "[cuda moe] internal: moe_weight_grads called with shapes it does not take (", np, " products, E ", E,
           ", P ", P, ")");
  Params prm{};
  prm.np = np, prm.E = static_cast<int>(E);
  for (int i = 0; i < np; ++i) {
    prm.a[i] = rows_map(ps[i].a, P, ps[i].M, "rows a");
    prm.b[i] = rows_map(ps[i].b, P, ps[i].N, "rows b");
    prm.M[i] = static_cast<int>(ps[i].M), prm.N[i] = static_cast<int>(ps[i].N);
    for (int64_t e = 0; e < E; ++e) prm.out[i][e] = ps[i].out[e];
  }
  switch (tile_cfg()) {
    case TileCfg::w256:
      launch<256, 4, 1>(prm, ps, np, starts, E, stream);
      break;
    case TileCfg::w128:
      launch<128, 6, 1>(prm, ps, np, starts, E, stream);
      break;
    case TileCfg::w128x2:
      launch<128, 3, 2>(prm, ps, np, starts, E, stream);
      break;
  }
}

}  // namespace rt::cuda::sm90
