#pragma once
// The multi-tensor kernel. Layering as CUB's: the launch policy is a plain value struct
// (plan/launch_policy.hpp, testable on the host), the kernel is a thin loop that hands (chunk,
// thread) to the agent, and the agent (kernels/agents.hpp) holds all the math — which is why tests can
// run the same agents on the host.

#include <cuda_runtime.h>

#include <cstddef>

#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/launch_policy.hpp"

namespace towerpipe {
namespace detail {

template <class Agent, class Policy>
__global__ void __launch_bounds__(Policy::threads_per_block)
    multi_tensor_kernel(Agent agent, const tensor_chunk* chunks, int chunk_count) {
  for (int c = static_cast<int>(blockIdx.x); c < chunk_count; c += static_cast<int>(gridDim.x))
    process_chunk<Policy::vector_elements>(agent, chunks[c], threadIdx.x, Policy::threads_per_block);
}

}  // namespace detail
}  // namespace towerpipe
