#pragma once
// Keeps the library's own floating-point arithmetic exact — one rounding per operation, no fused
// multiply-add — whatever flags the user's code is compiled with (docs/guide.md, invariant 2).
//
// Code between TOWERPIPE_EXACT_ARITHMETIC_BEGIN and _END (the per-element optimizer updates, the
// canonical sum, the multi-tensor agents and the host pass):
// - GCC (and nvcc's host pass, which GCC compiles): the functions are compiled with -ffp-contract=off
//   through `#pragma GCC optimize`, even in a target built with -ffp-contract=fast (GCC's default in the
//   gnu++ dialects) and -march=native. GCC refuses to inline such a function into one compiled with other
//   floating-point options ("optimization attribute mismatch"), so the guarantee survives inlining; the
//   price is a call at each entry into the library's arithmetic (once per block of elements, not per
//   element).
// - Clang: contracts only within one expression by default (-ffp-contract=on); every library operation
//   is a separate rounded_* call, so nothing fuses. Clang ignores pragmas under -ffp-contract=fast:
//   that flag is not supported with Clang.
// - The device pass (nvcc): the __f*_rn intrinsics are never contracted (core/rounded_math.hpp).
// - -ffast-math / -Ofast (reassociation, no NaN) cannot be undone locally: they stop compilation below.
//
// Speed: GCC vectorises sqrt (Adam's host pass) only without errno, which cannot be switched per
// function; compile with -fno-math-errno (it changes no result) for the host pass at full speed.

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
