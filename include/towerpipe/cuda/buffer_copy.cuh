#pragma once
// Copies a whole role buffer (every variable) between devices, asynchronously: one copy for
// layout::flat's arena, one per variable otherwise. cudaMemcpyPeerAsync works with or without peer
// access (without it the driver stages through the host), which makes it the fallback path.

#include <cuda_runtime.h>

#include <type_traits>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"

namespace towerpipe {
namespace detail {

template <class Buffer, class = void>
struct has_arena : std::false_type {};
template <class Buffer>
struct has_arena<Buffer, std::void_t<decltype(std::declval<const Buffer&>().arena())>> : std::true_type {};

template <class Buffer>
void copy_buffer_async(Buffer& target, int target_device, const Buffer& source, int source_device,
                       const cuda_stream& stream) {
  using T = std::remove_pointer_t<decltype(source.data(0))>;
  if constexpr (has_arena<Buffer>::value) {
    TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(target.arena(), target_device, source.arena(), source_device,
                                             source.arena_size() * sizeof(T), stream.get()));
  } else {
    for (std::size_t v = 0; v < source.variables().count(); ++v)
      TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(target.data(v), target_device, source.data(v), source_device,
                                               source.view(v).size() * sizeof(T), stream.get()));
  }
}

}  // namespace detail
}  // namespace towerpipe
