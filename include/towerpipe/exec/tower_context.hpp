#pragma once
// What every tower function sees, whatever the execution space: its index, its shard of the batch and
// weight, the parameters, and its gradient buffers, into which it writes the MEAN gradient over its
// shard. Every variable's gradient must be written each step, through gradient(i) (a writable view,
// which counts as written) or the execution space's write_gradient(i, values, count). Views point into
// the execution space's memory: host memory for exec::host, the tower's device for exec::cuda.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/layout/batch.hpp"

namespace towerpipe {

template <class Buffer, class T>
class tower_context_base {
 public:
  using value_type = T;

  std::size_t tower() const { return tower_; }
  std::size_t towers() const { return towers_; }
  const towerpipe::batch& shard() const { return shard_; }
  template <class U>
  batch_view<U> input(const std::string& name) const { return shard_.input<U>(name); }
  std::size_t examples() const { return shard_.examples(); }
  double weight() const { return weight_; }  // this tower's share of the batch, b_i / B
  const variable_set& variables() const { return parameters_->variables(); }

  tensor_view<const T> parameter(std::size_t index) const {
    variables().check_index(index);
    return parameters_->view(index);
  }
  tensor_view<const T> parameter(const std::string& name) const { return parameter(variables().index_of(name)); }

  tensor_view<T> gradient(std::size_t index) {
    variables().check_index(index);
    (*written_)[index] = 1;
    return gradients_->view(index);
  }
  tensor_view<T> gradient(const std::string& name) { return gradient(variables().index_of(name)); }

 protected:
  tower_context_base(std::size_t tower, std::size_t towers, towerpipe::batch shard, double weight,
                     const Buffer* parameters, Buffer* gradients, std::vector<char>* written)
      : tower_(tower),
        towers_(towers),
        shard_(std::move(shard)),
        weight_(weight),
        parameters_(parameters),
        gradients_(gradients),
        written_(written) {}

  // Checks a whole-variable gradient write and marks it; returns where it goes.
  T* gradient_destination(std::size_t index, std::size_t count) {
    variables().check_index(index);
    const variable& v = variables()[index];
    if (count != v.size)
      detail::fail("gradient of variable '", v.name, "' written with ", count, " elements; its shape ",
                   to_string(v.shape), " holds ", v.size);
    (*written_)[index] = 1;
    return gradients_->data(index);
  }

 private:
  std::size_t tower_, towers_;
  towerpipe::batch shard_;
  double weight_;
  const Buffer* parameters_;
  Buffer* gradients_;
  std::vector<char>* written_;
};

}  // namespace towerpipe
