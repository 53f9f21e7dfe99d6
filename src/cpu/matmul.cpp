// CPU GEMMs (declared in cpu/ops.h): serial OpenBLAS sgemm calls split over
// the global pool in FIXED blocks of kMatmulRowBlock output rows. Each output
// element is one full dot product over K computed by a single sgemm call whose
// shape depends only on (M, N, K), never on the thread count, so results are
// bit-identical run to run and for any pool size. K is never split.
// sgemm goes through cpu/blas.h (serialised when the OpenBLAS build is not
// thread-safe; see there).
//
// beta != 0: the block's product is computed into a scratch buffer first and
// then combined as out = beta*out + product, so with beta == 1 repeated calls
// accumulate exactly the same product each time (g, then g + g, ...),
// independent of what out held before.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "cpu/blas.h"
#include "cpu/ops.h"

namespace rt::cpu {

namespace {
struct BlasSetup {
  bool serialise;
  BlasSetup() {
    openblas_set_num_threads(1);
    const char* cfg = openblas_get_config();
    serialise = cfg == nullptr || std::strstr(cfg, "SINGLE_THREADED") != nullptr;
  }
};
const BlasSetup& blas_setup() {
  static const BlasSetup setup;
  return setup;
}
std::mutex& blas_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

bool blas_calls_serialised() { return blas_setup().serialise; }

void sgemm_rowmajor(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  if (blas_setup().serialise) {
    std::lock_guard<std::mutex> lk(blas_mutex());
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

namespace {

constexpr int64_t kMatmulRowBlock = 64;

enum class Layout { nt, nn, tn };

// One row block [m0, m1) of out[M,N] (row-major, ldc = N) with sgemm, written
// as out = beta*out + product.
void matmul_block(Layout layout, float* out, const float* a, const float* b, int64_t m0, int64_t m1, int64_t M,
                  int64_t N, int64_t K, float beta) {
  const int64_t mb = m1 - m0;
  float* c = out + m0 * N;
  if (K == 0) {  // empty product: sgemm would reject lda = 0
    for (int64_t i = 0; i < mb * N; ++i) c[i] = beta == 0.f ? 0.f : beta * c[i];
    return;
  }
  std::vector<float> scratch;
  float* dst = c;
  if (beta != 0.f) {
    scratch.resize(static_cast<size_t>(mb * N));
    dst = scratch.data();
  }
  switch (layout) {
    case Layout::nt:  // a[M,K] rows m0..m1, b[N,K]
      sgemm_rowmajor(false, true, mb, N, K, 1.f, a + m0 * K, K, b, K, 0.f, dst, N);
      break;
    case Layout::nn:  // a[M,K] rows m0..m1, b[K,N]
      sgemm_rowmajor(false, false, mb, N, K, 1.f, a + m0 * K, K, b, N, 0.f, dst, N);
      break;
    case Layout::tn:  // a[K,M] columns m0..m1, b[K,N]
      sgemm_rowmajor(true, false, mb, N, K, 1.f, a + m0, M, b, N, 0.f, dst, N);
      break;
  }
  if (beta != 0.f) {
    if (beta == 1.f) {
      for (int64_t i = 0; i < mb * N; ++i) c[i] += dst[i];
    } else {
      for (int64_t i = 0; i < mb * N; ++i) c[i] = beta * c[i] + dst[i];
    }
  }
}

void matmul_run(Layout layout, float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta,
                const char* name) {
  RT_CHECK(M >= 0 && N >= 0 && K >= 0, "[cpu/", name, "] negative shape M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  parallel_for(M, kMatmulRowBlock,
               [&](int64_t m0, int64_t m1) { matmul_block(layout, out, a, b, m0, m1, M, N, K, beta); });
}

}  // namespace

// out[M,N] = beta*out + a[M,K] @ b[N,K]^T
void matmul_nt(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta) {
  matmul_run(Layout::nt, out, a, b, M, N, K, beta, "matmul_nt");
}

// out[M,N] = beta*out + a[M,K] @ b[K,N]
void matmul_nn(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta) {
  matmul_run(Layout::nn, out, a, b, M, N, K, beta, "matmul_nn");
}

// out[M,N] = beta*out + a[K,M]^T @ b[K,N]; row block m0..m1 of out uses columns m0..m1 of a.
void matmul_tn(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K, float beta) {
  matmul_run(Layout::tn, out, a, b, M, N, K, beta, "matmul_tn");
}

}  // namespace rt::cpu
