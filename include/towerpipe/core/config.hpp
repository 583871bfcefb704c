#pragma once
// Compiler and platform switches shared by every header, and the library's version (the one place it
// is written: CMakeLists.txt reads it from here).

#define TOWERPIPE_VERSION_MAJOR 0
#define TOWERPIPE_VERSION_MINOR 1
#define TOWERPIPE_VERSION_PATCH 0

// TOWERPIPE_HOST_DEVICE: on functions that the host loops and the CUDA kernels both call (docs/guide.md, invariant 4).
// TOWERPIPE_EXEC_CHECK_DISABLE: placed before a __host__ __device__ template that calls a functor supplied by its
// caller: nvcc then accepts host-only functors when the template is instantiated for the host (as Thrust and CUB do).
#if defined(__CUDACC__)
#define TOWERPIPE_HOST_DEVICE __host__ __device__
#define TOWERPIPE_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define TOWERPIPE_HOST_DEVICE
#define TOWERPIPE_EXEC_CHECK_DISABLE
#endif

namespace towerpipe {
namespace detail {
// Makes a static_assert in a primary template fire only when that template is instantiated.
template <class...>
inline constexpr bool dependent_false = false;
}  // namespace detail
}  // namespace towerpipe
