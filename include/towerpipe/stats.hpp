#pragma once
// What one pipeline step reports.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace towerpipe {

// Wall-clock seconds of each stage of one step, measured on the host.
struct stage_seconds {
  double split = 0;      // validating the batch and cutting it into shards (and, on GPUs, staging them)
  double towers = 0;     // the tower functions, from the first start to the last end
  double reduce = 0;     // average + optimizer, fused, as the backend measures it (device time on GPUs)
  double broadcast = 0;  // new parameters to the towers' replicas (none for exec::host: shared parameters)
};

struct step_stats {
  std::int64_t step = 0;       // the optimizer step this was, counting from 1
  std::size_t examples = 0;    // examples used (a drop_remainder split may leave some out)
  std::vector<double> tower_loss;  // each tower's loss over its shard
  double loss = 0;             // sum of weight_i * tower_loss_i: the loss over the whole batch
  double seconds = 0;
  double examples_per_second = 0;
  stage_seconds stages;
};

}  // namespace towerpipe
