// reduce::host with GPU towers (the average and the optimizer on the CPU, the towers' buffers moved in
// transfer groups): every optimizer and layout bitwise the host pipeline (tests/cuda/gpu_support.cuh),
// and a model above one transfer group (reduce/host/device_towers.hpp: group_elements).
#include "gpu_support.cuh"

using namespace gpu_tests;
using towerpipe_tests::run_case;

TEST_CASE("reduce::host with GPU towers equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::host, layout::flat<float>>(500);
}
TEST_CASE("reduce::host with GPU towers equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::host, layout::per_variable<float>>(600);
}

// 2.2 M parameters: two transfer groups of 2^21 elements (the download of one overlapping the CPU's work
// on the other), checked with a NaN step and unchecked, every step's values bitwise the host pipeline's.
TEST_CASE("reduce::host with a model above one transfer group equals the host pipeline bitwise", "[gpu][backends]") {
  const variable_set large{{"w", {1100, 2000}}, {"b", {70}}, {"s", {}}, {"odd", {5003}}};
  REQUIRE(large.total_size() > (std::size_t(1) << 21));
  check_on_gpu<reduce::host, layout::flat<float>>(2, run_case{towerpipe_tests::clipped({}), true, 3, 1}, 620, large);
  check_on_gpu<reduce::host, layout::per_variable<float>>(3, run_case{towerpipe_tests::unchecked(), false, 2}, 621, large);
}
