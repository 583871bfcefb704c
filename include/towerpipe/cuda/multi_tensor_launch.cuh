#pragma once
// Runs a multi-tensor agent (reduce/multi_tensor.hpp) on a device: one kernel launch covers every
// chunk of every variable. Layering as CUB's: the launch policy is a plain value struct, the kernel is
// a thin loop that hands (chunk, element) to the agent, and the agent holds all the math — which is
// why tests can run the same agents on the host.

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/reduce/multi_tensor.hpp"

namespace towerpipe {

// Launch shape of the multi-tensor kernels. chunk_elements is the table's chunk size: a block strides
// through one chunk with threads_per_block threads in groups of 4 elements (16-byte vectors), so
// chunk_elements / threads_per_block elements per thread (16 for the defaults: 4 vector loads per
// role) keep each thread's loads in flight.
struct multi_tensor_policy {
  static constexpr int threads_per_block = 256;
  static constexpr std::size_t chunk_elements = 4096;
  static_assert(chunk_elements % 64 == 0, "chunks must start 256-byte aligned");
};

namespace detail {

template <class Agent, class Policy>
__global__ void __launch_bounds__(Policy::threads_per_block)
    multi_tensor_kernel(Agent agent, const tensor_chunk* chunks, int chunk_count) {
  for (int c = static_cast<int>(blockIdx.x); c < chunk_count; c += static_cast<int>(gridDim.x)) {
    agent(chunks[c], threadIdx.x, Policy::threads_per_block);
  }
}

}  // namespace detail

// A chunk table uploaded to one device, with the grid that covers it.
class device_chunk_table {
 public:
  device_chunk_table(const std::vector<tensor_chunk>& chunks, int device)
      : device_(device),
        count_(static_cast<int>(chunks.size())),
        chunks_(cuda_device_memory{device}.allocate<tensor_chunk>(chunks.size(), 256)) {
    detail::device_guard on(device);
    detail::copy_to_device_now(chunks_.get(), chunks.data(), chunks.size() * sizeof(tensor_chunk));
  }

  template <class Policy = multi_tensor_policy, class Agent>
  void launch(const Agent& agent, const detail::cuda_stream& stream) const {
    if (stream.device() != device_) detail::fail("chunk table of device ", device_, " launched on device ", stream.device());
    detail::device_guard on(device_);
    detail::multi_tensor_kernel<Agent, Policy>
        <<<static_cast<unsigned>(std::max(count_, 1)), Policy::threads_per_block, 0, stream.get()>>>(agent, chunks_.get(),
                                                                                                    count_);
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  }

 private:
  int device_;
  int count_;
  cuda_device_memory::owner<tensor_chunk> chunks_;
};

// A pointer table (reduce/multi_tensor.hpp) uploaded to one device.
template <class T>
class device_pointer_table {
 public:
  device_pointer_table(const std::vector<T*>& pointers, int variables, int device)
      : variables_(variables), pointers_(cuda_device_memory{device}.allocate<T*>(pointers.size(), 256)) {
    detail::device_guard on(device);
    detail::copy_to_device_now(pointers_.get(), pointers.data(), pointers.size() * sizeof(T*));
  }
  pointer_table<T> view() const { return {pointers_.get(), variables_}; }
  pointer_table<const T> const_view() const { return {pointers_.get(), variables_}; }

 private:
  int variables_;
  cuda_device_memory::owner<T*> pointers_;
};

}  // namespace towerpipe
