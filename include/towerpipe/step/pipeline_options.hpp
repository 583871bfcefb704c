#pragma once
// Run-time options of a pipeline; each execution space reads the ones that concern it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/data/split.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {

namespace sim {
class machine;  // executor/simulated/machine.hpp
}  // namespace sim

// The most trials pipeline_options::time_backends takes: each one runs every candidate's reduction of the
// first step again, and the median of a few already tells them apart.
constexpr std::size_t max_time_backends = 100;

// What a step does when the towers' averaged gradient holds an infinity or a NaN.
enum class nonfinite_policy {
  skip,         // the step changes nothing (parameters, optimizer state, replicas, step count) and says where
                // in step_stats::nonfinite; the next step runs normally
  throw_error,  // the same, and step() throws a towerpipe::error naming tower, variable and element
  unchecked,    // no check, one fused pass (the fastest): a non-finite gradient reaches the parameters
};

// Loss scaling with torch.cuda.amp.GradScaler's semantics and defaults. The tower functions multiply
// their loss by pipeline::loss_scale() before differentiating; a checked step divides the average by
// it (folded into the towers' weights: exact for powers of two, which the defaults keep the scale at)
// before it screens, clips and applies. dynamic: a non-finite step is skipped and the scale multiplied
// by backoff_factor; after growth_interval good steps in a row it is multiplied by growth_factor.
enum class loss_scale_mode { off, fixed, dynamic };
struct loss_scaling {
  loss_scale_mode mode = loss_scale_mode::off;
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

struct pipeline_options {
  split_policy split = split_policy::weighted;
  // CPU threads that run the tower functions and the host reduction; 0: the machine's cores.
  std::size_t host_threads = 0;
  // exec::cuda: tower i runs on devices[i % devices.size()]; empty: towers round-robin over every
  // visible device. Several towers may share a device.
  std::vector<int> devices;
  // exec::cuda: whether the device reductions read and write other towers' buffers directly where they
  // can (one device, or peer access between two), or copy them everywhere (cudaMemcpyPeerAsync), as they
  // do between devices without peer access. false is slower; it serves machines whose peer access is
  // unreliable, and tests of the copying paths on any machine, one GPU included.
  bool direct_device_access = true;
  // exec::simulated: the simulated machine the towers run on (its devices, peer access, interleaving
  // seed; exec/simulated.hpp); null: a machine of one device.
  std::shared_ptr<sim::machine> simulation;
  // Where steps record their spans (trace/timeline.hpp); null: no recording. Must outlive the pipeline.
  timeline* trace = nullptr;
  // Debug: before each tower function, fill its gradient buffers with a signalling-NaN pattern, and fail
  // the step on any element still holding it afterwards (exec/tower_context.hpp, the gradient contract).
  // Costs a fill and a scan of every gradient per tower and step.
  bool poison_gradients = false;

  // A checked step (anything but unchecked, or clipping on) averages first, screens the average
  // (kernels/screen.hpp) and applies second: 2 sizeof(T) more bytes per parameter than one fused pass.
  nonfinite_policy on_nonfinite = nonfinite_policy::skip;
  // Global-norm clipping of the averaged gradient, as torch.nn.utils.clip_grad_norm_(max_norm): the
  // gradient is multiplied by min(1, max_grad_norm / (norm + 1e-6)) before the optimizer. 0: off.
  double max_grad_norm = 0;
  // Off by default; fixed or dynamic need a checked step (dynamic: on_nonfinite = skip).
  loss_scaling loss_scale;
  // Gradient accumulation: the optimizer runs after every accumulation_steps-th step() call (a
  // micro-batch), on the average over all their examples: sum_m examples_m * average_m / sum_m examples_m,
  // added up micro-batch by micro-batch in the screen's buffer (a checked step). Equal to one step on
  // the concatenated batch up to rounding; bitwise the plain step for 1.
  std::size_t accumulation_steps = 1;

  // Gradient buckets (plan/buckets.hpp): which variables are reduced together once every tower has
  // marked them ready (tower_context::gradient_ready). By default reverse declaration order, at most
  // 25 MiB of gradient a bucket, the first at most 1 MiB. Results are bitwise the same for every choice.
  gradient_buckets buckets;
  // Whether a bucket is reduced while the towers still run (every backend can; docs/guide.md says where
  // one reduces after the towers instead), or every bucket after them. false changes no result.
  bool overlap_reduction = true;

  // reduce::automatic: time each candidate backend this many times on the first step that applies the
  // optimizer, on that step's own gradients, and keep the fastest (median); 0: the rule alone
  // (reduce/choice/chooser.hpp). The candidates' results are compared bit for bit while timing (a
  // difference throws, naming the backends and the variable, and changes nothing). Each trial starts
  // from the parameters, optimizer state and gradients the step began with, so the step is applied
  // once: training is bitwise the same as without timing, the tower functions run once, and only that
  // step takes longer. Every bucket of that step is reduced after the towers. Not with
  // accumulation_steps > 1. At most max_time_backends (100).
  std::size_t time_backends = 0;

  // reduce::sharded: the processes the towers span (comm/mpi.hpp: mpi_process_group; for GPU towers also
  // comm/nccl.cuh: nccl_process_group), each running one pipeline with the same number of towers; empty:
  // this process alone. Shared, so that several pipelines may use one group.
  std::shared_ptr<process_group> processes;
  // Across processes, each stages its own part of the global batch (pipeline::process_part); a step
  // whose processes staged byte-identical parts (sampled digests equal: as when every process gives the
  // whole batch) is refused, naming the ranks. true: the processes may see the same data on purpose
  // (synthetic data, benchmarks).
  bool identical_process_parts = false;
};

namespace detail {

// Whether steps take the checked passes (kernels/screen.hpp) rather than the single fused one.
inline bool takes_checked_steps(const pipeline_options& options, bool mixed_precision) {
  return mixed_precision || options.on_nonfinite != nonfinite_policy::unchecked || options.max_grad_norm > 0 ||
         options.loss_scale.mode != loss_scale_mode::off || options.accumulation_steps > 1;
}

}  // namespace detail

}  // namespace towerpipe
