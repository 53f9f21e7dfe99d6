// The mma.sync kernel set's tile movement and products (attention.cu, sm_80+):
// cp.async into XOR-swizzled shared-memory tiles, ldmatrix, and m16n8k16 bf16
// MMAs over whole tiles. Internal to the CUDA backend; include only from
// attention.cu. Tiles are [rows][DP] bf16 (DP = tile_width(D)), 16-byte chunk
// c of row r stored at chunk c ^ (r & 7), so cp.async stores and ldmatrix
// loads are bank-conflict free.
#pragma once
#include "cuda/attention/utils.cuh"

namespace rt::cuda::attn {

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c[4] += a[4] (16x16 row-major) * b[2] (16x8 col-major)
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Row length (elements) of a shared-memory tile of head_dim D: D itself when
// it is a multiple of 64 (the 8-chunk swizzle stays inside the row); D = 96
// rows are padded to 128 (chunks 12..15 are never written nor read).
constexpr int tile_width(int D) { return D % 64 == 0 ? D : (D + 63) / 64 * 64; }

// Byte address of 16-byte chunk `chunk` of row `row` in a swizzled [rows][DP] tile.
template <int DP>
__device__ __forceinline__ uint32_t tile_addr(uint32_t base, int row, int chunk) {
  return base + static_cast<uint32_t>((row * DP + ((chunk ^ (row & 7)) << 3)) * 2);
}

// cp.async ROWS rows of D bf16 from global (row stride ld elements) into a
// swizzled tile of row length DP = tile_width(D); rows >= rows_valid are
// zero-filled (fallback is any valid address). Thread t copies chunk t % (DP/8)
// of rows t / (DP/8) + k * RSTEP (padding chunks: nothing); with RSTEP a
// multiple of 8 its swizzle (row & 7) is the same for every k, so the shared
// address is one base plus a constant step (few live registers in the loops).
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void tile_load(uint32_t dst, const bf16* src, int64_t ld, int rows_valid,
                                          const bf16* fallback) {
  constexpr int DP = tile_width(D), kChunks = DP / 8, kStep = NTHREADS / kChunks;
  static_assert(NTHREADS % kChunks == 0 && ROWS % kStep == 0, "tile must split evenly over the block");
  const int r0 = static_cast<int>(threadIdx.x) / kChunks, c = static_cast<int>(threadIdx.x) % kChunks;
  if (DP != D && c >= D / 8) return;  // row padding
  const bf16* s0 = src + r0 * ld + c * 8;
  if constexpr (kStep % 8 == 0) {
    const uint32_t d0 = tile_addr<DP>(dst, r0, c);
#pragma unroll
    for (int it = 0; it < ROWS / kStep; ++it) {
      const bool ok = r0 + it * kStep < rows_valid;
      cp_async16(d0 + static_cast<uint32_t>(it * kStep * DP * 2), ok ? s0 + it * kStep * ld : fallback, ok);
    }
  } else {  // D = 256 over 128 threads: 4-row steps, the swizzle alternates
#pragma unroll
    for (int it = 0; it < ROWS / kStep; ++it) {
      const bool ok = r0 + it * kStep < rows_valid;
      cp_async16(tile_addr<DP>(dst, r0 + it * kStep, c), ok ? s0 + it * kStep * ld : fallback, ok);
    }
  }
}

// acc[n][.] += A(16 rows at row ra of tile sa, k over D) * B^T, where B is the
// tile sb's rows [0, NROWS) (stored [n][k], k contiguous).
template <int D, int NROWS>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[NROWS / 8][4], uint32_t sa, int ra, uint32_t sb) {
  constexpr int DP = tile_width(D);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    ldsm_x4(a[0], a[1], a[2], a[3], tile_addr<DP>(sa, ra + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < NROWS / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(b0, b1, b2, b3, tile_addr<DP>(sb, np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
      mma_16816(acc[2 * np], a, b0, b1);
      mma_16816(acc[2 * np + 1], a, b2, b3);
    }
  }
}

// acc[N/8][.] += A (16 x KK bf16 fragments in registers) * B, where B is
// columns [8 c0, 8 c0 + N) of the tile sb's rows [0, KK) (a tile of head_dim
// D stored [k][n], n = d contiguous; read transposed).
template <int D, int KK, int N = D>
__device__ __forceinline__ void mma_regs_trans(float (&acc)[N / 8][4], const uint32_t (&a)[KK / 16][4], uint32_t sb,
                                               int c0 = 0) {
  constexpr int DP = tile_width(D);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < KK / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3,
                    tile_addr<DP>(sb, ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c0 + np * 2 + (lane >> 4)));
      mma_16816(acc[2 * np], a[ks], b0, b1);
      mma_16816(acc[2 * np + 1], a[ks], b2, b3);
    }
  }
}

// The same two products for MT stacked 16-row m-tiles (rows ra + 16*mt): each
// B fragment is loaded from shared memory once and used MT times.
template <int D, int NROWS, int MT>
__device__ __forceinline__ void mma_rows_rows_mt(float (&acc)[MT][NROWS / 8][4], uint32_t sa, int ra, uint32_t sb) {
  constexpr int DP = tile_width(D);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldsm_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
              tile_addr<DP>(sa, ra + mt * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
    for (int np = 0; np < NROWS / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4(b0, b1, b2, b3, tile_addr<DP>(sb, np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(acc[mt][2 * np], a[mt], b0, b1);
        mma_16816(acc[mt][2 * np + 1], a[mt], b2, b3);
      }
    }
  }
}

template <int D, int KK, int MT>
__device__ __forceinline__ void mma_regs_trans_mt(float (&acc)[MT][D / 8][4], const uint32_t (&a)[MT][KK / 16][4],
                                                  uint32_t sb) {
  constexpr int DP = tile_width(D);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int ks = 0; ks < KK / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3,
                    tile_addr<DP>(sb, ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), np * 2 + (lane >> 4)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816(acc[mt][2 * np], a[mt][ks], b0, b1);
        mma_16816(acc[mt][2 * np + 1], a[mt][ks], b2, b3);
      }
    }
  }
}

}  // namespace rt::cuda::attn
