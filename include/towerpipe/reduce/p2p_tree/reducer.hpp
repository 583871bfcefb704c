#pragma once
// reduce::p2p_tree — the canonical tree itself, run by the towers: in round r tower i adds tower
// i + 2^r's partial sum into its own gradient buffer (plan/canonical_order.hpp), on its own stream,
// reading the other tower's buffer directly where peer access allows; the last edge, into tower 0, is
// fused with the optimizer (state on tower 0's device) and writes the new parameters into tower 0's
// replica and into those of tower 0's children in the tree (towers 1, 2, 4, ...) that it can reach
// directly. The parameters then go on down the same tree: every other tower pulls its parent's replica
// on its own stream. All of this runs on a side stream per tower (on the tower's device), which
// waits for the tower's gradients by events, so that a gradient bucket's share can run while the tower
// computes on its own stream.
//
// Bytes per parameter, all towers on one device, Adam: 12 per non-root edge (two reads, one write), 32 +
// 4R for the root (R = ceil(log2 N) replicas besides tower 0's), 8 per pull: 20N - 4R in all, against
// device0's 8N + 20 — equal at N = 2, 1.38x at 4, 1.76x at 8. The tree spreads traffic over the links
// between devices; on one device, device0 moves less.
//
// Without peer access along an edge, the other tower's buffer is first copied into a scratch buffer on
// the reading tower's device (a peer copy), with a one-time warning through the log sink.
//
// A checked step (kernels/screen.hpp): the same rounds, each checking the raw gradients it reads; the
// root's edge runs as the screen into an average on tower 0's device; the apply reads that average.
//
// Mixed precision (bf16 or fp16 towers; every such step is a checked one): each tower with children in
// the tree keeps its partial sum in an fp32 buffer on its device beside its 16-bit gradients
// (kernels/agents.hpp tree_operands), since the canonical sums are fp32's; a raw 16-bit gradient is
// widened where an edge reads it. The optimizer runs on an fp32 master on tower 0's device (as
// device0's) and the replicas get it rounded to nearest even; the pulls move 16-bit replicas.
//
// Gradient buckets (pipeline/step_parts.hpp): once every tower has marked a bucket, its rounds,
// root edge (fused apply, or screen) and pulls run over the bucket's chunks only, each on the side
// stream that runs it in the whole step, after the bucket's events; each element still goes through the
// same edges in the same order, so the bits are the unbucketed step's. A bucket's edges write partial
// sums into the towers' gradients of that bucket and its pass writes replicas of that bucket only:
// what every tower has marked, so none of them writes or reads it any more this step.

// Written once against an executor (docs/architecture.md, "The executor"): it runs on CUDA (exec::cuda) and on simulated
// devices (exec::simulated).

#include <algorithm>
#include <cstddef>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/device_state.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/reduce/p2p_tree/nodes.hpp"
#include "towerpipe/reduce/p2p_tree/policy.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Executor, class Policy>
class p2p_tree_reducer : public device_optimizer_state<Optim, Layout, Executor> {
 public:
  using towers_type = device_towers<Layout, Executor>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' gradients and replicas
  using master_type = typename precision<Layout>::master_type;           // partial sums, master, state, average
  static constexpr bool mixed = precision<Layout>::mixed;
  using stream = typename Executor::stream;
  static constexpr reducer_capabilities capabilities{};

  explicit p2p_tree_reducer(const reducer_setup<towers_type, Optim>& setup) : p2p_tree_reducer(setup, setup.towers.executor()) {}

  backend_choice choice() const { return named_by_type("p2p_tree"); }
  // Off where an edge or a pull copies whole buffers (no peer access) and with poison_gradients.
  bool buckets_during_towers() const { return tree_.overlaps; }

  // Before a checked step's parts: the raw operands' keys and the screen's, on the streams that lower them.
  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (!work_.checked) return;
    for (const auto& own : tree_.nodes) {
      const typename Executor::device_guard on(exec_, own->side.device());
      exec_.memset_async(own->key.get(), 0xFF, sizeof(nonfinite_key), own->side);
      exec_.host_writes(own->host_key.get(), sizeof(nonfinite_key));
      own->host_key[0] = no_nonfinite;
    }
    average_.screen.reset(tree_.nodes[0]->side);
  }

  // A part's rounds, then the root's edge: fused with the optimizer and the broadcast down the tree (an
  // unchecked step), or through the screen (kernels/screen.hpp) into the average on tower 0's device,
  // each raw operand checked on the way (a checked step).
  void reduce_part(towers_type& towers, const step_part& part) {
    const typename Executor::range range(exec_, "towerpipe reduce::p2p_tree part");
    const std::vector<chunk_group> runs = chunk_runs_.runs(part.variables);
    const auto rounds = run_rounds(towers, part, runs);
    node& root = *tree_.nodes[0];
    const typename Executor::device_guard on(exec_, root.side.device());
    if (!part.during_towers()) exec_.record(root_start_, root.side);
    if (work_.checked) {
      for (const chunk_group& tiles : tile_runs_.runs(part.variables)) {
        if (rounds.empty()) {
          launch_tower_screen(average_.screen, root.side, 1, root.raw->const_view(), work_.weights, average_.table.view(), work_.window, tiles);
        } else {
          const edge_average_source<master_type, stored_type> edge{root.operands(), rounds.back().front()};
          average_.screen.launch(accumulating_source<edge_average_source<master_type, stored_type>, master_type>{edge, average_.table.view(), work_.window},
                                 average_.table.view(), root.side, tiles);
        }
      }
      return;
    }
    if constexpr (!mixed) {
      const optimizer_apply<Optim, master_type, stored_type> apply = apply_for();
      for (const chunk_group& run : runs) {
        if (rounds.empty()) {
          launch_fused_apply_for<Policy, 1>(root.chunks, root.side, 1, root.raw->const_view(), work_.weights, apply, run);
        } else {
          root.chunks.template launch<Policy>(tree_root_agent<Optim, master_type>{root.operands(), rounds.back().front(), apply}, root.side, run);
        }
      }
      if (!part.during_towers()) exec_.record(root_end_, root.side);
      broadcast(rounds, runs);
    }
  }

  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    if (!work_.checked) {
      finish_step(towers, false, stages);
      return {};
    }
    {
      const stream& root = tree_.nodes[0]->side;
      const typename Executor::device_guard on(exec_, root.device());
      average_.screen.read_key(root);  // also when no tile was launched
      exec_.record(root_end_, root);
    }
    finish_step(towers, true, stages);  // the towers may write their gradients again once this returns
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + screen", "reduce (GPU)");
    screen_partials partials = average_.screen.results();
    for (const auto& own : tree_.nodes) {
      exec_.host_reads(own->host_key.get(), sizeof(nonfinite_key));
      partials.first_nonfinite = std::min(partials.first_nonfinite, own->host_key[0]);
    }
    return partials;
  }

  // Pass 2: the optimizer on scale * average on tower 0's device, then the broadcast down the tree.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::p2p_tree apply");
    const stream& root = tree_.nodes[0]->side;
    {
      const typename Executor::device_guard on(exec_, root.device());
      exec_.record(root_start_, root);
      launch_fused_apply_for<Policy, 1>(tree_.nodes[0]->chunks, root, 1, average_.table.const_view(), std::vector<master_type>{scale}, apply_for());
      exec_.record(root_end_, root);
    }
    broadcast(tree_.shape, {every_chunk});
    finish_step(towers, false, stages);
  }
  // After a failed step, and at the end of every step (finish_step): the parts enqueued on the side streams done,
  // and each tower's next work after the side streams that touch its buffers — its own (its edges, its pull) and
  // its parent's (the edge that reads its partial; the root's writes its replica).
  void abandon(towers_type& towers) {
    for (const auto& own : tree_.nodes) {
      const typename Executor::device_guard on(exec_, own->side.device());
      exec_.record(own->side_done, own->side);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      exec_.wait(towers.stream(t), tree_.nodes[t]->side_done);
      if (t != 0) exec_.wait(towers.stream(t), tree_.nodes[static_cast<std::size_t>(tree_.wiring.parent[t])]->side_done);
    }
    for (const auto& own : tree_.nodes) exec_.synchronize(own->side_done);
  }

 private:
  using node = p2p_tree_node<Layout, Executor>;
  using rounds_type = std::vector<std::vector<tree_edge<master_type>>>;

  p2p_tree_reducer(const reducer_setup<towers_type, Optim>& setup, const Executor& exec)
      : device_optimizer_state<Optim, Layout, Executor>(setup.variables, setup.hyper, setup.towers),
        exec_(exec),
        tree_(exec, setup.variables, setup.towers, setup.options.poison_gradients),
        timing_stream_(exec, setup.towers.device(0), "p2p_tree timing"),
        tree_start_(exec, setup.towers.device(0), true),
        root_start_(exec, setup.towers.device(0), true),
        root_end_(exec, setup.towers.device(0), true),
        average_(exec, setup.variables, setup.towers.device(0)),
        chunk_runs_(make_chunk_table(setup.variables, Policy::chunk_elements), setup.variables.count()),
        tile_runs_(average_.screen.tiles(), setup.variables.count()) {}

  // A part's work on the side streams, up to the root's edge: every side stream waits for its tower's
  // gradients of the part (the bucket's event, or all of them after the towers), then every round but
  // the last over the part's chunk runs, each edge on its left tower's side stream after the right
  // tower's last write to its operand; the root's side stream last waits for the root edge's right
  // operand (copying it where it has no peer access). Returns the rounds (the last one's only edge is
  // the root's: left = 0). A checked step's raw operands' non-finite keys go to each left tower's key.
  rounds_type run_rounds(towers_type& towers, const step_part& part, const std::vector<chunk_group>& runs) {
    const rounds_type rounds = canonical_tree_rounds<master_type>(static_cast<int>(towers.towers()), work_.weights);
    const bool last_part = !part.during_towers();
    if (last_part) {  // stages.reduce starts when the last tower's gradients are ready, on a stream no tower waits for
      const typename Executor::device_guard on(exec_, towers.device(0));
      for (std::size_t t = 0; t < towers.towers(); ++t) exec_.wait(timing_stream_, towers.gradients_ready(t));
      exec_.record(tree_start_, timing_stream_);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      node& own = *tree_.nodes[t];
      // Its edges add into its partial sum and its pull overwrites its parameters: both after its marks.
      own.partial_ready = last_part ? &towers.gradients_ready(t) : &towers.bucket_done(t, part.bucket);
      const typename Executor::device_guard on(exec_, own.side.device());
      exec_.wait(own.side, *own.partial_ready);
    }
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<master_type>& edge : rounds[r]) {
        node& left = *tree_.nodes[static_cast<std::size_t>(edge.left)];
        const node& right = *tree_.nodes[static_cast<std::size_t>(edge.right)];
        const typename Executor::device_guard on(exec_, left.side.device());
        exec_.wait(left.side, *right.partial_ready);
        right.copy_operand(exec_, left.side);
        const bool timed = last_part && !left.edge_start.empty();
        if (timed) exec_.record(left.edge_start[r], left.side);
        for (const chunk_group& run : runs)
          left.chunks.template launch<Policy>(
              tree_round_agent<master_type, stored_type>{left.operands(), edge, work_.checked ? left.key.get() : nullptr}, left.side, run);
        if (timed) exec_.record(left.edge_end[r], left.side);
        exec_.record(left.partial_done, left.side);
        left.partial_ready = &left.partial_done;
      }
    }
    if (!rounds.empty()) {
      const node& right = *tree_.nodes[static_cast<std::size_t>(rounds.back().front().right)];
      const stream& root = tree_.nodes[0]->side;
      const typename Executor::device_guard on(exec_, root.device());
      exec_.wait(root, *right.partial_ready);
      right.copy_operand(exec_, root);
    }
    return rounds;
  }

  optimizer_apply<Optim, master_type, stored_type> apply_for() const {
    return {tree_.root_targets->view(), this->state_table(), tree_.root_replica_count, this->state_slot_count(), work_.constants, this->master_table()};
  }

  // After the root's pass over `runs` on its side stream: the parameters go down the tree — the towers
  // the root wrote have them with the root's; every other tower pulls its parent's replica over the same
  // runs on its side stream, after its parent's.
  void broadcast(const rounds_type& rounds, const std::vector<chunk_group>& runs) {
    {
      const typename Executor::device_guard on(exec_, tree_.nodes[0]->side.device());
      exec_.record(tree_.nodes[0]->parameters_done, tree_.nodes[0]->side);
    }
    tree_.nodes[0]->parameters_ready = &tree_.nodes[0]->parameters_done;
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      for (const tree_edge<master_type>& edge : *r) {
        const std::size_t child = static_cast<std::size_t>(edge.right), parent = static_cast<std::size_t>(edge.left);
        node& own = *tree_.nodes[child];
        if (tree_.wiring.written_by_root[child]) {
          own.parameters_ready = tree_.nodes[parent]->parameters_ready;
          continue;
        }
        const typename Executor::device_guard on(exec_, own.side.device());
        exec_.wait(own.side, *tree_.nodes[parent]->parameters_ready);
        exec_.record(own.pull_start, own.side);
        if (tree_.wiring.pulls_directly[child]) {
          for (const chunk_group& run : runs)
            own.chunks.template launch<Policy>(copy_agent<stored_type>{own.parent_replica->const_view(), own.own_replica->view(), 1},
                                               own.side, run);
        } else {
          run_copies_async(exec_, own.pull_copies, own.side);
        }
        exec_.record(own.parameters_done, own.side);
        own.parameters_ready = &own.parameters_done;
      }
    }
  }

  // The end of a step's last part: checked, each tower's key to the host; then abandon()'s waits and the
  // stages' seconds; unchecked (the parameters written), the timeline's spans.
  void finish_step(towers_type& towers, bool checked, stage_seconds& stages) {
    if (checked) {
      for (const auto& own : tree_.nodes) {
        const typename Executor::device_guard on(exec_, own->side.device());
        exec_.copy_async(own->host_key.get(), own->key.get(), sizeof(nonfinite_key), own->side);
      }
    }
    abandon(towers);
    exec_.synchronize(tree_start_);  // on a stream of its own, which nothing above waited for
    stages.reduce = exec_.seconds_between(tree_start_, root_end_);
    if (!checked) stages.broadcast = broadcast_seconds();
    if (!checked && towers.trace().on()) record_device_spans(towers);
  }


  // The broadcast's critical path: the longest chain of pulls from the root down the tree, each pull timed
  // on its own device (towers on different devices have no common device clock).
  double broadcast_seconds() const {
    std::vector<double> arrival(tree_.nodes.size(), 0.0);  // parents come before their children
    double longest = 0;
    for (std::size_t t = 1; t < tree_.nodes.size(); ++t) {
      arrival[t] = arrival[static_cast<std::size_t>(tree_.wiring.parent[t])];
      if (!tree_.wiring.written_by_root[t]) arrival[t] += exec_.seconds_between(tree_.nodes[t]->pull_start, tree_.nodes[t]->parameters_done);
      longest = std::max(longest, arrival[t]);
    }
    return longest;
  }

  // After a step, with a timeline: the root edge on row "reduce (GPU)", the other edges and the pulls of
  // the new parameters on the rows of the towers whose streams ran them.
  void record_device_spans(towers_type& towers) const {
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + apply", "reduce (GPU)");
    const rounds_type& rounds = tree_.shape;
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<master_type>& edge : rounds[r]) {
        const std::size_t left = static_cast<std::size_t>(edge.left);
        towers.device_span(left, tree_.nodes[left]->edge_start[r], tree_.nodes[left]->edge_end[r], make_message("tree edge: + tower ", edge.right),
                           "tower ", left, " (GPU)");
      }
    }
    for (std::size_t t = 1; t < tree_.nodes.size(); ++t) {
      if (tree_.wiring.written_by_root[t]) continue;  // written by the root's pass, on row "reduce (GPU)"
      towers.device_span(t, tree_.nodes[t]->pull_start, tree_.nodes[t]->parameters_done, make_message("broadcast: pull from tower ", tree_.wiring.parent[t]),
                         "tower ", t, " (GPU)");
    }
  }

  const Executor& exec_;
  p2p_tree_nodes<Layout, Executor, Policy> tree_;  // a node per tower: its stream, tables and copies
  stream timing_stream_;  // on tower 0's device: marks when the last tower's gradients were ready
  typename Executor::event tree_start_, root_start_, root_end_;
  device_average<Layout, Executor> average_;  // checked steps, on tower 0's device
  chunks_by_variable chunk_runs_, tile_runs_;  // where a part's variables lie in the chunk table and the screen's tiles
  step_work<master_type, Optim> work_;
};

}  // namespace detail

template <class Optim, class Layout, class Executor, class LaunchPolicy>
struct reducer_for<exec::on_devices<Executor>, reduce::p2p_tree_with<LaunchPolicy>, Optim, Layout> {
  using type = detail::p2p_tree_reducer<Optim, Layout, Executor, LaunchPolicy>;
};

}  // namespace towerpipe
