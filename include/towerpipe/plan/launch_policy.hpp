#pragma once
// The launch policy of the multi-tensor kernels (cuda/multi_tensor_dispatch.cuh) and its checks, in plain
// C++: every executor that runs the agents (the CUDA kernels, the simulated devices) takes the same
// policies and checks them the same way.
// Why: docs/design-notes.md#plan-launch_policy

#include <cstddef>

namespace towerpipe {

// Launch shape of the multi-tensor kernels (reduce::device0_with<Policy>, reduce::p2p_tree_with<Policy>).
struct multi_tensor_policy {
  static constexpr int threads_per_block = 256;
  static constexpr std::size_t chunk_elements = 4096;
  static constexpr unsigned vector_elements = 4;
};

namespace detail {

// Chunks start on multiples of chunk_elements of 256-byte-aligned variables; groups start on multiples of
// vector_elements inside them. Both must keep a vector of T aligned.
template <class Policy, class T>
constexpr bool check_multi_tensor_policy() {
  static_assert(Policy::threads_per_block > 0 && Policy::threads_per_block <= 1024,
                "towerpipe: multi_tensor policy: threads_per_block must be in 1..1024");
  static_assert(Policy::vector_elements == 1 || Policy::vector_elements == 2 || Policy::vector_elements == 4,
                "towerpipe: multi_tensor policy: vector_elements must be 1, 2 or 4");
  static_assert(256 % (Policy::vector_elements * sizeof(T)) == 0 && Policy::vector_elements * sizeof(T) <= 32,
                "towerpipe: multi_tensor policy: a vector of vector_elements values must divide 256 bytes");
  static_assert((Policy::chunk_elements * sizeof(T)) % 256 == 0,
                "towerpipe: multi_tensor policy: chunks must start 256-byte aligned");
  return true;
}

}  // namespace detail
}  // namespace towerpipe
