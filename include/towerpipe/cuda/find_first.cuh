#pragma once
// The kernels of cuda_executor::fill_async and find_first (filling a buffer with a value, finding the first element
// equal to one): what pipeline_options::poison_gradients does on GPU towers (core/gradient_poison.hpp has the
// pattern). The search keeps its result in a scratch word allocated once (first_equal_scratch), so that it never
// allocates on the device during a step: a cudaFree would synchronise the whole device from a tower's
// thread, serialising the other towers and any bucket pass in flight.

#include <cuda_runtime.h>

#include <cstddef>

#include "towerpipe/cuda/memory.cuh"

namespace towerpipe {
namespace detail {

constexpr unsigned fill_threads = 256;

template <class U>
__global__ void __launch_bounds__(fill_threads) fill_kernel(U* data, std::size_t count, U value) {
  for (std::size_t i = blockIdx.x * std::size_t(fill_threads) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * fill_threads)
    data[i] = value;
}

template <class U>
__global__ void __launch_bounds__(fill_threads)
    first_equal_kernel(const U* data, std::size_t count, U value, unsigned long long* first) {
  for (std::size_t i = blockIdx.x * std::size_t(fill_threads) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * fill_threads) {
    if (data[i] == value) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;  // this thread's later elements come after i
    }
  }
}

// The result word on the device and its pinned host copy, one pair per tower.
class first_equal_scratch {
 public:
  template <class Executor>
  first_equal_scratch(const Executor&, int device)
      : device_(cuda_device_memory{device}.allocate<unsigned long long>(1, 256)), host_(cuda_pinned_memory{}.allocate<unsigned long long>(1)) {}
  unsigned long long* device() const { return device_.get(); }
  unsigned long long* host() const { return host_.get(); }

 private:
  cuda_device_memory::owner<unsigned long long> device_;
  cuda_pinned_memory::owner<unsigned long long> host_;
};

inline unsigned grid_for(std::size_t count) {
  const std::size_t blocks = (count + fill_threads - 1) / fill_threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

}  // namespace detail
}  // namespace towerpipe
