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
// so the parameters checksum, depends on (docs/troubleshooting.md, "OpenBLAS and train's checksum").
inline std::string gemm_backend() {
#if defined(TOWERPIPE_EXAMPLES_CBLAS) && defined(OPENBLAS_VERSION)
  return std::string(openblas_get_config()) + ", kernel " + openblas_get_corename();
#elif defined(TOWERPIPE_EXAMPLES_CBLAS)
  return "a CBLAS other than OpenBLAS";
#else
  return "none: a plain loop (slow; Debian: libopenblas-dev)";
#endif
}

// Where OpenBLAS took a kernel with narrower vectors than the CPU has, the OPENBLAS_CORETYPE that fits
// the CPU; empty where the kernel fits or the BLAS is not OpenBLAS. Debian 12's 0.3.21 does not know
// recent Intel Xeons and falls back to Prescott (2.7x slower on the MLP); an AVX2 kernel on a CPU with
// AVX-512 (OPENBLAS_CORETYPE=Haswell left in an environment, as on the 2-core development machine)
// runs the MLP's GEMMs 1.6-1.8x slower than the AVX-512 one (benchmarks/results/2026-12-02-dev-main-job/).
// OpenBLAS reads the variable when it loads, so it must be set before the program starts
// (examples/run.sh does where it is unset).
inline std::string better_openblas_core() {
#if defined(TOWERPIPE_EXAMPLES_CBLAS) && defined(OPENBLAS_VERSION) && (defined(__x86_64__) || defined(__i386__))
  const std::string kernel = openblas_get_corename();
  int kernel_bits = 128;  // Prescott, Nehalem, Sandybridge (AVX without FMA), ...
  for (const char* avx2 : {"Haswell", "Zen", "Excavator"}) {
    if (kernel == avx2) kernel_bits = 256;
  }
  for (const char* avx512 : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (kernel == avx512) kernel_bits = 512;
  }
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && kernel_bits < 512) return __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  if (avx2 && kernel_bits < 256) return "Haswell";
  return {};
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
