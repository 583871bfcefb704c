// Launch policies with narrower vector I/O than the default four floats (one and two elements) on
// device0 and p2p_tree, checked and unchecked, bitwise the host pipeline (tests/cuda/gpu_support.cuh).
// (reduce::sharded takes the default launch policy only: it has no launch-policy parameter.)
#include "gpu_support.cuh"

using namespace gpu_tests;

namespace {
template <class Reduce>
void check_narrow_vectors(std::uint64_t salt) {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  pipeline_options unchecked, checked;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = 1.0;
  for (const pipeline_options& options : {unchecked, checked}) {
    for (std::size_t towers : {std::size_t(1), std::size_t(2), std::size_t(5)}) {
      if (towers > max_towers()) continue;
      check_backend<Reduce, optim::adam, layout::flat<float>>(towers, adam, salt + towers, options);
    }
  }
}
}  // namespace

TEST_CASE("device0 with vectors of one and two elements equals the host pipeline bitwise", "[gpu][options]") {
  check_narrow_vectors<reduce::device0_with<vector_width_1>>(930);
  check_narrow_vectors<reduce::device0_with<vector_width_2>>(940);
}
TEST_CASE("p2p_tree with vectors of one and two elements equals the host pipeline bitwise", "[gpu][options]") {
  check_narrow_vectors<reduce::p2p_tree_with<vector_width_1>>(960);
  check_narrow_vectors<reduce::p2p_tree_with<vector_width_2>>(970);
}
