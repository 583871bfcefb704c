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

// Written once against an executor (exec/executor.hpp): it runs on CUDA (exec::cuda) and on simulated
// devices (exec::simulated).

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <type_traits>
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
  using device_buffer = typename towers_type::device_buffer;
  using partial_buffer = typename Layout::template buffer<device_memory_of<Executor>, master_type>;  // device_buffer in full precision
  using stream = typename Executor::stream;
  using event = typename Executor::event;
  static constexpr reducer_capabilities capabilities{};

  explicit p2p_tree_reducer(const reducer_setup<towers_type, Optim>& setup) : p2p_tree_reducer(setup, setup.towers.executor()) {}

  backend_choice choice() const { return named_by_type("p2p_tree"); }
  // Off where an edge or a pull copies whole buffers (no peer access) and with poison_gradients.
  bool buckets_during_towers() const { return overlaps_; }

  // Before a checked step's parts: the raw operands' keys and the screen's, on the streams that lower them.
  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (!work_.checked) return;
    for (const auto& own : nodes_) {
      const typename Executor::device_guard on(exec_, own->side.device());
      exec_.memset_async(own->key.get(), 0xFF, sizeof(nonfinite_key), own->side);
      exec_.host_writes(own->host_key.get(), sizeof(nonfinite_key));
      own->host_key[0] = no_nonfinite;
    }
    average_.screen.reset(nodes_[0]->side);
  }

  // A part's rounds, then the root's edge: fused with the optimizer and the broadcast down the tree (an
  // unchecked step), or through the screen (kernels/screen.hpp) into the average on tower 0's device,
  // each raw operand checked on the way (a checked step).
  void reduce_part(towers_type& towers, const step_part& part) {
    const typename Executor::range range(exec_, "towerpipe reduce::p2p_tree part");
    const std::vector<chunk_group> runs = chunk_runs_.runs(part.variables);
    const auto rounds = run_rounds(towers, part, runs);
    node& root = *nodes_[0];
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
      if (towers.trace().on()) record_device_spans(towers);
      return {};
    }
    {
      const stream& root = nodes_[0]->side;
      const typename Executor::device_guard on(exec_, root.device());
      average_.screen.read_key(root);  // also when no tile was launched
      exec_.record(root_end_, root);
    }
    finish_step(towers, true, stages);  // the towers may write their gradients again once this returns
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + screen", "reduce (GPU)");
    screen_partials partials = average_.screen.results();
    for (const auto& own : nodes_) {
      exec_.host_reads(own->host_key.get(), sizeof(nonfinite_key));
      partials.first_nonfinite = std::min(partials.first_nonfinite, own->host_key[0]);
    }
    return partials;
  }

  // Pass 2: the optimizer on scale * average on tower 0's device, then the broadcast down the tree.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::p2p_tree apply");
    const stream& root = nodes_[0]->side;
    {
      const typename Executor::device_guard on(exec_, root.device());
      exec_.record(root_start_, root);
      launch_fused_apply_for<Policy, 1>(nodes_[0]->chunks, root, 1, average_.table.const_view(), std::vector<master_type>{scale}, apply_for());
      exec_.record(root_end_, root);
    }
    broadcast(tree_shape(), {every_chunk});
    finish_step(towers, false, stages);
    if (towers.trace().on()) record_device_spans(towers);
  }
  // After a failed step: the parts enqueued on the side streams done, and the towers' next work after them.
  void abandon(towers_type& towers) { order_towers_after_sides(towers); }

  // The master copy is tower 0's replica, except with mixed precision (device_optimizer_state).
  tensor_view<const master_type> master(std::size_t index) {
    if constexpr (mixed) return this->master_on_host(index);
    else return towers_.parameter_on_host(index);
  }
  void set_master(std::size_t index, const master_type* values) { this->set_master_on_device(index, values); }
  std::vector<std::size_t> state_bytes_per_tower() const { return base::state_bytes_per_tower(towers_.towers()); }

 private:
  using base = device_optimizer_state<Optim, Layout, Executor>;
  using rounds_type = std::vector<std::vector<tree_edge<master_type>>>;

  p2p_tree_reducer(const reducer_setup<towers_type, Optim>& setup, const Executor& exec)
      : base(exec, setup.variables, setup.hyper, setup.towers.device(0)),
        exec_(exec),
        towers_(setup.towers),
        wiring_(setup.towers.access()),
        timing_stream_(exec, setup.towers.device(0), "p2p_tree timing"),
        tree_start_(exec, setup.towers.device(0), true),
        root_start_(exec, setup.towers.device(0), true),
        root_end_(exec, setup.towers.device(0), true),
        average_(exec, setup.variables, setup.towers.device(0)),
        chunk_runs_(make_chunk_table(setup.variables, Policy::chunk_elements), setup.variables.count()),
        tile_runs_(average_.screen.tiles(), setup.variables.count()),
        // The poison check reads a tower's whole gradients after it returns, where in full precision the
        // edges of its marked buckets may have written partial sums already (16-bit towers keep theirs apart).
        overlaps_(mixed || !setup.options.poison_gradients) {
    towers_type& towers = setup.towers;
    check_device_tower_count("reduce::p2p_tree", towers.towers());
    const std::size_t n = towers.towers();
    const std::size_t count = setup.variables.count();
    // The root's apply writes these replicas in the same pass: one pass instead of one plus a pull each.
    root_replica_count_ = wiring_.root_replicas();
    const std::vector<tensor_chunk> chunk_list = make_chunk_table(setup.variables, Policy::chunk_elements);
    const auto aligned_table = [&](const auto& pointers, int device, const char* what) {
      using element = std::remove_pointer_t<typename std::decay_t<decltype(pointers)>::value_type>;
      return std::make_unique<typename Executor::template pointer_table<element>>(
          vector_pointer_table<Policy>(exec, pointers, static_cast<int>(count), chunk_list, device, what));
    };
    root_targets_ = aligned_table(wiring_.root_target_pointers<stored_type>(towers), towers.device(0),
                                  "reduce::p2p_tree: the replicas the root writes");
    // Where each tower with children keeps its partial sum: its gradient buffer, or (mixed) a master-type buffer.
    std::vector<partial_buffer*> partials(n, nullptr);
    for (std::size_t t = 0; t < n; ++t) {
      if (!wiring_.has_children[t]) continue;
      if constexpr (mixed) {
        own_partials_.push_back(std::make_unique<partial_buffer>(setup.variables, exec.device_memory(towers.device(t))));
        partials[t] = own_partials_.back().get();
      } else {
        partials[t] = &towers.gradients(t);
      }
    }
    const std::size_t rounds = tree_shape().size();
    for (std::size_t t = 0; t < n; ++t) {
      const int device = towers.device(t);
      nodes_.push_back(std::make_unique<node>(exec, setup.variables, device, Policy::chunk_elements, towers.trace().on() ? rounds : 0));
      node& own = *nodes_.back();
      if (wiring_.needs_scratch[t]) {
        // Full precision: one scratch serves a child's raw gradient and a child's partial sum alike.
        if (!mixed || wiring_.needs_raw_scratch[t]) own.raw_scratch = std::make_unique<device_buffer>(setup.variables, exec.device_memory(device));
        if (mixed && wiring_.needs_partial_scratch[t])
          own.partial_scratch = std::make_unique<partial_buffer>(setup.variables, exec.device_memory(device));
        log_warning(make_message("reduce::p2p_tree: tower ", t, " (device ", device,
                                 ") reads some of its children in the tree through copies: no direct access"));
        overlaps_ = false;  // whole copies: every bucket waits for the whole gradients
      }
      own.raw = aligned_table(wiring_.raw_pointers<stored_type>(towers, t, own.raw_scratch.get()), device,
                              "reduce::p2p_tree: the raw gradients a tower reads");
      own.sums = aligned_table(wiring_.partial_pointers<master_type>(partials, t, own.partial_scratch_or_raw(), count), device,
                               "reduce::p2p_tree: the partial sums a tower reads and writes");
      if (t == 0) continue;
      // Parents come first in tower order (left < right on every edge): the parent's scratch exists.
      const node& parent = *nodes_[static_cast<std::size_t>(wiring_.parent[t])];
      own.raw_operand_copies = wiring_.raw_operand_copies<stored_type>(towers, t, parent.raw_scratch.get());
      own.partial_operand_copies = wiring_.partial_operand_copies<master_type>(towers, t, partials, parent.partial_scratch_or_raw());
      own.pull_copies = wiring_.pull_copies<stored_type>(towers, t);
      if (wiring_.written_by_root[t]) continue;
      if (!wiring_.pulls_directly[t]) overlaps_ = false;  // a whole copy of the parent's replica
      // A tower that pulls its parameters from its parent.
      own.own_replica = aligned_table(gather_pointers<stored_type>(std::vector<device_buffer*>{&towers.replica(t)}), device,
                                      "reduce::p2p_tree: the replica a tower pulls into");
      own.parent_replica = aligned_table(
          gather_pointers<stored_type>(std::vector<device_buffer*>{&towers.replica(static_cast<std::size_t>(wiring_.parent[t]))}), device,
          "reduce::p2p_tree: the replica a tower pulls from");
    }
  }

  // The tree's rounds (their edges; the weights do not matter).
  rounds_type tree_shape() const {
    const std::size_t n = nodes_.empty() ? towers_.towers() : nodes_.size();
    return canonical_tree_rounds<master_type>(static_cast<int>(n), std::vector<master_type>(n, master_type(1)));
  }

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
      node& own = *nodes_[t];
      // Its edges add into its partial sum and its pull overwrites its parameters: both after its marks.
      own.partial_ready = last_part ? &towers.gradients_ready(t) : &towers.bucket_done(t, part.bucket);
      const typename Executor::device_guard on(exec_, own.side.device());
      exec_.wait(own.side, *own.partial_ready);
    }
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<master_type>& edge : rounds[r]) {
        node& left = *nodes_[static_cast<std::size_t>(edge.left)];
        const node& right = *nodes_[static_cast<std::size_t>(edge.right)];
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
      const node& right = *nodes_[static_cast<std::size_t>(rounds.back().front().right)];
      const stream& root = nodes_[0]->side;
      const typename Executor::device_guard on(exec_, root.device());
      exec_.wait(root, *right.partial_ready);
      right.copy_operand(exec_, root);
    }
    return rounds;
  }

  optimizer_apply<Optim, master_type, stored_type> apply_for() const {
    return {root_targets_->view(), this->state_table(), root_replica_count_, this->state_slot_count(), work_.constants, this->master_table()};
  }

  // After the root's pass over `runs` on its side stream: the parameters go down the tree — the towers
  // the root wrote have them with the root's; every other tower pulls its parent's replica over the same
  // runs on its side stream, after its parent's.
  void broadcast(const rounds_type& rounds, const std::vector<chunk_group>& runs) {
    {
      const typename Executor::device_guard on(exec_, nodes_[0]->side.device());
      exec_.record(nodes_[0]->parameters_done, nodes_[0]->side);
    }
    nodes_[0]->parameters_ready = &nodes_[0]->parameters_done;
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      for (const tree_edge<master_type>& edge : *r) {
        const std::size_t child = static_cast<std::size_t>(edge.right), parent = static_cast<std::size_t>(edge.left);
        node& own = *nodes_[child];
        if (wiring_.written_by_root[child]) {
          own.parameters_ready = nodes_[parent]->parameters_ready;
          continue;
        }
        const typename Executor::device_guard on(exec_, own.side.device());
        exec_.wait(own.side, *nodes_[parent]->parameters_ready);
        exec_.record(own.pull_start, own.side);
        if (wiring_.pulls_directly[child]) {
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

  // The end of a step's last part: checked, each tower's key to the host; then order_towers_after_sides
  // and the stages' seconds.
  void finish_step(towers_type& towers, bool checked, stage_seconds& stages) {
    if (checked) {
      for (const auto& own : nodes_) {
        const typename Executor::device_guard on(exec_, own->side.device());
        exec_.copy_async(own->host_key.get(), own->key.get(), sizeof(nonfinite_key), own->side);
      }
    }
    order_towers_after_sides(towers);
    exec_.synchronize(tree_start_);  // on a stream of its own, which nothing above waited for
    stages.reduce = exec_.seconds_between(tree_start_, root_end_);
    if (!checked) stages.broadcast = broadcast_seconds();
  }

  // Each tower's next work waits for the side streams that touch its buffers — its own (its edges, its
  // pull) and its parent's (the edge that reads its partial; the root's writes its replica) — and the
  // host waits for every side stream.
  void order_towers_after_sides(towers_type& towers) {
    for (const auto& own : nodes_) {
      const typename Executor::device_guard on(exec_, own->side.device());
      exec_.record(own->side_done, own->side);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      exec_.wait(towers.stream(t), nodes_[t]->side_done);
      if (t != 0) exec_.wait(towers.stream(t), nodes_[static_cast<std::size_t>(wiring_.parent[t])]->side_done);
    }
    for (const auto& own : nodes_) exec_.synchronize(own->side_done);
  }

  struct node {
    // `timed_rounds`: how many tree rounds get timing events (0 without a timeline).
    node(const Executor& exec, const variable_set& variables, int device, std::size_t chunk_elements, std::size_t timed_rounds)
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

  // The broadcast's critical path: the longest chain of pulls from the root down the tree, each pull timed
  // on its own device (towers on different devices have no common device clock).
  double broadcast_seconds() const {
    std::vector<double> arrival(nodes_.size(), 0.0);  // parents come before their children
    double longest = 0;
    for (std::size_t t = 1; t < nodes_.size(); ++t) {
      arrival[t] = arrival[static_cast<std::size_t>(wiring_.parent[t])];
      if (!wiring_.written_by_root[t]) arrival[t] += exec_.seconds_between(nodes_[t]->pull_start, nodes_[t]->parameters_done);
      longest = std::max(longest, arrival[t]);
    }
    return longest;
  }

  // After a step, with a timeline: the root edge on row "reduce (GPU)", the other edges and the pulls of
  // the new parameters on the rows of the towers whose streams ran them.
  void record_device_spans(towers_type& towers) const {
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + apply", "reduce (GPU)");
    const rounds_type rounds = tree_shape();
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<master_type>& edge : rounds[r]) {
        const std::size_t left = static_cast<std::size_t>(edge.left);
        towers.device_span(left, nodes_[left]->edge_start[r], nodes_[left]->edge_end[r], make_message("tree edge: + tower ", edge.right),
                           "tower ", left, " (GPU)");
      }
    }
    for (std::size_t t = 1; t < nodes_.size(); ++t) {
      if (wiring_.written_by_root[t]) continue;  // written by the root's pass, on row "reduce (GPU)"
      towers.device_span(t, nodes_[t]->pull_start, nodes_[t]->parameters_done, make_message("broadcast: pull from tower ", wiring_.parent[t]),
                         "tower ", t, " (GPU)");
    }
  }

  const Executor& exec_;
  towers_type& towers_;
  tree_wiring wiring_;     // which buffers each edge and pull uses in place, which through copies
  stream timing_stream_;  // on tower 0's device: marks when the last tower's gradients were ready
  event tree_start_, root_start_, root_end_;
  std::unique_ptr<typename Executor::template pointer_table<stored_type>> root_targets_;  // role 0: tower 0's replica, then those towers'
  int root_replica_count_ = 1;
  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<std::unique_ptr<partial_buffer>> own_partials_;  // mixed precision: the partial sums of the towers with children
  device_average<Layout, Executor> average_;  // checked steps, on tower 0's device
  chunks_by_variable chunk_runs_, tile_runs_;  // where a part's variables lie in the chunk table and the screen's tiles
  bool overlaps_;                              // buckets go during the towers (buckets_during_towers)
  step_work<master_type, Optim> work_;
};

}  // namespace detail

namespace reduce {

// The canonical tree run by the towers themselves (see the top of this header); LaunchPolicy as for
// reduce::device0_with.
template <class LaunchPolicy = multi_tensor_policy>
struct p2p_tree_with {
  using policy_kind = detail::reduce_policy_kind;
  using launch_policy = LaunchPolicy;
  static constexpr const char* name = "p2p_tree";
  // 12 bytes per non-root edge (two reads, one write), 32 + 4R for the root (R replicas besides tower 0's),
  // 8 per pull: 20N - 4R in all, Adam, full precision; one tower is device0's pass.
  static double one_device_bytes(std::size_t towers, std::size_t element_bytes) {
    if (towers < 2) return detail::fused_pass_bytes(towers, element_bytes);
    std::size_t replicas = 0;
    for (std::size_t stride = 1; stride < towers; stride *= 2) ++replicas;
    const double e = static_cast<double>(element_bytes);
    return (20 * static_cast<double>(towers) - 4 * static_cast<double>(replicas)) * e / 4 + 20 * (1 - e / 4);
  }
  // One element each way per edge of the canonical tree between towers on different devices (the partial
  // up, the parameters pulled down).
  static double busiest_link_elements(const std::vector<int>& devices) {
    std::map<int, double> load;
    const std::size_t towers = devices.size();
    for (std::size_t stride = 1; stride < towers; stride *= 2) {
      for (std::size_t i = 0; i + stride < towers; i += 2 * stride) {
        const int a = devices[i], b = devices[i + stride];
        if (a == b) continue;
        load[a] += 1;
        load[b] += 1;
      }
    }
    return detail::busiest(load);
  }
  static constexpr backend_traits traits{name, false, true, false, 0.0, &one_device_bytes, &busiest_link_elements, false,
                                         "the canonical tree run by the towers: it spreads the traffic over the links"};
};
using p2p_tree = p2p_tree_with<>;

}  // namespace reduce

template <class Optim, class Layout, class Executor, class LaunchPolicy>
struct reducer_for<exec::on_devices<Executor>, reduce::p2p_tree_with<LaunchPolicy>, Optim, Layout> {
  using type = detail::p2p_tree_reducer<Optim, Layout, Executor, LaunchPolicy>;
};

}  // namespace towerpipe
