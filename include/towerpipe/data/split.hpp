#pragma once
// split: which examples of a batch each tower gets, and the weight of its mean gradient.
//
// Towers write the mean gradient over their shard; the reduction sums w_i * g_i. With w_i = b_i / B
// (b_i examples in shard i, B in the batch) that sum is the mean gradient over the whole batch,
// whether or not B divides evenly.

#include <cstddef>
#include <vector>

#include "towerpipe/core/error.hpp"

namespace towerpipe {

enum class split_policy {
  weighted,        // uneven batches: the first B % N towers get one example more; w_i = b_i / B
  drop_remainder,  // uneven batches: the last B % N examples are dropped; every w_i = 1 / N
};

struct shard {
  std::size_t first = 0;  // index of the shard's first example in the batch
  std::size_t examples = 0;
  double weight = 0;  // b_i / B, B counting only the examples used
};

inline std::vector<shard> plan_split(std::size_t examples, std::size_t towers, split_policy policy) {
  if (towers == 0) detail::fail("cannot split a batch across zero towers");
  if (examples < towers)
    detail::fail("a batch of ", examples, " examples cannot be split across ", towers,
                 " towers: every tower needs at least one example");
  const std::size_t base = examples / towers;
  const std::size_t extra = policy == split_policy::weighted ? examples % towers : 0;
  const std::size_t used = base * towers + extra;
  std::vector<shard> shards(towers);
  std::size_t first = 0;
  for (std::size_t i = 0; i < towers; ++i) {
    shards[i].first = first;
    shards[i].examples = base + (i < extra ? 1 : 0);
    shards[i].weight = static_cast<double>(shards[i].examples) / static_cast<double>(used);
    first += shards[i].examples;
  }
  return shards;
}

// The examples of a global batch that one process of several stages (reduce::sharded across processes):
// the shards that one process with every tower (processes x towers_per_process, rank-major) would give
// to this process's towers. Staging exactly this part makes the processes' step the one-process step.
struct batch_part {
  std::size_t first = 0;  // index of the part's first example in the global batch
  std::size_t examples = 0;
};

inline batch_part process_part_of(std::size_t global_examples, std::size_t towers_per_process, std::size_t processes,
                                  std::size_t rank, split_policy policy) {
  if (rank >= processes) detail::fail("process_part_of: rank ", rank, " of ", processes, " processes");
  const std::vector<shard> shards = plan_split(global_examples, towers_per_process * processes, policy);
  batch_part part{shards[rank * towers_per_process].first, 0};
  for (std::size_t t = 0; t < towers_per_process; ++t) part.examples += shards[rank * towers_per_process + t].examples;
  return part;
}

}  // namespace towerpipe
