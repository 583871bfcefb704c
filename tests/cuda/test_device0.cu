// reduce::device0 with GPU towers: every optimizer and layout, in place and copying the towers' buffers
// (as between devices without peer access), bitwise the host pipeline (tests/cuda/gpu_support.cuh).
#include "gpu_support.cuh"

using namespace gpu_tests;

TEST_CASE("device0 equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::device0, layout::flat<float>>(100);
}
TEST_CASE("device0 equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::device0, layout::per_variable<float>>(200);
}
TEST_CASE("device0 copying instead of addressing other towers' buffers equals the host bitwise", "[gpu][copies]") {
  check_all_optimizers<reduce::device0, layout::flat<float>>(500, false);
}
