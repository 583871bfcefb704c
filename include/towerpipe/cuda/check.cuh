#pragma once
// TOWERPIPE_CUDA_CHECK(call): a failed CUDA runtime call becomes a towerpipe::error that names the
// call, the file and line, and the CUDA error (DESIGN.md §2, invariant 5). A failure that CUDA keeps
// reporting afterwards (a sticky error: the context is lost, the process must restart) is said so.

#include <cuda_runtime.h>

#include "towerpipe/core/error.hpp"

#define TOWERPIPE_CUDA_CHECK(call) ::towerpipe::detail::check_cuda((call), #call, __FILE__, __LINE__)

namespace towerpipe {
namespace detail {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears the error where CUDA can; a sticky one stays
  const bool sticky = cudaPeekAtLastError() != cudaSuccess;
  fail(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")",
       sticky ? "; the CUDA context is unusable from now on" : "");
}

}  // namespace detail
}  // namespace towerpipe
