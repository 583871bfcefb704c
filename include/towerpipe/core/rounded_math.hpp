#pragma once
// Arithmetic with one rounding per operation, identical on host and device.
//
// Bitwise-equal results across backends (DESIGN.md §2, invariant 2) need every add and multiply to be
// rounded separately: no fused multiply-add. On the device the _rn intrinsics are never contracted; on
// the host the towerpipe target compiles with -ffp-contract=off so that a*b+c stays two roundings.

#include <cmath>

#include "towerpipe/core/config.hpp"

namespace towerpipe {
namespace detail {

#if TOWERPIPE_DEVICE_PASS()
TOWERPIPE_HOST_DEVICE inline float rounded_add(float a, float b) { return __fadd_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline float rounded_sub(float a, float b) { return __fsub_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline float rounded_mul(float a, float b) { return __fmul_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline float rounded_div(float a, float b) { return __fdiv_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline float rounded_sqrt(float a) { return __fsqrt_rn(a); }
TOWERPIPE_HOST_DEVICE inline double rounded_add(double a, double b) { return __dadd_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline double rounded_sub(double a, double b) { return __dsub_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline double rounded_mul(double a, double b) { return __dmul_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline double rounded_div(double a, double b) { return __ddiv_rn(a, b); }
TOWERPIPE_HOST_DEVICE inline double rounded_sqrt(double a) { return __dsqrt_rn(a); }
#else
template <class T>
TOWERPIPE_HOST_DEVICE inline T rounded_add(T a, T b) { return a + b; }
template <class T>
TOWERPIPE_HOST_DEVICE inline T rounded_sub(T a, T b) { return a - b; }
template <class T>
TOWERPIPE_HOST_DEVICE inline T rounded_mul(T a, T b) { return a * b; }
template <class T>
TOWERPIPE_HOST_DEVICE inline T rounded_div(T a, T b) { return a / b; }
template <class T>
TOWERPIPE_HOST_DEVICE inline T rounded_sqrt(T a) { return std::sqrt(a); }
#endif

}  // namespace detail
}  // namespace towerpipe
