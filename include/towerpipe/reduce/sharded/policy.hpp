#pragma once
// reduce::sharded — the optimizer sharded over the processes of a pipeline (pipeline_options::processes,
// comm/process_group.hpp; one process without it), for host towers (reduce/sharded/host_towers.hpp) and device towers
// (reduce/sharded/device_towers_across_processes.hpp); or, for device towers in one process, over their
// devices (reduce/sharded/device_towers.hpp).
// Bitwise equal to one process with the same total towers (docs/guide.md, invariant 2), whatever the process
// count.
//
// The partition is the one of GPU towers across processes (plan/exchange_plan.hpp): the variables'
// chunk table, in chunks of one screen tile, cut into one run of whole chunks per process, balanced by
// elements; a slice lives in compact storage (each variable's range padded to stored_alignment), reached
// through pointer tables (plan/owner_slices.hpp slice_pointers), and the exchange moves the plan's
// blocks. A step:
//   1. contributions: each process sends every owner its contributions to the owner's slice (one
//      personalised all-to-all). With a power-of-two count L of towers per process, process r's towers
//      rL ... rL + L - 1 form a subtree of the canonical tree (plan/canonical_order.hpp), so the
//      process sends its local canonical sum of w_i * g_i: one partial per process crosses the wire.
//      With other counts that is not so, and it sends each tower's w_i * g_i (L times the bytes): the
//      owner runs the whole tree.
//   2. owner: the canonical sum over the leaves it received (the tree's upper levels over the R
//      partials, or the whole tree over the N = R * L gradients), then the optimizer on its slice with
//      its slice of the optimizer state (1/R of the memory).
//   3. every process gathers every slice's new parameters (an all-gather: a copy, free of order) into
//      a buffer of the variables end to end, each padded (padded_flat_starts).
// Bytes per process and step with partials: (R - 1)/R * P values out and in, then the same again to
// gather: those of a ring reduce-scatter + all-gather.
//
// Global tower index = rank-major: process r's tower t is tower r * L + t. Every process must have
// the same L, variables, layout, optimizer and hyper-parameters: the constructor compares a fingerprint
// of them across processes and fails on every process with the first difference. Tower weights come
// from every process's shard sizes (w_i = examples_i / all examples), and the loss a step reports is
// the mean over every process's examples.
//
// The optimizer state on a process is only its slice: optimizer_state(slot, variable) gathers it (a
// collective: every process calls it, in the same order — as io/checkpoint.hpp's save does), and
// set_optimizer_state keeps the part of the slice (no communication), so checkpoints hold whole
// variables and load with any process count.
//
// Checked steps (kernels/screen.hpp: skipping or throwing on non-finite values, clipping, loss scaling,
// accumulation): the owners keep their slice of the average and screen it; a chunk of the partition is
// a screen tile, so each tile's sum of squares is computed whole by one owner, and every process gathers
// all of them, in the table's order, and the first non-finite key — the same norm, skip and report as in
// one process.
//
// Gradient buckets (pipeline/step_parts.hpp): while the towers run, a bucket's contributions go
// into the send buffer on the worker thread, and in one process its owner's work follows at once (the
// update and the new parameters, or its screen). Across processes the exchange is cut by bucket
// (plan/exchange_plan.hpp): the worker exchanges a bucket once it and every bucket before it are
// in, so that every process makes the same exchanges in the same order, whichever buckets its own
// towers finished first. Before the processes agree on the towers' outcome (step/processes.hpp), each
// process settles the rest — the contributions its towers left, then every bucket not yet exchanged,
// in order, whether its towers succeeded or not, so that no process waits for an exchange another will
// not make. Only after the agreement do the owners update their slices: a tower failing on any process
// changes nothing on any. This needs a process group the worker thread may call
// (process_group::callable_from_any_thread; MPI: MPI_THREAD_SERIALIZED); else the exchange follows the
// towers, whole.
//
// Mixed precision (bf16/fp16 towers): contributions are the widened gradients' products in the master
// type, the owners hold their slice of the state in it, and every process gathers the whole master copy
// (4 bytes a parameter) and rounds it for its towers — as one process's reduce::host does.


#include <cstddef>
#include <map>
#include <vector>

#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"

namespace towerpipe {

namespace reduce {

// The optimizer sharded over processes or over the towers' devices (see the top of this header).
struct sharded {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "sharded";
  // On one device the owners together make device0's pass.
  static double one_device_bytes(std::size_t towers, std::size_t element_bytes) { return detail::fused_pass_bytes(towers, element_bytes); }
  // Each tower owns 1/N: device d receives the contributions to its n_d/N and gathers the others'
  // slices into its n_d replicas, 2 n_d (N - n_d) / N each way.
  static double busiest_link_elements(const std::vector<int>& devices) {
    const double n = static_cast<double>(devices.size());
    std::map<int, double> load;
    for (const auto& [device, towers] : detail::towers_per_device(devices)) {
      const double own = static_cast<double>(towers);
      load[device] = 2 * own * (n - own) / n;
    }
    return detail::busiest(load);
  }
  static constexpr backend_traits traits{
      name, true, true, true, 1.5, &one_device_bytes, &busiest_link_elements, false,
      "its slices copied in one process (1.5-5.1x reduce::host's time; across processes the only backend)"};
};

}  // namespace reduce

}  // namespace towerpipe
