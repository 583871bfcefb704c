#pragma once
// A GPU tower's view of the step (exec/tower_context.hpp has the gradient contract): the shard,
// parameters and gradients are in the tower's device memory, and work goes on stream().

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/exec/tower_context.hpp"

namespace towerpipe {
namespace detail {

template <class Layout>
class cuda_towers;

template <class Layout>
class cuda_tower_context : public tower_context_base<cuda_tower_context<Layout>,
                                                     typename Layout::template buffer<cuda_device_memory>,
                                                     typename Layout::value_type> {
  using base = tower_context_base<cuda_tower_context<Layout>, typename Layout::template buffer<cuda_device_memory>,
                                  typename Layout::value_type>;

 public:
  using value_type = typename Layout::value_type;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // A device float for tower functions that return nothing: they write their shard's mean loss here
  // (on stream()), and the step reads it back with the rest.
  float* device_loss() const { return device_loss_; }

 private:
  friend base;
  friend class cuda_towers<Layout>;
  template <class... BaseArguments>
  cuda_tower_context(int device, cudaStream_t stream, float* device_loss, BaseArguments&&... arguments)
      : base(std::forward<BaseArguments>(arguments)...), device_(device), stream_(stream), device_loss_(device_loss) {}

  void fill_zero(value_type* target, std::size_t count) const {
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(target, 0, count * sizeof(value_type), stream_));
  }
  // From device memory (this device, or one with peer access), on stream().
  void copy_into(value_type* target, const value_type* source, std::size_t count) const {
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(target, source, count * sizeof(value_type), cudaMemcpyDefault, stream_));
  }

  int device_;
  cudaStream_t stream_;
  float* device_loss_;
};

}  // namespace detail
}  // namespace towerpipe
