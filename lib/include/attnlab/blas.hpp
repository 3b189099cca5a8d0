// The one place that calls BLAS gemm. Row-major, explicit leading dimensions, float and double.
// Every matmul in attnlab goes through here: never write a matmul as an xtensor expression.
#pragma once

namespace attnlab::blas {

// C (m, n) = alpha * op(A) (m, k) * op(B) (k, n) + beta * C, all row-major.
// op(X) is X or X^T; lda/ldb/ldc are the row strides of A, B and C as stored, so a head slice of a
// (B, T, H*D) activation is passed with ld = H*D and no copy. With beta = 0, C is assigned
// (its previous contents, even NaN, are ignored); otherwise it is added to.
// Called outside a parallel region with num_threads() > 1 (the calling thread's count, threads.hpp)
// and a large enough product, the rows (or columns) of C are split over that many threads, one
// single-threaded BLAS call each; deterministic for a fixed thread count. Inside a parallel region
// it always runs serially.
template <class T>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, T alpha, const T* a, int lda, const T* b,
          int ldb, T beta, T* c, int ldc);

}  // namespace attnlab::blas
