// device0 and p2p_tree with bf16 and fp16 towers, bitwise the host's mixed-precision pipeline
// (tests/cuda/gpu_support.cuh): 1..8 towers, in place and copied, buckets during the towers, and the
// steps' options (NaN steps, fp16 loss scaling, poisoning, checkpoints).
#include "gpu_support.cuh"

using namespace gpu_tests;

TEST_CASE("device0 with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::device0>(700);
}

// p2p_tree's fp32 partial sums beside the 16-bit gradients, in place and copied raw or as partials.
TEST_CASE("p2p_tree with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::p2p_tree>(740);
  pipeline_options copied;
  copied.direct_device_access = false;
  check_mixed_for_tower_counts<reduce::p2p_tree>(760, copied);
}

TEST_CASE("16-bit towers' gradient buckets taken during the towers change no bit on device0 and p2p_tree",
          "[gpu][backends][overlap]") {
  check_mixed_for_tower_counts<reduce::device0>(800, {}, true);
  check_mixed_for_tower_counts<reduce::p2p_tree>(820, {}, true);
}

TEST_CASE("device0 and p2p_tree with 16-bit towers: NaN steps, fp16 loss scaling, poisoning and checkpoints as the host's",
          "[gpu][steps]") {
  check_mixed_steps<reduce::device0>(1200);
  check_mixed_steps<reduce::p2p_tree>(1210);
}
