// The pipeline's options on every GPU backend, bitwise the host pipeline with the same options
// (tests/cuda/gpu_support.cuh): gradient poisoning and dynamic loss scaling (fp32 towers; 16-bit towers
// in test_mixed_steps.cu), accumulation over several micro-batches, and on_nonfinite = throw_error.
#include "gpu_support.cuh"

using namespace gpu_tests;
using towerpipe_tests::run_case;

TEST_CASE("device backends take the pipeline's options, equal to the host pipeline bitwise", "[gpu][options]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  // Gradient poisoning, and dynamic loss scaling (its NaN step skipped, its scale grown every 3 steps);
  // both checked and clipped, against the host pipeline with the same options.
  pipeline_options poisoned, scaled;
  poisoned.poison_gradients = true;
  poisoned.max_grad_norm = scaled.max_grad_norm = 1.0;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  scaled.loss_scale.initial_scale = 2.0;
  scaled.loss_scale.growth_interval = 3;
  for (const pipeline_options& options : {poisoned, scaled}) {
    for (std::size_t towers : {std::size_t(1), std::size_t(3), std::size_t(4)}) {
      if (towers > max_towers()) continue;
      check_backend<reduce::device0, optim::adam, layout::flat<float>>(towers, adam, 900 + towers, options);
      check_backend<reduce::p2p_tree, optim::adam, layout::per_variable<float>>(towers, adam, 910 + towers, options);
      check_backend<reduce::sharded, optim::adam, layout::flat<float>>(towers, adam, 920 + towers, options);
      check_backend<reduce::host, optim::adam, layout::flat<float>>(towers, adam, 950 + towers, options);
    }
  }
}

// accumulation_steps = 3: the towers' gradients summed over micro-batches on the device, the running sum
// read back at each micro-batch after the first (a NaN inside a window skips that window), buckets marked
// during the towers or not; every step's report and values bitwise the host pipeline's.
TEST_CASE("accumulation over several micro-batches on every GPU backend equals the host pipeline bitwise", "[gpu][steps]") {
  pipeline_options accumulating = towerpipe_tests::small_buckets({});
  accumulating.accumulation_steps = 3;
  pipeline_options plain;
  plain.accumulation_steps = 2;
  plain.max_grad_norm = 0.5;
  const auto each = [&](auto reduce, std::uint64_t salt) {
    using R = decltype(reduce);
    check_on_gpu<R, layout::flat<float>>(3, run_case{accumulating, true, 7, 4}, salt);
    check_on_gpu<R, layout::per_variable<float>>(2, run_case{plain, false, 6}, salt + 1);
  };
  each(reduce::device0{}, 1000);
  each(reduce::p2p_tree{}, 1010);
  each(reduce::sharded{}, 1020);
  each(reduce::host{}, 1030);
}

// on_nonfinite = throw_error: the NaN step throws, naming the element and the tower, changes nothing,
// on every GPU backend.
TEST_CASE("on_nonfinite = throw_error on GPU towers throws, names the element and changes nothing", "[gpu][steps]") {
  const auto each = [&](auto reduce, std::uint64_t salt) {
    using R = decltype(reduce);
    INFO(R::name);
    pipeline_options throwing;
    throwing.on_nonfinite = nonfinite_policy::throw_error;
    pipeline<exec::cuda, R, optim::adam, layout::flat<float>> p(test_variables, test_inputs, 3, {}, throwing);
    random_source random(salt);
    auto plan = towerpipe_tests::draw_plan<float>(random, test_variables, 3, 1);
    const auto initial = p.parameter(3);
    const std::vector<float> before(initial.begin(), initial.end());
    plan[0][1][3][17] = std::nanf("");
    CHECK_THROWS_WITH(towerpipe_tests::run_step(p, plan[0], 8, true),
                      Catch::Contains("non-finite averaged gradient at element 17") && Catch::Contains("tower 1's gradient"));
    CHECK(p.steps_done() == 0);
    CHECK(first_bitwise_difference(p.parameter(3), before) == -1);
  };
  each(reduce::device0{}, 1100);
  each(reduce::p2p_tree{}, 1110);
  each(reduce::sharded{}, 1120);
  each(reduce::host{}, 1130);
}
