// reduce::p2p_tree with GPU towers: every optimizer and layout, in place and copying the towers' buffers
// (as between devices without peer access), bitwise the host pipeline (tests/cuda/gpu_support.cuh).
#include "gpu_support.cuh"

using namespace gpu_tests;

TEST_CASE("p2p_tree equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::p2p_tree, layout::flat<float>>(300);
}
TEST_CASE("p2p_tree equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::p2p_tree, layout::per_variable<float>>(400);
}
TEST_CASE("p2p_tree copying instead of addressing other towers' buffers equals the host bitwise", "[gpu][copies]") {
  check_all_optimizers<reduce::p2p_tree, layout::per_variable<float>>(600, false);
}
