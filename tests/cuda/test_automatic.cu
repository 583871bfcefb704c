// reduce::automatic with GPU towers (tests/cuda/gpu_support.cuh): on one GPU it picks device0
// (reduce/choice/chooser.hpp, rule 3), and timing every candidate on the first step changes no bit, with
// fp32 and bf16 towers.
#include "gpu_support.cuh"

using namespace gpu_tests;

// One GPU: device0 (reduce/choice/chooser.hpp, rule 3); timing all four candidates on the first step
// (each trial from the step's start, compared bit for bit) leaves the run bitwise the host's.
TEST_CASE("reduce::automatic picks device0 on one GPU, and timing every candidate changes no bit", "[gpu][backends][automatic]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  pipeline_options unchecked, checked;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = 1.0;
  for (pipeline_options options : {unchecked, checked}) {
    for (std::size_t trials : {0, 2}) {
      options.time_backends = trials;
      check_backend<reduce::automatic, optim::adam, layout::flat<float>>(4, adam, 900 + trials, options);
    }
  }
  pipeline_options one_device;
  one_device.devices = {0};
  pipeline<exec::cuda, reduce::automatic, optim::adam, layout::flat<float>> p(test_variables, test_inputs, 4, adam, one_device);
  CHECK(std::string(p.backend_name()) == "device0");
  CHECK(p.backend_reason().find("4 on GPU 0), one device") != std::string::npos);
}

// reduce::automatic with 16-bit GPU towers: on one GPU it runs device0, and timing every candidate on the
// first step (each trial compared bit for bit, the fp32 master too) leaves the run bitwise the host's.
TEST_CASE("reduce::automatic with bf16 towers: timing every candidate changes no bit", "[gpu][backends][automatic]") {
  pipeline_options timed;
  timed.time_backends = 2;
  for (std::size_t towers : {std::size_t{1}, std::size_t{4}})
    check_mixed_on_gpu<reduce::automatic, bfloat16, layout::flat<bfloat16>>(towers, 880 + towers, timed);
}
