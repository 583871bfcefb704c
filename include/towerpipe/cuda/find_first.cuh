#pragma once
// Filling a buffer with a value and finding the first element equal to one, on a stream: what
// pipeline_options::poison_gradients does on GPU towers (core/gradient_poison.hpp has the pattern). The
// search keeps its result in a scratch word allocated once (first_equal_scratch), so that it never
// allocates on the device during a step: a cudaFree would synchronise the whole device from a tower's
// thread, serialising the other towers and any bucket pass in flight.

#include <cuda_runtime.h>

#include <cstddef>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
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

template <class U>
void launch_fill(U* data, std::size_t count, U value, const cuda_stream& stream) {
  if (count == 0) return;
  fill_kernel<<<grid_for(count), fill_threads, 0, stream.get()>>>(data, count, value);
  TOWERPIPE_CUDA_CHECK(cudaGetLastError());
}

// Waits for the stream: the index of the first element equal to `value`, or count.
template <class U>
std::size_t launch_find_first(const U* data, std::size_t count, U value, const cuda_stream& stream, const first_equal_scratch& scratch) {
  if (count == 0) return 0;
  TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(scratch.device(), 0xFF, sizeof(unsigned long long), stream.get()));
  first_equal_kernel<<<grid_for(count), fill_threads, 0, stream.get()>>>(data, count, value, scratch.device());
  TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(scratch.host(), scratch.device(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream.get()));
  TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  const unsigned long long first = *scratch.host();
  return first == ~0ull ? count : static_cast<std::size_t>(first);
}

}  // namespace detail
}  // namespace towerpipe
