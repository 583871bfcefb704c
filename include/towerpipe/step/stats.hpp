#pragma once
// What one pipeline step reports.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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
  // Gradient buckets reduced while the towers ran (tower_context::gradient_ready): the worker's seconds
  // on them, hidden behind the towers (not in `reduce`, which counts only what came after them).
  double reduce_during_towers = 0;
};

// The first non-finite value of a step's averaged gradient, in (variable, element) order.
struct nonfinite_gradient {
  std::size_t variable = 0;
  std::string variable_name;
  std::size_t element = 0;  // flat index into the variable
  std::string index;        // the same by shape, "(3, 17)"
  // The lowest-numbered tower whose own gradient is non-finite at that element; empty when every tower's
  // value was finite and their weighted sum overflowed.
  std::optional<std::size_t> tower;
};

struct step_stats {
  std::int64_t step = 0;       // the optimizer step this was, counting from 1
  std::size_t examples = 0;    // examples used (a drop_remainder split may leave some out)
  // Losses unscaled: what the towers returned divided by loss_scale (they return their loss times
  // pipeline::loss_scale(), pipeline_options::loss_scale; 1 when that is off).
  std::vector<double> tower_loss;  // each tower's loss over its shard
  double loss = 0;                 // sum of weight_i * tower_loss_i: the loss over the whole batch
  double scaled_loss = 0;          // loss * loss_scale: the weighted sum of what the towers returned
  double seconds = 0;  // this step() call's
  // The optimizer step's: its micro-batches' examples so far over their step() seconds so far (with
  // pipeline_options::accumulation_steps = k, the k-th micro-batch reports the whole optimizer step's).
  double examples_per_second = 0;
  stage_seconds stages;
  std::size_t buckets = 1;                // gradient buckets of the step (pipeline_options::buckets)
  std::size_t buckets_during_towers = 0;  // of them, reduced while the towers ran

  // Checked steps (pipeline_options::on_nonfinite, max_grad_norm):
  bool skipped = false;                         // a non-finite gradient: nothing was updated
  std::optional<nonfinite_gradient> nonfinite;  // where, when the average was not finite
  // L2 norm of the averaged gradient, before clipping; empty when the step is unchecked
  // (on_nonfinite = unchecked) or a micro-batch that accumulates (the norm is the whole window's)
  std::optional<double> gradient_norm;
  double clip_coefficient = 1;                  // what the averaged gradient was multiplied by
  double loss_scale = 1;                        // the loss scale of this step (pipeline_options::loss_scale)
  // Gradient accumulation (pipeline_options::accumulation_steps): which micro-batch of `step` this was,
  // from 1; true while the optimizer waits for more.
  std::size_t micro_batch = 1;
  bool accumulating = false;
};

}  // namespace towerpipe
