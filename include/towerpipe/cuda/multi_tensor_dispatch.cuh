#pragma once
// The multi-tensor kernel and its dispatch: the chunk and pointer tables uploaded to a device, and the
// launch that covers every chunk of every variable in one grid. Layering as CUB's: the launch policy is a
// plain value struct (plan/launch_policy.hpp, testable on the host), the kernel is a thin loop that hands
// (chunk, thread) to the agent, and the agent (kernels/agents.hpp) holds all the math — which is why
// tests can run the same agents on the host.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/launch_policy.hpp"

namespace towerpipe {
namespace detail {

template <class Agent, class Policy>
__global__ void __launch_bounds__(Policy::threads_per_block)
    multi_tensor_kernel(Agent agent, const tensor_chunk* chunks, int chunk_count) {
  for (int c = static_cast<int>(blockIdx.x); c < chunk_count; c += static_cast<int>(gridDim.x))
    process_chunk<Policy::vector_elements>(agent, chunks[c], threadIdx.x, Policy::threads_per_block);
}

// A chunk table uploaded to one device, with the grid that covers it.
class device_chunk_table {
 public:
  template <class Executor>
  device_chunk_table(const Executor&, const std::vector<tensor_chunk>& chunks, int device)
      : device_(device),
        count_(static_cast<int>(chunks.size())),
        chunks_(cuda_device_memory{device}.allocate<tensor_chunk>(chunks.size(), 256)) {
    device_guard on(device);
    if (!chunks.empty()) copy_to_device_now(chunks_.get(), chunks.data(), chunks.size() * sizeof(tensor_chunk));
  }

  std::size_t size() const { return static_cast<std::size_t>(count_); }

  // Over the chunks [run.first, run.last) (every_chunk: all; a gradient bucket's: plan/chunk_table.hpp
  // chunks_by_variable); an empty run launches nothing.
  template <class Policy, class Agent>
  void launch(const Agent& agent, const cuda_stream& stream, chunk_group run = every_chunk) const {
    static_assert(check_multi_tensor_policy<Policy, typename Agent::value_type>());
    if (run.last == every_chunk.last) run.last = size();
    if (stream.device() != device_) fail("chunk table of device ", device_, " launched on device ", stream.device());
    if (run.first > run.last || run.last > size())
      fail("chunks [", run.first, ", ", run.last, ") launched from a table of ", size());
    if (run.first == run.last) return;
    device_guard on(device_);
    const int count = static_cast<int>(run.last - run.first);
    multi_tensor_kernel<Agent, Policy><<<static_cast<unsigned>(count), Policy::threads_per_block, 0, stream.get()>>>(
        agent, chunks_.get() + run.first, count);
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  }

 private:
  int device_;
  int count_;
  cuda_device_memory::owner<tensor_chunk> chunks_;
};

// A pointer table (plan/chunk_table.hpp) uploaded to one device. A table of no roles (no state
// slots, no replica reached directly) still gets a zeroed entry, so that its view is a valid pointer.
template <class T>
class device_pointer_table {
 public:
  template <class Executor>
  device_pointer_table(const Executor&, const std::vector<T*>& pointers, int variables, int device)
      : variables_(variables), pointers_(cuda_device_memory{device}.allocate<T*>(std::max<std::size_t>(pointers.size(), 1), 256)) {
    device_guard on(device);
    if (!pointers.empty()) copy_to_device_now(pointers_.get(), pointers.data(), pointers.size() * sizeof(T*));
  }
  pointer_table<T> view() const { return {pointers_.get(), variables_}; }
  pointer_table<const T> const_view() const { return {pointers_.get(), variables_}; }

 private:
  int variables_;
  cuda_device_memory::owner<T*> pointers_;
};

}  // namespace detail
}  // namespace towerpipe
