#pragma once
// The multi-tensor kernel and its launch policy. Layering as CUB's: the policy is a plain value struct
// (testable on the host), the kernel is a thin loop that hands (chunk, thread) to the agent, and the
// agent (programs/agents.hpp) holds all the math — which is why tests can run the same agents on the host.

#include <cuda_runtime.h>

#include <cstddef>

#include "towerpipe/programs/agents.hpp"
#include "towerpipe/programs/chunk_table.hpp"

namespace towerpipe {

// Launch shape of the multi-tensor kernels. A block strides through one chunk of the table with
// threads_per_block threads in groups of vector_elements elements, each group one vector load per role
// (4 floats: 16 bytes); chunk_elements / threads_per_block elements per thread (16 for the defaults: 4
// vector loads per role) keep each thread's loads in flight. Used as reduce::device0_with<Policy> and
// reduce::p2p_tree_with<Policy>.
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

template <class Agent, class Policy>
__global__ void __launch_bounds__(Policy::threads_per_block)
    multi_tensor_kernel(Agent agent, const tensor_chunk* chunks, int chunk_count) {
  for (int c = static_cast<int>(blockIdx.x); c < chunk_count; c += static_cast<int>(gridDim.x))
    process_chunk<Policy::vector_elements>(agent, chunks[c], threadIdx.x, Policy::threads_per_block);
}

}  // namespace detail
}  // namespace towerpipe
