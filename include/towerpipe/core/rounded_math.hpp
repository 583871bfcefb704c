#pragma once
// Arithmetic with one rounding per operation, identical on host and device, for float and double.
// No fused multiply-add, subnormals kept: device floats are inline PTX without .ftz (unflushed even under
// -use_fast_math); the host functions live in an exact-arithmetic region (core/exact_arithmetic.hpp).
// Why: docs/design-notes.md#core-rounded_math

#include <cmath>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"

#if defined(__CUDACC__)
#include <nv/target>
// The device intrinsic on the device, the plain operation on the host.
#define TOWERPIPE_DEVICE_OR_HOST(device_expression, host_expression) \
  NV_IF_TARGET(NV_IS_DEVICE, (return device_expression;), (return host_expression;))
#else
#define TOWERPIPE_DEVICE_OR_HOST(device_expression, host_expression) return host_expression;
#endif

// On the host, sqrt is the compiler's builtin: a std::sqrt from outside the exact-arithmetic region
// would not be inlined into it (see core/exact_arithmetic.hpp) and would cost a call per element.
#if defined(__GNUC__)
#define TOWERPIPE_HOST_SQRTF(a) __builtin_sqrtf(a)
#define TOWERPIPE_HOST_SQRT(a) __builtin_sqrt(a)
#else
#define TOWERPIPE_HOST_SQRTF(a) std::sqrt(a)
#define TOWERPIPE_HOST_SQRT(a) std::sqrt(a)
#endif

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace detail {

#if defined(__CUDACC__)
#define TOWERPIPE_PTX_FLOAT_BINARY(name, instruction)                                      \
  __device__ inline float name(float a, float b) {                                         \
    float r;                                                                                \
    asm(instruction " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                             \
    return r;                                                                               \
  }
TOWERPIPE_PTX_FLOAT_BINARY(ptx_add, "add.rn.f32")
TOWERPIPE_PTX_FLOAT_BINARY(ptx_sub, "sub.rn.f32")
TOWERPIPE_PTX_FLOAT_BINARY(ptx_mul, "mul.rn.f32")
TOWERPIPE_PTX_FLOAT_BINARY(ptx_div, "div.rn.f32")
#undef TOWERPIPE_PTX_FLOAT_BINARY
__device__ inline float ptx_sqrt(float a) {
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
#endif

TOWERPIPE_HOST_DEVICE inline float rounded_add(float a, float b) { TOWERPIPE_DEVICE_OR_HOST(ptx_add(a, b), a + b) }
TOWERPIPE_HOST_DEVICE inline float rounded_sub(float a, float b) { TOWERPIPE_DEVICE_OR_HOST(ptx_sub(a, b), a - b) }
TOWERPIPE_HOST_DEVICE inline float rounded_mul(float a, float b) { TOWERPIPE_DEVICE_OR_HOST(ptx_mul(a, b), a * b) }
TOWERPIPE_HOST_DEVICE inline float rounded_div(float a, float b) { TOWERPIPE_DEVICE_OR_HOST(ptx_div(a, b), a / b) }
TOWERPIPE_HOST_DEVICE inline float rounded_sqrt(float a) { TOWERPIPE_DEVICE_OR_HOST(ptx_sqrt(a), TOWERPIPE_HOST_SQRTF(a)) }
TOWERPIPE_HOST_DEVICE inline double rounded_add(double a, double b) { TOWERPIPE_DEVICE_OR_HOST(__dadd_rn(a, b), a + b) }
TOWERPIPE_HOST_DEVICE inline double rounded_sub(double a, double b) { TOWERPIPE_DEVICE_OR_HOST(__dsub_rn(a, b), a - b) }
TOWERPIPE_HOST_DEVICE inline double rounded_mul(double a, double b) { TOWERPIPE_DEVICE_OR_HOST(__dmul_rn(a, b), a * b) }
TOWERPIPE_HOST_DEVICE inline double rounded_div(double a, double b) { TOWERPIPE_DEVICE_OR_HOST(__ddiv_rn(a, b), a / b) }
TOWERPIPE_HOST_DEVICE inline double rounded_sqrt(double a) { TOWERPIPE_DEVICE_OR_HOST(__dsqrt_rn(a), TOWERPIPE_HOST_SQRT(a)) }

}  // namespace detail
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END

#undef TOWERPIPE_DEVICE_OR_HOST
#undef TOWERPIPE_HOST_SQRTF
#undef TOWERPIPE_HOST_SQRT
