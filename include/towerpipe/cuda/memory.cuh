#pragma once
// Memory spaces for CUDA (see core/host_memory.hpp for the interface): device memory of one device,
// and pinned (page-locked) host memory for asynchronous copies. Allocations are zero-filled before they
// are returned.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"

namespace towerpipe {
namespace detail {

// cudaMemcpy and cudaMemset on the default stream may return before the device has finished them (a
// copy from pageable memory returns once its bytes are staged for DMA; a device memset is asynchronous).
// The towers' streams are non-blocking, so they would not wait for the default stream: these helpers
// return only once the device memory holds the new values.
inline void finish_default_stream() { TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr)); }

// Copies host values to the current device; landed on return.
inline void copy_to_device_now(void* device_target, const void* host_source, std::size_t bytes) {
  TOWERPIPE_CUDA_CHECK(cudaMemcpy(device_target, host_source, bytes, cudaMemcpyHostToDevice));
  finish_default_stream();
}

}  // namespace detail

struct cuda_device_memory {
  int device = 0;

  struct free_on_device {
    int device;
    void operator()(void* pointer) const noexcept {
      const detail::device_guard on(device, std::nothrow);
      TOWERPIPE_CUDA_RELEASE(cudaFree(pointer));
    }
  };
  template <class T>
  using owner = std::unique_ptr<T[], free_on_device>;

  template <class T>
  owner<T> allocate(std::size_t count, std::size_t alignment) const {
    if (alignment > 256) detail::fail("cuda_device_memory aligns to 256 bytes, ", alignment, " requested");
    detail::device_guard on(device);
    void* raw = nullptr;
    const std::size_t bytes = count == 0 ? 1 : count * sizeof(T);
    const cudaError_t status = cudaMalloc(&raw, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      detail::fail("out of memory on CUDA device ", device, " allocating ", bytes, " bytes");
    }
    TOWERPIPE_CUDA_CHECK(status);
    owner<T> result(static_cast<T*>(raw), free_on_device{device});
    TOWERPIPE_CUDA_CHECK(cudaMemset(raw, 0, bytes));
    detail::finish_default_stream();
    return result;
  }
};

struct cuda_pinned_memory {
  struct free_pinned {
    void operator()(void* pointer) const noexcept {
      const detail::device_guard on(device_with_context(), std::nothrow);
      TOWERPIPE_CUDA_RELEASE(cudaFreeHost(pointer));
    }
  };
  template <class T>
  using owner = std::unique_ptr<T[], free_pinned>;

  // Allocated under a device whose context exists already (the current one where it does): page-locked
  // memory is every device's under unified addressing, and allocating it would otherwise create the
  // current device's context — on a fresh thread device 0's, in every process.
  template <class T>
  owner<T> allocate(std::size_t count, std::size_t /*alignment: page-aligned anyway*/ = 0) const {
    const detail::device_guard on(device_with_context(), std::nothrow);  // a failure shows in the allocation
    void* raw = nullptr;
    const std::size_t bytes = count == 0 ? 1 : count * sizeof(T);
    TOWERPIPE_CUDA_CHECK(cudaMallocHost(&raw, bytes));
    std::memset(raw, 0, bytes);
    return owner<T>(static_cast<T*>(raw), free_pinned{});
  }

 private:
  static int device_with_context() noexcept {
    int current = 0, count = 0;
    if (!TOWERPIPE_CUDA_RELEASE(cudaGetDevice(&current)) || detail::primary_context_active(current) ||
        !TOWERPIPE_CUDA_RELEASE(cudaGetDeviceCount(&count)))
      return current;
    for (int d = 0; d < count; ++d) {
      if (detail::primary_context_active(d)) return d;
    }
    return current;
  }
};

}  // namespace towerpipe
