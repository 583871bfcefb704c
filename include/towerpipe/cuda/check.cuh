#pragma once
// TOWERPIPE_CUDA_CHECK(call): a failed CUDA runtime call becomes a towerpipe::error that names the
// call, the file and line, and the CUDA error (docs/guide.md, invariant 5). A failure that CUDA keeps
// reporting afterwards (a sticky error: the context is lost, the process must restart) is said so.

#include <cuda_runtime.h>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/log.hpp"

#define TOWERPIPE_CUDA_CHECK(call) ::towerpipe::detail::check_cuda((call), #call, __FILE__, __LINE__)
// For calls that must not throw (destructors: cudaFree, cudaStreamDestroy, ...): a failure is cleared, so
// that it is never blamed on a later call (a tower's launch check, say), and reported as a warning
// through the log sink (core/log.hpp).
#define TOWERPIPE_CUDA_RELEASE(call) ::towerpipe::detail::release_cuda((call), #call, __FILE__, __LINE__)

namespace towerpipe {
namespace detail {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clears the error where CUDA can; a sticky one stays
  const bool sticky = cudaPeekAtLastError() != cudaSuccess;
  fail(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")",
       sticky ? "; the CUDA context is unusable from now on" : "");
}

// Returns whether the call succeeded.
inline bool release_cuda(cudaError_t status, const char* call, const char* file, int line) noexcept {
  if (status == cudaSuccess) return true;
  cudaGetLastError();
  try {
    log_warning(make_message(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (cleared)"));
  } catch (...) {  // a destructor must not throw, not even for a log line
  }
  return false;
}

}  // namespace detail
}  // namespace towerpipe
