#pragma once
// The models' backward passes (mlp.hpp, cnn.hpp, mlp_cuda.cuh, cnn_cudnn.cuh) take an optional
// ready(i), called once for each variable i as soon as the pass has written i's gradient for good and
// will not read i's parameter again: a layer's weight and bias together, last layer first. A tower
// passes it on to tower.gradient_ready(i), so that the pipeline reduces the layer's gradient bucket while
// the rest of the backward pass runs (include/towerpipe/plan/buckets.hpp). no_ready_marks, the default,
// drops the marks: callers that want only the gradients (the tests) need not know of them.

#include <cstddef>

namespace towerpipe_examples {

struct no_ready_marks {
  void operator()(std::size_t) const {}
};

}  // namespace towerpipe_examples
