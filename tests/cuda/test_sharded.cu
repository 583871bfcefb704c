// reduce::sharded with GPU towers: every optimizer and layout, in place and copying the towers' buffers
// (as between devices without peer access), bitwise the host pipeline (tests/cuda/gpu_support.cuh); the
// optimizer state spread over the towers.
#include "gpu_support.cuh"

using namespace gpu_tests;

TEST_CASE("sharded equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::sharded, layout::flat<float>>(300);
}
TEST_CASE("sharded equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::sharded, layout::per_variable<float>>(400);
}
TEST_CASE("sharded copying instead of addressing other towers' buffers equals the host bitwise", "[gpu][copies]") {
  check_all_optimizers<reduce::sharded, layout::flat<float>>(700, false);
  check_all_optimizers<reduce::sharded, layout::per_variable<float>>(800, false);
}

// reduce::sharded holds on each tower's device only its slice of the state: whole 4096-element chunks
// (multi_tensor_policy), each owner within one chunk of an equal share of the parameters.
TEST_CASE("sharded spreads the optimizer state over the towers, about 1/N each", "[gpu][backends]") {
  // The owners' compact storage pads each variable to a multiple of 64 elements (plan/owner_slices.hpp).
  double parameters = 0.0;
  for (const variable& v : test_variables) parameters += static_cast<double>((v.size + 63) / 64 * 64);
  const double slot_bytes = 4.0 * parameters;  // fp32
  for (std::size_t towers = min_towers(); towers <= max_towers(); ++towers) {
    pipeline<exec::cuda, reduce::sharded, optim::adam, layout::flat<float>> p(test_variables, test_inputs, towers, {});
    const std::vector<std::size_t> bytes = p.optimizer_state_bytes_per_tower();
    REQUIRE(bytes.size() == towers);
    double total = 0.0;
    for (std::size_t t = 0; t < towers; ++t) {
      INFO(towers << " towers, tower " << t << ": " << bytes[t] << " bytes");
      total += static_cast<double>(bytes[t]);
      CHECK(static_cast<double>(bytes[t]) <= 2.0 * (slot_bytes / static_cast<double>(towers) + 4.0 * 4096));
    }
    CHECK(total == 2.0 * slot_bytes);  // Adam's two slots, once in all
    std::printf("reduce::sharded, %zu towers: optimizer state per tower (bytes):", towers);
    for (std::size_t b : bytes) std::printf(" %zu", b);
    std::printf(" (device0 holds %.0f on tower 0)\n", 2.0 * slot_bytes);
  }
}
// One GPU: device0 (reduce/choice/chooser.hpp, rule 3); timing all four candidates on the first step
// (each trial from the step's start, compared bit for bit) leaves the run bitwise the host's.
