#pragma once
// The host form of the device reducers' launches and copies: a multi-tensor agent (kernels/agents.hpp)
// over a chunk table as `threads` emulated threads, each taking its share of every chunk in groups of
// W (cuda/multi_tensor_kernel.cuh); a screen tile as a warp of the screen kernel computes it
// (cuda/screen_kernel.cuh); a copy list (plan/copy_list.hpp). The host tests run the reducers'
// own tables and copies through these.

#include <algorithm>
#include <vector>

#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/copy_list.hpp"
#include "towerpipe/kernels/screen.hpp"

namespace towerpipe {
namespace detail {

template <unsigned W = 4, class Agent>
void run_agent_on_host(const Agent& agent, const std::vector<tensor_chunk>& chunks, unsigned threads = 3) {
  for (const tensor_chunk& chunk : chunks) {
    for (unsigned thread = 0; thread < threads; ++thread) process_chunk<W>(agent, chunk, thread, threads);
  }
}

// A screen tile: the kernel's 32 lanes one after another, then the tree the kernel takes with shuffles.
template <class Source, class T>
screen_lane_result screen_tile_as_a_warp(const Source& source, const pointer_table<T>& averaged, const tensor_chunk& tile) {
  double sums[screen_lanes];
  nonfinite_key first = no_nonfinite;
  for (unsigned lane = 0; lane < screen_lanes; ++lane) {
    const screen_lane_result r = screen_lane(source, averaged, tile, lane);
    sums[lane] = r.sum_of_squares;
    if (r.first_nonfinite < first) first = r.first_nonfinite;
  }
  return {pairwise_lane_sum(sums), first};
}

template <class T>
void run_copies_on_host(const copy_list<T>& copies) {
  for (const peer_copy<T>& c : copies) std::copy_n(c.source, c.elements, c.target);
}

}  // namespace detail
}  // namespace towerpipe
