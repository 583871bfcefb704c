#pragma once
// Runs a multi-tensor agent (reduce/agents.hpp) over a chunk table on the calling thread, as `threads`
// emulated threads each taking its share of every chunk in groups of W: the host form of the kernel
// launch (cuda/multi_tensor_kernel.cuh), for tests.
#include <towerpipe/reduce/agents.hpp>

#include <vector>

namespace towerpipe_tests {

template <unsigned W = 4, class Agent>
void run_agent_on_host(const Agent& agent, const std::vector<towerpipe::detail::tensor_chunk>& chunks,
                       unsigned threads = 3) {
  for (const towerpipe::detail::tensor_chunk& chunk : chunks) {
    for (unsigned thread = 0; thread < threads; ++thread) towerpipe::detail::process_chunk<W>(agent, chunk, thread, threads);
  }
}

}  // namespace towerpipe_tests
