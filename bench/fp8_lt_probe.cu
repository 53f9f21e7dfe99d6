// Which block-scaled FP8 configurations does this machine's cuBLASLt accept?
// A diagnostic for issue 31 (cuBLASLt's requirements for VEC128 / BLK128x128
// scales are documented loosely): for each shape, scale-mode pair, output
// type, beta, FAST_ACCUM setting and "scale pointers set before the heuristic
// or not", asks cublasLtMatmulAlgoGetHeuristic and, where it answers, runs the
// GEMM once. Prints one line per configuration. Not a test.
//   fp8_lt_probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

const char* mode_name(int32_t m) {
  return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F      ? "vec128"
         : m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F ? "blk128"
                                                             : "scalar";
}

}  // namespace

int main() {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::fprintf(stderr, "fp8_lt_probe: no CUDA device\n");
    return 1;
  }
  std::printf("fp8_lt_probe on %s (sm_%d%d), cuBLASLt %zu\n", prop.name, prop.major, prop.minor,
              cublasLtGetVersion());
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  const size_t ws_bytes = 32u << 20;
  void *ws = nullptr, *a = nullptr, *b = nullptr, *d = nullptr, *sa = nullptr, *sb = nullptr;
  const int64_t big = 8192LL * 4096;
  cudaMalloc(&ws, ws_bytes);
  cudaMalloc(&a, big);
  cudaMalloc(&b, big);
  cudaMalloc(&d, big * 4);
  cudaMalloc(&sa, 1 << 22);
  cudaMalloc(&sb, 1 << 22);
  cudaMemset(a, 0x38, big);  // 1.0 in e4m3
  cudaMemset(b, 0x38, big);
  cudaMemset(sa, 0, 1 << 22);
  cudaMemset(sb, 0, 1 << 22);
  const int64_t shapes[][3] = {{256, 512, 384}, {512, 512, 512}, {2048, 256, 256}, {4096, 3584, 3584}};
  const int32_t V = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, B = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                S = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const int32_t modes[][2] = {{V, V}, {V, B}, {B, V}, {S, S}};
  int ok_count = 0;
  for (auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];  // cuBLAS: D[m,n] = op(A)[m,k] op(B)[k,n], A stored k x m (T)
    for (auto& md : modes)
      for (int out32 = 0; out32 < 2; ++out32)
        for (int beta1 = 0; beta1 < 2; ++beta1)
          for (int fa = -1; fa < 2; ++fa)
            for (int ptr_first = 0; ptr_first < 2; ++ptr_first) {
              if (beta1 && !out32) continue;
              cublasLtMatmulDesc_t desc = nullptr;
              cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
              cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
              const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &md[0], sizeof(md[0]));
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &md[1], sizeof(md[1]));
              if (fa >= 0) {
                const int8_t f = static_cast<int8_t>(fa);
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof(f));
              }
              if (ptr_first) {
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
                cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
              }
              cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
              cublasLtMatrixLayoutCreate(&lc, out32 ? CUDA_R_32F : CUDA_R_16BF, m, n, m);
              cublasLtMatmulPreference_t pref = nullptr;
              cublasLtMatmulPreferenceCreate(&pref);
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                   sizeof(ws_bytes));
              cublasLtMatmulHeuristicResult_t r{};
              int found = 0;
              cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &r, &found);
              const char* run = "-";
              if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
                if (!ptr_first) {
                  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
                  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
                }
                const float alpha = 1.f, beta = beta1 ? 1.f : 0.f;
                cublasStatus_t rs = cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &beta, d, lc, d, lc, &r.algo, ws,
                                                   ws_bytes, nullptr);
                cudaError_t ce = cudaDeviceSynchronize();
                run = rs == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess ? "ran" : "run-failed";
                if (rs == CUBLAS_STATUS_SUCCESS && ce == cudaSuccess) ++ok_count;
              }
              std::printf("m=%5lld n=%5lld k=%5lld A=%s B=%s out=%s beta=%d fast_accum=%2d ptr_first=%d | %s found=%d %s\n",
                          static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                          mode_name(md[0]), mode_name(md[1]), out32 ? "f32 " : "bf16", beta1, fa, ptr_first,
                          cublasLtGetStatusString(st), found, run);
              cublasLtMatmulPreferenceDestroy(pref);
              cublasLtMatrixLayoutDestroy(lc);
              cublasLtMatrixLayoutDestroy(lb);
              cublasLtMatrixLayoutDestroy(la);
              cublasLtMatmulDescDestroy(desc);
            }
  }
  std::printf("configurations that ran: %d\n", ok_count);
  cublasLtDestroy(h);
  return 0;
}
