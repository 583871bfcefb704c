#pragma once
// Runs a multi-tensor agent (programs/agents.hpp) over a chunk table on the calling thread, as `threads`
// emulated threads each taking its share of every chunk in groups of W: the host form of the kernel
// launch (cuda/multi_tensor_kernel.cuh), for tests; and a screen tile (programs/screen.hpp) as a warp of
// the screen kernel computes it (cuda/screen_kernel.cuh).
#include <towerpipe/programs/agents.hpp>
#include <towerpipe/programs/screen.hpp>

#include <vector>

namespace towerpipe_tests {

template <unsigned W = 4, class Agent>
void run_agent_on_host(const Agent& agent, const std::vector<towerpipe::detail::tensor_chunk>& chunks,
                       unsigned threads = 3) {
  for (const towerpipe::detail::tensor_chunk& chunk : chunks) {
    for (unsigned thread = 0; thread < threads; ++thread) towerpipe::detail::process_chunk<W>(agent, chunk, thread, threads);
  }
}

// A screen tile: the kernel's 32 lanes one after another, then the tree the kernel takes with shuffles.
template <class Source, class T>
towerpipe::detail::screen_lane_result screen_tile_as_a_warp(const Source& source,
                                                            const towerpipe::detail::pointer_table<T>& averaged,
                                                            const towerpipe::detail::tensor_chunk& tile) {
  using namespace towerpipe::detail;
  double sums[screen_lanes];
  nonfinite_key first = no_nonfinite;
  for (unsigned lane = 0; lane < screen_lanes; ++lane) {
    const screen_lane_result r = screen_lane(source, averaged, tile, lane);
    sums[lane] = r.sum_of_squares;
    if (r.first_nonfinite < first) first = r.first_nonfinite;
  }
  return {pairwise_lane_sum(sums), first};
}

}  // namespace towerpipe_tests
