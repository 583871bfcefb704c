#pragma once
// Run-time options of a pipeline; each execution space reads the ones that concern it.

#include <cstddef>
#include <vector>

#include "towerpipe/split.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {

struct pipeline_options {
  split_policy split = split_policy::weighted;
  // CPU threads that run the tower functions and the host reduction; 0: the machine's cores.
  std::size_t host_threads = 0;
  // exec::cuda: tower i runs on devices[i % devices.size()]; empty: towers round-robin over every
  // visible device. Several towers may share a device.
  std::vector<int> devices;
  // Where steps record their spans (trace/timeline.hpp); null: no recording. Must outlive the pipeline.
  timeline* trace = nullptr;
  // Debug: before each tower function, fill its gradient buffers with a signalling-NaN pattern, and fail
  // the step on any element still holding it afterwards (exec/tower_context.hpp, the gradient contract).
  // Costs a fill and a scan of every gradient per tower and step.
  bool poison_gradients = false;
};

}  // namespace towerpipe
