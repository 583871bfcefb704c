// Gradient buckets marked during the towers on every GPU backend (tests/cuda/gpu_support.cuh:
// check_buckets): bitwise the unbucketed host pipeline, and taken during the towers where they can be.
#include "gpu_support.cuh"

using namespace gpu_tests;

TEST_CASE("gradient buckets marked during the towers change no bit on any GPU backend", "[gpu][backends][overlap]") {
  check_buckets_everywhere<reduce::device0>(700);
  check_buckets_everywhere<reduce::p2p_tree>(710);
  check_buckets_everywhere<reduce::sharded>(720);
  check_buckets_everywhere<reduce::host>(730);
}
