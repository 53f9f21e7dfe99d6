// Hopper device primitives of the wgmma attention kernels (attention_sm90.cu):
// mbarriers, TMA tile loads, setmaxnreg, wgmma fences/commits/waits and the
// m64nNk16 MMAs, shared-memory matrix descriptors (128-byte swizzle), the
// stage barriers of a producer/consumer ring and the K/V tile producer loop.
// Internal to the CUDA backend; sm_90a only; include only from
// attention_sm90.cu.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/attention/utils.cuh"

namespace rt::cuda::sm90 {

using namespace attn;

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA transactions.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  } while (!done);
}

// TMA: box of a 4-D tensor map (d, head, t, b) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, uint32_t bar, int d0, int head, int t0,
                                         int b) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(d0), "r"(head), "r"(t0), "r"(b)
      : "memory");
}

template <int R>
__device__ __forceinline__ void regs_grow() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_shrink() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of wgmma registers across the
// wgmma.fence / wait_group around them (the hardware writes them asynchronously).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "matrix descriptor").
__device__ __forceinline__ uint64_t desc_make(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
// K-major operand: rows [row0, row0 + 64 or N) of a ROWS-row tile, k = d in
// [16 ks, 16 ks + 16). 8-row groups are 1024 bytes apart (SBO); within the
// 128-byte swizzle span a k step is +32 bytes, the next 64 d are the next
// column block (ROWS x 128 bytes further).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int ks) {
  return desc_make(tile + static_cast<uint32_t>(row0 * 128 + (ks >> 2) * ROWS * 128 + (ks & 3) * 32), 16, 1024);
}
// MN-major operand: the tile's rows [16 kk, 16 kk + 16) are k, its D columns
// are n. 8-row groups along k are 1024 bytes apart (SBO); 64-column blocks
// along n are ROWS x 128 bytes apart (LBO).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int kk) {
  return desc_make(tile + static_cast<uint32_t>(kk * 16 * 128), ROWS * 128, 1024);
}

// ---- wgmma, m64nNk16, bf16 operands, fp32 accumulators (PTX ISA operand order)
// The accumulators are N/2 "+f" operands per thread, numbered %0.. first; the
// macros spell those lists (16 at a time) so each shape is one asm statement.
#define RT_WG_R16(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p)                                                    \
  "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h ", %" #i ", %" #j ", %" #k ", %" #l ", %" #m \
  ", %" #n ", %" #o ", %" #p
#define RT_WG_REGS32                                              \
  RT_WG_R16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) \
  ", " RT_WG_R16(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
#define RT_WG_REGS64                                                                                          \
  RT_WG_REGS32 ", " RT_WG_R16(32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47) ", " RT_WG_R16( \
      48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
#define RT_WG_F8(d, i)                                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define RT_WG_F32(d) RT_WG_F8(d, 0), RT_WG_F8(d, 8), RT_WG_F8(d, 16), RT_WG_F8(d, 24)
#define RT_WG_F64(d) RT_WG_F32(d), RT_WG_F8(d, 32), RT_WG_F8(d, 40), RT_WG_F8(d, 48), RT_WG_F8(d, 56)

// d[32] (+)= A(64x16, smem, K-major) * B(64x16, smem, K-major)^T; scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" RT_WG_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : RT_WG_F32(d)
      : "l"(a), "l"(b), "r"(scale_d));
}
// d[64] (+)= A(64x16, smem, K-major) * B(128x16, smem, K-major)^T; scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RT_WG_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : RT_WG_F64(d)
      : "l"(a), "l"(b), "r"(scale_d));
}
// d[32] (+)= A(64x16, registers, wgmma A-fragment layout) * B(16x64, smem, MN-major); scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" RT_WG_REGS32
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : RT_WG_F32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
// d[64] (+)= A(64x16, registers, wgmma A-fragment layout) * B(16x128, smem, MN-major); scale_d 0 overwrites d.
__device__ __forceinline__ void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" RT_WG_REGS64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : RT_WG_F64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

template <int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {
  static_assert(N == 64 || N == 128, "wgmma_ss: N must be 64 or 128");
  if constexpr (N == 64)
    wgmma_ss_n64(d, a, b, scale_d);
  else
    wgmma_ss_n128(d, a, b, scale_d);
}
template <int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  static_assert(N == 64 || N == 128, "wgmma_rs: N must be 64 or 128");
  if constexpr (N == 64)
    wgmma_rs_n64(d, a, b, scale_d);
  else
    wgmma_rs_n128(d, a, b, scale_d);
}

// Accumulator layout of an m64nN tile (per thread N/2 floats, warp w of the
// warpgroup holding rows 16w ...): the flat fragment of attention/utils.cuh.
// The A-fragment layout of wgmma's register operand is the mma.sync m16n8k16
// one, so a row of accumulators becomes the A operand (k = its columns) by
// packing pairs to bf16 (frag_to_a).

// One wgmma group: acc[N/2] = A B^T over k = d in [0, D), A = rows [row0, row0 + 64) of the
// K-major tile `ta` (TA rows), B = the N rows of the K-major tile `tb`. The caller fences first.
template <int N, int D, int TA>
__device__ __forceinline__ void gemm_ss(float (&acc)[N / 2], uint32_t ta, int row0, uint32_t tb) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) wgmma_ss<N>(acc, desc_k<TA>(ta, row0, ks), desc_k<N>(tb, 0, ks), ks);
  wgmma_commit();
}
// One wgmma group: acc[D/2] += A B, A = K columns of fragments in registers (acc_to_a), B = the
// K rows of the tile `tb` read MN-major. Fences first (A was just written).
template <int D, int K>
__device__ __forceinline__ void gemm_rs(float (&acc)[D / 2], const uint32_t (&a)[K / 16][4], uint32_t tb) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_rs<D>(acc, a[kk], desc_mn<K>(tb, kk), 1);
  wgmma_commit();
}
// A consumer warp no longer reads stage st: one arrival per warp on its empty barrier.
__device__ __forceinline__ void release_stage(uint32_t empty_bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar_arrive(empty_bar);
}

// Barrier words at the end of a kernel's shared memory: [once][full x S][empty x S].
template <int S>
struct Bars {
  uint32_t base;
  __device__ uint32_t once() const { return base; }
  __device__ uint32_t full(int st) const { return base + 8 + 8 * st; }
  __device__ uint32_t empty(int st) const { return base + 8 + 8 * (S + st); }
  static constexpr int kBytes = 8 * (1 + 2 * S);
  // thread 0: `once` completes on one arrival (+ TMA bytes), `full` on `full_count` arrivals (the
  // TMA thread's, + TMA bytes, and any producer lanes that store into the stage), `empty` on the 8
  // consumer warps
  __device__ void init(int full_count = 1) const {
    mbar_init(once(), 1);
    for (int st = 0; st < S; ++st) {
      mbar_init(full(st), full_count);
      mbar_init(empty(st), 8);
    }
    mbar_init_fence();
  }
};

// The kernel's dynamic shared memory, aligned to 1024 bytes (swizzle atoms need it).
__device__ __forceinline__ unsigned char* smem_aligned() {
  extern __shared__ unsigned char smem_raw[];
  return smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
}
__device__ __forceinline__ uint32_t smem_base_1k() { return smem_u32(smem_aligned()); }

// The producer thread's K/V loop: tiles j0..n_tiles-1 (BN keys each) of kv head g
// through the stage ring (tile j0 in stage 0); V lands KV_BYTES after K in each stage.
template <class C, int D, class StageBase>
__device__ __forceinline__ void produce_kv_tiles(const Bars<C::S>& bar, StageBase sk, const CUtensorMap* tk,
                                                 const CUtensorMap* tv, int g, int b, int j0, int n_tiles) {
  for (int i = 0; i < n_tiles - j0; ++i) {
    const int j = j0 + i, st = i % C::S, use = i / C::S;
    if (use > 0) mbar_wait(bar.empty(st), (use - 1) & 1);
    mbar_arrive_expect_tx(bar.full(st), 2 * C::KV_BYTES);
    for (int c = 0; c < D / 64; ++c) {
      tma_load(sk(st) + c * C::BN * 128, tk, bar.full(st), c * 64, g, j * C::BN, b);
      tma_load(sk(st) + C::KV_BYTES + c * C::BN * 128, tv, bar.full(st), c * 64, g, j * C::BN, b);
    }
  }
}

}  // namespace rt::cuda::sm90
