#pragma once
// Runs a copy list (programs/copy_list.hpp) on a stream. cudaMemcpyPeerAsync works with or without
// peer access (without it the driver stages through the host), which makes it the fallback path.

#include <cuda_runtime.h>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/programs/copy_list.hpp"

namespace towerpipe {
namespace detail {

template <class T>
void run_copies_async(const copy_list<T>& copies, const cuda_stream& stream) {
  for (const peer_copy<T>& c : copies)
    TOWERPIPE_CUDA_CHECK(
        cudaMemcpyPeerAsync(c.target, c.target_device, c.source, c.source_device, c.elements * sizeof(T), stream.get()));
}

}  // namespace detail
}  // namespace towerpipe
