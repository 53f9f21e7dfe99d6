// Internal to src/cpu: the one place that calls OpenBLAS.
//
// ramtrain runs serial sgemm calls on its own pool, one fixed block per task.
// That is only safe when the linked OpenBLAS is thread-safe for concurrent
// callers: builds with threading (pthread/OpenMP flavours, run with
// openblas_set_num_threads(1)) or USE_LOCKING=1 are; Debian's
// libopenblas0-serial (USE_THREAD=0, no USE_LOCKING) is NOT: concurrent calls
// share its packing buffers and silently return wrong results (measured here:
// ~1% of 64x96x96 blocks corrupted with 3 threads). So when the library reports
// SINGLE_THREADED, every call below holds one process-wide mutex: results stay
// correct and bit-identical, GEMMs just stop running in parallel.
#pragma once
#include <cstdint>

namespace rt::cpu {

// Row-major C[M,N] = alpha * op(A) @ op(B) + beta * C, op = transpose when
// trans_* is set (A is [M,K] or, transposed, [K,M]; B is [K,N] or [N,K]).
// Thread-safe; K >= 1 (callers handle the empty product).
void sgemm_rowmajor(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// True when the linked OpenBLAS is a USE_THREAD=0 build and calls are serialised.
bool blas_calls_serialised();

}  // namespace rt::cpu
