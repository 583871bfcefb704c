#pragma once
// pipeline_options::poison_gradients for GPU towers (core/gradient_poison.hpp has the pattern): the fill
// and the scan run on the tower's stream with Thrust.

#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/find.h>

#include <cstddef>
#include <vector>

#include "towerpipe/core/gradient_poison.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/exec/tower_failures.hpp"

namespace towerpipe {
namespace detail {

template <class T>
auto* poison_bits(T* values) {
  return reinterpret_cast<typename gradient_poison<T>::bits_type*>(values);
}

template <class Buffer>
void poison_device_gradients(Buffer& gradients, const cuda_stream& stream) {
  for (std::size_t v = 0; v < gradients.variables().count(); ++v) {
    auto* bits = poison_bits(gradients.data(v));
    thrust::fill_n(thrust::cuda::par_nosync.on(stream.get()), bits, gradients.view(v).size(),
                   gradient_poison<std::remove_pointer_t<decltype(gradients.data(v))>>::bits);
  }
}

// After the tower's work on `stream`: throws if a written gradient still holds the poison somewhere.
template <class Buffer>
void check_device_gradients_written(const Buffer& gradients, const std::vector<char>& written,
                                    const cuda_stream& stream) {
  for (std::size_t v = 0; v < gradients.variables().count(); ++v) {
    if (!written[v]) continue;  // reported with the tower by throw_tower_failures
    const auto* bits = poison_bits(gradients.data(v));
    const std::size_t size = gradients.view(v).size();
    const auto* found = thrust::find(thrust::cuda::par.on(stream.get()), bits, bits + size,
                                     gradient_poison<std::remove_pointer_t<decltype(gradients.data(v))>>::bits);
    if (found != bits + size) fail_unwritten_element(gradients.variables()[v], static_cast<std::size_t>(found - bits));
  }
}

}  // namespace detail
}  // namespace towerpipe
