#pragma once
// The device wiring of reduce::p2p_tree (reduce/p2p_tree/reducer.hpp): the tree's wiring in plain C++
// (wiring/copy_wiring.hpp tree_wiring: which buffers each edge and pull uses in place, which through
// copies) made real on the towers' devices — a node per tower with its side stream, events, operand
// tables (their vector alignment checked on the host first), scratch buffers and copy lists; the replicas
// the root's pass writes; with 16-bit towers, the master-type partial sums of the towers with children.

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/copy_list.hpp"
#include "towerpipe/reduce/common/device_state.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"

namespace towerpipe {
namespace detail {

template <class Layout, class Executor>
struct p2p_tree_node {
  using stored_type = typename precision<Layout>::stored_type;
  using master_type = typename precision<Layout>::master_type;
  static constexpr bool mixed = precision<Layout>::mixed;
  using device_buffer = typename device_towers<Layout, Executor>::device_buffer;
  using partial_buffer = typename Layout::template buffer<device_memory_of<Executor>, master_type>;  // device_buffer in full precision
  using stream = typename Executor::stream;
  using event = typename Executor::event;

  // `timed_rounds`: how many tree rounds get timing events (0 without a timeline).
  p2p_tree_node(const Executor& exec, const variable_set& variables, int device, std::size_t chunk_elements, std::size_t timed_rounds)
      : chunks(exec, make_chunk_table(variables, chunk_elements), device),
        side(exec, device, "p2p_tree side"),
        side_done(exec, device),
        key(exec.device_memory(device).template allocate<nonfinite_key>(1, 256)),
        host_key(exec.pinned_memory().template allocate<nonfinite_key>(1)),
        partial_done(exec, device),
        pull_start(exec, device, true),
        parameters_done(exec, device, true) {
    for (std::size_t r = 0; r < timed_rounds; ++r) {
      edge_start.emplace_back(exec, device, true);
      edge_end.emplace_back(exec, device, true);
    }
  }

  typename Executor::chunk_table chunks;
  // The tree's work on this tower's device, beside the tower's own stream: a bucket's edges and pull
  // run while the tower computes the next layers' gradients.
  stream side;
  event side_done;  // the end of the side stream's work of a step
  // Only without peer access to some child: where its operands are copied (wiring/copy_wiring.hpp
  // tree_wiring). In full precision raw_scratch takes both kinds.
  std::unique_ptr<device_buffer> raw_scratch;
  std::unique_ptr<partial_buffer> partial_scratch;
  std::unique_ptr<typename Executor::template pointer_table<stored_type>> raw;  // role = tower: raw gradients as this tower reads them
  std::unique_ptr<typename Executor::template pointer_table<master_type>> sums;  // role = tower: partial sums as this tower reads and writes them
  std::unique_ptr<typename Executor::template pointer_table<stored_type>> parent_replica, own_replica;  // only for towers that pull
  // This tower's operand into its parent's scratch, where the parent needs one: its raw gradient or its
  // partial sum (one of the two lists is empty).
  copy_list<stored_type> raw_operand_copies;
  copy_list<master_type> partial_operand_copies;
  copy_list<stored_type> pull_copies;  // its parent's replica into its own, where it pulls through a copy
  typename device_memory_of<Executor>::template owner<nonfinite_key> key;  // checked steps: the first non-finite raw operand it read
  typename decltype(std::declval<const Executor&>().pinned_memory())::template owner<nonfinite_key> host_key;
  event partial_done;
  event pull_start, parameters_done;      // timing: the pull of the new parameters, where it pulls
  const event* parameters_ready = nullptr;  // this step: when this tower's new parameters are in
  const event* partial_ready = nullptr;     // this step: the last write to this tower's sums
  std::vector<event> edge_start, edge_end;  // per round where this tower is the left side

  tree_operands<master_type, stored_type> operands() const { return {raw->const_view(), sums->view()}; }
  const partial_buffer* partial_scratch_or_raw() const {
    if constexpr (mixed) return partial_scratch.get();
    else return raw_scratch.get();
  }
  // On `s` (its parent's side stream): this tower's operand into the parent's scratch, where needed.
  void copy_operand(const Executor& exec, const stream& s) const {
    run_copies_async(exec, raw_operand_copies, s);
    run_copies_async(exec, partial_operand_copies, s);
  }
};

// Every tower's node, built from the tree's wiring.
template <class Layout, class Executor, class Policy>
class p2p_tree_nodes {
 public:
  using node = p2p_tree_node<Layout, Executor>;
  using stored_type = typename node::stored_type;
  using master_type = typename node::master_type;
  static constexpr bool mixed = node::mixed;
  using device_buffer = typename node::device_buffer;
  using partial_buffer = typename node::partial_buffer;

  p2p_tree_nodes(const Executor& exec, const variable_set& variables, device_towers<Layout, Executor>& towers, bool poison_gradients)
      : wiring(towers.access()),
        // The poison check reads a tower's whole gradients after it returns, where in full precision the
        // edges of its marked buckets may have written partial sums already (16-bit towers keep theirs apart).
        overlaps(mixed || !poison_gradients) {
    check_device_tower_count("reduce::p2p_tree", towers.towers());
    const std::size_t n = towers.towers();
    const std::size_t count = variables.count();
    // The root's apply writes these replicas in the same pass: one pass instead of one plus a pull each.
    root_replica_count = wiring.root_replicas();
    shape = canonical_tree_rounds<master_type>(static_cast<int>(n), std::vector<master_type>(n, master_type(1)));
    const std::vector<tensor_chunk> chunk_list = make_chunk_table(variables, Policy::chunk_elements);
    const auto aligned_table = [&](const auto& pointers, int device, const char* what) {
      using element = std::remove_pointer_t<typename std::decay_t<decltype(pointers)>::value_type>;
      return std::make_unique<typename Executor::template pointer_table<element>>(
          vector_pointer_table<Policy>(exec, pointers, static_cast<int>(count), chunk_list, device, what));
    };
    root_targets = aligned_table(wiring.root_target_pointers<stored_type>(towers), towers.device(0),
                                  "reduce::p2p_tree: the replicas the root writes");
    // Where each tower with children keeps its partial sum: its gradient buffer, or (mixed) a master-type buffer.
    std::vector<partial_buffer*> partials(n, nullptr);
    for (std::size_t t = 0; t < n; ++t) {
      if (!wiring.has_children[t]) continue;
      if constexpr (mixed) {
        own_partials.push_back(std::make_unique<partial_buffer>(variables, exec.device_memory(towers.device(t))));
        partials[t] = own_partials.back().get();
      } else {
        partials[t] = &towers.gradients(t);
      }
    }
    for (std::size_t t = 0; t < n; ++t) {
      const int device = towers.device(t);
      nodes.push_back(std::make_unique<node>(exec, variables, device, Policy::chunk_elements,
                                             towers.trace().on() ? shape.size() : 0));
      node& own = *nodes.back();
      if (wiring.needs_scratch[t]) {
        // Full precision: one scratch serves a child's raw gradient and a child's partial sum alike.
        if (!mixed || wiring.needs_raw_scratch[t]) own.raw_scratch = std::make_unique<device_buffer>(variables, exec.device_memory(device));
        if (mixed && wiring.needs_partial_scratch[t])
          own.partial_scratch = std::make_unique<partial_buffer>(variables, exec.device_memory(device));
        log_warning(make_message("reduce::p2p_tree: tower ", t, " (device ", device,
                                 ") reads some of its children in the tree through copies: no direct access"));
        overlaps = false;  // whole copies: every bucket waits for the whole gradients
      }
      own.raw = aligned_table(wiring.raw_pointers<stored_type>(towers, t, own.raw_scratch.get()), device,
                              "reduce::p2p_tree: the raw gradients a tower reads");
      own.sums = aligned_table(wiring.partial_pointers<master_type>(partials, t, own.partial_scratch_or_raw(), count), device,
                               "reduce::p2p_tree: the partial sums a tower reads and writes");
      if (t == 0) continue;
      // Parents come first in tower order (left < right on every edge): the parent's scratch exists.
      const node& parent = *nodes[static_cast<std::size_t>(wiring.parent[t])];
      own.raw_operand_copies = wiring.raw_operand_copies<stored_type>(towers, t, parent.raw_scratch.get());
      own.partial_operand_copies = wiring.partial_operand_copies<master_type>(towers, t, partials, parent.partial_scratch_or_raw());
      own.pull_copies = wiring.pull_copies<stored_type>(towers, t);
      if (wiring.written_by_root[t]) continue;
      if (!wiring.pulls_directly[t]) overlaps = false;  // a whole copy of the parent's replica
      // A tower that pulls its parameters from its parent.
      own.own_replica = aligned_table(gather_pointers<stored_type>(std::vector<device_buffer*>{&towers.replica(t)}), device,
                                      "reduce::p2p_tree: the replica a tower pulls into");
      own.parent_replica = aligned_table(
          gather_pointers<stored_type>(std::vector<device_buffer*>{&towers.replica(static_cast<std::size_t>(wiring.parent[t]))}), device,
          "reduce::p2p_tree: the replica a tower pulls from");
    }
    }

  tree_wiring wiring;  // which buffers each edge and pull uses in place, which through copies
  std::vector<std::vector<tree_edge<master_type>>> shape;  // the tree's rounds (their edges; the weights do not matter)
  std::vector<std::unique_ptr<node>> nodes;
  std::unique_ptr<typename Executor::template pointer_table<stored_type>> root_targets;  // role 0: tower 0's replica, then those towers'
  int root_replica_count = 1;
  std::vector<std::unique_ptr<partial_buffer>> own_partials;  // 16-bit towers: the partial sums of the towers with children
  bool overlaps;  // buckets may go during the towers: no whole copies, no poison check on full-precision partial sums
};

}  // namespace detail
}  // namespace towerpipe
