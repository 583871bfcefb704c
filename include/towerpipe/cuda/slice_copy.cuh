#pragma once
// Copies an owner's slice (programs/owner_slices.hpp) between a buffer of whole variables (a layout's
// buffer, on one device) and compact storage of the slice (programs/owner_slices.hpp, on another device), one
// cudaMemcpyPeerAsync per range: how reduce::sharded reaches a tower whose device the owner's cannot
// address (no peer access, or pipeline_options::direct_device_access off).

#include <cuda_runtime.h>

#include <cstddef>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/programs/owner_slices.hpp"

namespace towerpipe {
namespace detail {

enum class slice_copy { into_compact, out_of_compact };

template <class Buffer, class T>
void copy_slice_async(const owner_slice& slice, slice_copy direction, Buffer& whole, int whole_device, T* compact,
                      int compact_device, const cuda_stream& stream) {
  slice.for_each_stored_range([&](const element_range& r, std::size_t offset) {
    T* in_whole = whole.data(r.variable) + r.begin;
    const std::size_t bytes = (r.end - r.begin) * sizeof(T);
    if (direction == slice_copy::into_compact)
      TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(compact + offset, compact_device, in_whole, whole_device, bytes, stream.get()));
    else
      TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(in_whole, whole_device, compact + offset, compact_device, bytes, stream.get()));
  });
}

}  // namespace detail
}  // namespace towerpipe
