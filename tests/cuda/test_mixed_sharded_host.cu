// reduce::sharded and reduce::host with bf16 and fp16 GPU towers, bitwise the host's mixed-precision
// pipeline (tests/cuda/gpu_support.cuh): 1..8 towers, in place and copied, buckets during the towers, and
// the steps' options (NaN steps, fp16 loss scaling, poisoning, checkpoints).
#include "gpu_support.cuh"

using namespace gpu_tests;

// Each owner keeps its slice of the fp32 master; the copying paths (direct_device_access off) copy the
// 16-bit gradients in and the rounded replicas out.
TEST_CASE("sharded with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::sharded>(750);
  pipeline_options copied;
  copied.direct_device_access = false;
  check_mixed_for_tower_counts<reduce::sharded>(800, copied);
}

// 16-bit downloads and uploads, the fp32 master on the host.
TEST_CASE("reduce::host with bf16 and fp16 GPU towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::host>(780);
}

TEST_CASE("16-bit towers' gradient buckets taken during the towers change no bit on sharded and reduce::host",
          "[gpu][backends][overlap]") {
  check_mixed_for_tower_counts<reduce::host>(840, {}, true);
  check_mixed_for_tower_counts<reduce::sharded>(860, {}, true);
}

TEST_CASE("sharded and reduce::host with 16-bit towers: NaN steps, fp16 loss scaling, poisoning and checkpoints as the host's",
          "[gpu][steps]") {
  check_mixed_steps<reduce::sharded>(1220);
  check_mixed_steps<reduce::host>(1230);
}
