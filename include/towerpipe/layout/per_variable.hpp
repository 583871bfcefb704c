#pragma once
// layout::per_variable<T> — every variable in its own allocation, as TensorFlow keeps them.
//
// A layout is a policy: `value_type` plus `buffer<Memory>`, the storage of one role (the parameters,
// one tower's gradients, one optimizer slot) for a whole variable_set, allocated through a memory
// space object (host_memory, cuda_device_memory{device}). Every buffer offers view(i) / data(i) for
// variable i; the backends need nothing else.

#include <cstddef>
#include <vector>

#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"

namespace towerpipe {
namespace layout {

template <class T>
struct per_variable {
  using value_type = T;
  static constexpr const char* name = "per_variable";
  // Each allocation starts on a 256-byte boundary, like cudaMalloc's, so vector loads stay aligned.
  static constexpr std::size_t alignment = 256;

  // buffer<Memory, U> holds U instead of T (mixed precision: fp32 master and state beside bf16 towers).
  template <class Memory, class U = T>
  class buffer {
   public:
    explicit buffer(const variable_set& variables, const Memory& memory = Memory{}) : variables_(&variables) {
      allocations_.reserve(variables.count());
      for (const variable& v : variables) allocations_.push_back(memory.template allocate<U>(v.size, alignment));
    }

    U* data(std::size_t index) const { return allocations_[index].get(); }
    tensor_view<U> view(std::size_t index) const { return {data(index), (*variables_)[index].shape}; }
    const variable_set& variables() const { return *variables_; }

   private:
    const variable_set* variables_;
    std::vector<typename Memory::template owner<U>> allocations_;
  };
};

}  // namespace layout
}  // namespace towerpipe
