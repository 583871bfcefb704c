#pragma once
// Row-major GEMM for the examples: C = alpha * op(A) * op(B) + beta * C, with op(X) = X or its
// transpose. Single precision goes through the CBLAS of a real BLAS (OpenBLAS) where the build found one
// (TOWERPIPE_EXAMPLES_CBLAS); other types (the tests' double) and builds without a BLAS use a plain loop
// that is correct but slow.

#include <type_traits>

#if defined(TOWERPIPE_EXAMPLES_CBLAS)
#include <cblas.h>
#endif

namespace towerpipe_examples {

// Towers are the parallelism: each tower thread runs its GEMMs single-threaded, so that N towers do not
// start N x cores BLAS threads.
inline void use_single_threaded_gemm() {
#if defined(TOWERPIPE_EXAMPLES_CBLAS) && defined(OPENBLAS_VERSION)
  openblas_set_num_threads(1);
#endif
}

template <class Real>
void gemm(bool transpose_a, bool transpose_b, int m, int n, int k, Real alpha, const Real* a, int lda, const Real* b,
          int ldb, Real beta, Real* c, int ldc) {
#if defined(TOWERPIPE_EXAMPLES_CBLAS)
  if constexpr (std::is_same_v<Real, float>) {
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
#endif
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) c[i * ldc + j] *= beta;
    for (int p = 0; p < k; ++p) {
      const Real scale = alpha * (transpose_a ? a[p * lda + i] : a[i * lda + p]);
      for (int j = 0; j < n; ++j) c[i * ldc + j] += scale * (transpose_b ? b[j * ldb + p] : b[p * ldb + j]);
    }
  }
}

}  // namespace towerpipe_examples
