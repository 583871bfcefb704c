#pragma once
// Row-major GEMM for the examples: C = alpha * op(A) * op(B) + beta * C, with op(X) = X or its
// transpose. Single precision goes through the CBLAS of a real BLAS (OpenBLAS) where the build found one
// (TOWERPIPE_EXAMPLES_CBLAS); other types (the tests' double) and builds without a BLAS use a plain loop
// that is correct but slow.

#include <string>
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

// The BLAS the GEMMs go through and the kernel it took for this CPU: what the towers' arithmetic, and
// so the parameters checksum, depends on (README.md, "Quick start").
inline std::string gemm_backend() {
#if defined(TOWERPIPE_EXAMPLES_CBLAS) && defined(OPENBLAS_VERSION)
  return std::string(openblas_get_config()) + ", kernel " + openblas_get_corename();
#elif defined(TOWERPIPE_EXAMPLES_CBLAS)
  return "a CBLAS other than OpenBLAS";
#else
  return "none: a plain loop (slow; Debian: libopenblas-dev)";
#endif
}

// Where OpenBLAS took a kernel without AVX2 on a CPU that has it (Debian 12's 0.3.21 does not know
// recent Intel Xeons and falls back to Prescott: 2.7x slower on the MLP), the OPENBLAS_CORETYPE that
// fits the CPU; empty where the kernel fits or the BLAS is not OpenBLAS. OpenBLAS reads the variable
// when it loads, so it must be set before the program starts (examples/run.sh does).
inline std::string better_openblas_core() {
#if defined(TOWERPIPE_EXAMPLES_CBLAS) && defined(OPENBLAS_VERSION) && (defined(__x86_64__) || defined(__i386__))
  const std::string kernel = openblas_get_corename();
  for (const char* with_avx2 : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"}) {
    if (kernel == with_avx2) return {};
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return {};
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  return "Haswell";
#else
  return {};
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
