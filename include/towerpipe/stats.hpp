#pragma once
// What one pipeline step reports.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace towerpipe {

// Seconds of each stage of one step. split and towers are host clock times; reduce and broadcast are
// as the backend measures them: CUDA event times on the devices for reduce::device0 and reduce::p2p_tree
// (from the last tower's gradients being ready; kernel launches included), host clock times for
// reduce::host.
struct stage_seconds {
  double split = 0;      // validating this step's batch and cutting it into shards (on GPUs, staging them),
                         // timed when stage() ran, which may have been during the step before
  double towers = 0;     // the tower functions, from the first start to the last end
  double reduce = 0;     // average + optimizer (fused with the broadcast for device0)
  double broadcast = 0;  // new parameters to the towers' replicas: p2p_tree's pulls down the tree, reduce::host's
                         // uploads; none for device0 (fused) and exec::host (shared parameters)
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
