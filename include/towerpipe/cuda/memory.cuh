#pragma once
// Memory spaces for CUDA (see core/host_memory.hpp for the interface): device memory of one device,
// and pinned (page-locked) host memory for asynchronous copies. Allocations are zero-filled.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"

namespace towerpipe {

struct cuda_device_memory {
  int device = 0;

  struct free_on_device {
    int device;
    void operator()(void* pointer) const {
      detail::device_guard on(device);
      cudaFree(pointer);
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
    return result;
  }
};

struct cuda_pinned_memory {
  struct free_pinned {
    void operator()(void* pointer) const { cudaFreeHost(pointer); }
  };
  template <class T>
  using owner = std::unique_ptr<T[], free_pinned>;

  template <class T>
  owner<T> allocate(std::size_t count, std::size_t /*alignment: page-aligned anyway*/ = 0) const {
    void* raw = nullptr;
    const std::size_t bytes = count == 0 ? 1 : count * sizeof(T);
    TOWERPIPE_CUDA_CHECK(cudaMallocHost(&raw, bytes));
    std::memset(raw, 0, bytes);
    return owner<T>(static_cast<T*>(raw), free_pinned{});
  }
};

}  // namespace towerpipe
