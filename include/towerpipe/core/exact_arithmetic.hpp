#pragma once
// Keeps the library's own floating-point arithmetic exact — one rounding per operation, no fused
// multiply-add — whatever flags the user's code is compiled with (docs/guide.md, invariant 2).
// Why: docs/design-notes.md#core-exact_arithmetic

#if defined(__FAST_MATH__)
#error "towerpipe: -ffast-math / -Ofast is not supported: it reorders and fuses the library's arithmetic, so results would no longer be bitwise reproducible (use -O3 [-march=native] [-fno-math-errno] instead)"
#endif

#if defined(__CUDACC__) && !defined(__CUDA_ARCH__)
// nvcc's front end passes the pragma on to the host compiler (checked: the function is not inlined into
// a contracting caller and has no FMA) but warns that it does not know it (#1675).
#define TOWERPIPE_EXACT_ARITHMETIC_BEGIN                                                                    \
  _Pragma("nv_diagnostic push") _Pragma("nv_diag_suppress 1675") _Pragma("GCC push_options")               \
      _Pragma("GCC optimize(\"fp-contract=off\")") _Pragma("nv_diagnostic pop")
#define TOWERPIPE_EXACT_ARITHMETIC_END _Pragma("GCC pop_options")
#elif defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#define TOWERPIPE_EXACT_ARITHMETIC_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\")")
#define TOWERPIPE_EXACT_ARITHMETIC_END _Pragma("GCC pop_options")
#else
#define TOWERPIPE_EXACT_ARITHMETIC_BEGIN
#define TOWERPIPE_EXACT_ARITHMETIC_END
#endif
