#pragma once
// reduce::p2p_tree — the canonical tree itself, run by the towers: in round r tower i adds tower
// i + 2^r's partial sum into its own gradient buffer (programs/canonical_order.hpp), on its own stream,
// reading the other tower's buffer directly where peer access allows; the last edge, into tower 0, is
// fused with the optimizer (state on tower 0's device) and writes the new parameters into tower 0's
// replica and into those of tower 0's children in the tree (towers 1, 2, 4, ...) that it can reach
// directly. The parameters then go on down the same tree: every other tower pulls its parent's replica
// on its own stream.
//
// Bytes per parameter, all towers on one device, Adam: 12 per non-root edge (two reads, one write), 32 +
// 4R for the root (R = ceil(log2 N) replicas besides tower 0's), 8 per pull: 20N - 4R in all, against
// device0's 8N + 20 — equal at N = 2, 1.38x at 4, 1.76x at 8. The tree spreads traffic over the links
// between devices; on one device, device0 moves less.
//
// Without peer access along an edge, the other tower's buffer is first copied into a scratch buffer on
// the reading tower's device (cudaMemcpyPeerAsync), with a one-time warning through the log sink.
//
// A checked step (programs/screen.hpp): the same rounds, each checking the raw gradients it reads; the
// root's edge runs as the screen into an average on tower 0's device; the apply reads that average.

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/peer_copies.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/programs/copy_wiring.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/step/stats.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class p2p_tree_reducer : public device_optimizer_state<Optim, Layout> {
  static_assert(std::is_floating_point<typename Layout::value_type>::value,
                "towerpipe: reduce::p2p_tree does not take mixed precision (bf16/fp16 layouts) yet: its partial sums "
                "live in the towers' 16-bit gradient buffers; use reduce::device0");

 public:
  using stored_type = typename Layout::value_type;
  using device_buffer = typename Layout::template buffer<cuda_device_memory>;
  using hyper_parameters = typename Optim::hyper_parameters;

  p2p_tree_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers)
      : device_optimizer_state<Optim, Layout>(variables, h, towers.device(0)),
        wiring_(towers.access()),
        timing_stream_(towers.device(0)),
        tree_start_(towers.device(0), true),
        root_start_(towers.device(0), true),
        root_end_(towers.device(0), true),
        average_(variables, towers.device(0)) {
    check_device_tower_count("reduce::p2p_tree", towers.towers());
    const std::size_t n = towers.towers();
    const int count = static_cast<int>(variables.count());
    // The root's apply writes these replicas in the same pass: one pass instead of one plus a pull each.
    const std::vector<stored_type*> root_targets = wiring_.root_target_pointers<stored_type>(towers);
    root_replica_count_ = wiring_.root_replicas();
    const std::vector<tensor_chunk> chunk_list = make_chunk_table(variables, Policy::chunk_elements);
    const auto aligned_table = [&](const std::vector<stored_type*>& pointers, int device, const char* what) {
      return std::make_unique<device_pointer_table<stored_type>>(vector_pointer_table<Policy>(pointers, count, chunk_list, device, what));
    };
    root_targets_ = aligned_table(root_targets, towers.device(0), "reduce::p2p_tree: the replicas the root writes");
    const std::size_t rounds = canonical_tree_rounds<stored_type>(static_cast<int>(n), std::vector<stored_type>(n, stored_type(1))).size();
    for (std::size_t t = 0; t < n; ++t) {
      const int device = towers.device(t);
      nodes_.push_back(std::make_unique<node>(variables, device, Policy::chunk_elements, towers.trace().on() ? rounds : 0));
      node& own = *nodes_.back();
      if (wiring_.needs_scratch[t]) {
        own.scratch = std::make_unique<device_buffer>(variables, cuda_device_memory{device});
        log_warning(make_message("reduce::p2p_tree: tower ", t, " (device ", device,
                                 ") reads some of its children in the tree through copies: no direct access"));
      }
      own.sums = aligned_table(wiring_.sum_pointers<stored_type>(towers, t, own.scratch.get()), device,
                               "reduce::p2p_tree: the partial sums a tower reads");
      if (t == 0) continue;
      // Parents come first in tower order (left < right on every edge): the parent's scratch exists.
      const node& parent = *nodes_[static_cast<std::size_t>(wiring_.parent[t])];
      own.operand_copies = wiring_.operand_copies<stored_type>(towers, t, parent.scratch.get());
      own.pull_copies = wiring_.pull_copies<stored_type>(towers, t);
      if (wiring_.written_by_root[t]) continue;
      // A tower that pulls its parameters from its parent.
      std::vector<device_buffer*> target{&towers.replica(t)};
      own.own_replica = aligned_table(gather_pointers<stored_type>(target), device, "reduce::p2p_tree: the replica a tower pulls into");
      std::vector<device_buffer*> source{&towers.replica(static_cast<std::size_t>(wiring_.parent[t]))};
      own.parent_replica = aligned_table(gather_pointers<stored_type>(source), device, "reduce::p2p_tree: the replica a tower pulls from");
    }
  }

  void average_and_apply(cuda_towers<Layout>& towers, const std::vector<stored_type>& weights,
                         const typename Optim::template step_constants<stored_type>& constants, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::p2p_tree");
    const auto rounds = run_tree(towers, weights, false);
    const optimizer_apply<Optim, stored_type> apply = apply_for(constants);
    device_guard on(towers.device(0));
    root_start_.record(towers.stream(0));
    if (rounds.empty()) {
      launch_fused_apply_for<Policy, 1>(nodes_[0]->chunks, towers.stream(0), 1, nodes_[0]->sums->const_view(), weights,
                                        apply);
    } else {
      nodes_[0]->chunks.template launch<Policy>(tree_root_agent<Optim, stored_type>{nodes_[0]->sums->view(), rounds.back().front(), apply},
                                                towers.stream(0));
    }
    broadcast_and_wait(towers, rounds, stages);
  }

  // A checked step, pass 1: the tree's rounds, then its last edge through the screen (programs/screen.hpp)
  // into the average on tower 0's device; the rounds check the raw gradients they read.
  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<stored_type>& weights,
                                 const accumulation<stored_type>& step, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::p2p_tree screen");
    const auto rounds = run_tree(towers, weights, true);
    device_guard on(towers.device(0));
    const cuda_stream& stream = towers.stream(0);
    root_start_.record(stream);
    if (rounds.empty()) {
      launch_tower_screen(average_.screen, stream, 1, nodes_[0]->sums->const_view(), weights, average_.table.view(), step);
    } else {
      const edge_average_source<stored_type> edge{nodes_[0]->sums->view(), rounds.back().front()};
      average_.screen.launch(accumulating_source<edge_average_source<stored_type>, stored_type>{edge, average_.table.view(), step},
                             average_.table.view(), stream);
    }
    root_end_.record(stream);
    root_end_.synchronize();  // after every round too: the root's edge waited for them
    tree_start_.synchronize();  // on a stream of its own, which nothing above waited for
    stages.reduce = seconds_between(tree_start_, root_end_);
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + screen", "reduce (GPU)");
    screen_partials partials = average_.screen.results();
    for (const auto& own : nodes_) partials.first_nonfinite = std::min(partials.first_nonfinite, own->host_key[0]);
    return partials;
  }

  // Pass 2: the optimizer on scale * average on tower 0's device, then the broadcast down the tree.
  void apply_averaged(cuda_towers<Layout>& towers, stored_type scale, const typename Optim::template step_constants<stored_type>& constants,
                      stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::p2p_tree apply");
    device_guard on(towers.device(0));
    root_start_.record(towers.stream(0));
    launch_fused_apply_for<Policy, 1>(nodes_[0]->chunks, towers.stream(0), 1, average_.table.const_view(),
                                      std::vector<stored_type>{scale}, apply_for(constants));
    const std::size_t n = towers.towers();
    broadcast_and_wait(towers, canonical_tree_rounds<stored_type>(static_cast<int>(n), std::vector<stored_type>(n, stored_type(1))),
                       stages);
  }

 private:
  // Every round but the last, each edge on its left tower's stream after the right tower's last write to
  // its buffer; returns the rounds (the last one's only edge is the root's: left = 0). `checked`: the
  // raw operands' non-finite keys go to each left tower's key word, and come back to host_key.
  std::vector<std::vector<tree_edge<stored_type>>> run_tree(cuda_towers<Layout>& towers, const std::vector<stored_type>& weights,
                                                            bool checked) {
    const auto rounds = canonical_tree_rounds<stored_type>(static_cast<int>(towers.towers()), weights);
    // The reduction starts when the last tower's gradients are ready: marked on a stream of its own, so
    // that no tower waits for more than its edges need.
    {
      device_guard on(towers.device(0));
      for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(timing_stream_);
      tree_start_.record(timing_stream_);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      nodes_[t]->partial_ready = &towers.gradients_ready(t);
      nodes_[t]->host_key[0] = no_nonfinite;
      if (checked) {
        device_guard on(towers.device(t));
        TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(nodes_[t]->key.get(), 0xFF, sizeof(nonfinite_key), towers.stream(t).get()));
      }
    }
    if (checked) average_.screen.reset(towers.stream(0));
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<stored_type>& edge : rounds[r]) {
        node& left = *nodes_[static_cast<std::size_t>(edge.left)];
        const std::size_t right = static_cast<std::size_t>(edge.right);
        const cuda_stream& stream = towers.stream(static_cast<std::size_t>(edge.left));
        device_guard on(stream.device());
        nodes_[right]->partial_ready->make_wait(stream);
        run_copies_async(nodes_[right]->operand_copies, stream);
        if (!left.edge_start.empty()) left.edge_start[r].record(stream);
        left.chunks.template launch<Policy>(tree_round_agent<stored_type>{left.sums->view(), edge, checked ? left.key.get() : nullptr},
                                            stream);
        if (!left.edge_end.empty()) left.edge_end[r].record(stream);
        if (checked)  // before partial_done: whoever waits for the partial has the key too
          TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(left.host_key.get(), left.key.get(), sizeof(nonfinite_key),
                                               cudaMemcpyDeviceToHost, stream.get()));
        left.partial_done.record(stream);
        left.partial_ready = &left.partial_done;
      }
    }
    // The root's own edge waits for its right operand, and copies it where it has no peer access.
    if (!rounds.empty()) {
      const tree_edge<stored_type>& edge = rounds.back().front();
      const std::size_t right = static_cast<std::size_t>(edge.right);
      const cuda_stream& stream = towers.stream(0);
      device_guard on(stream.device());
      nodes_[right]->partial_ready->make_wait(stream);
      run_copies_async(nodes_[right]->operand_copies, stream);
    }
    return rounds;
  }

  optimizer_apply<Optim, stored_type> apply_for(const typename Optim::template step_constants<stored_type>& constants) const {
    return {root_targets_->view(), this->state_table(), root_replica_count_, this->state_slot_count(), constants, {}};
  }

  // After the root's pass on tower 0's stream: the parameters go down the tree — the towers the root
  // wrote have them with the root's; every other tower pulls its parent's replica on its own stream.
  // Each tower's next work waits for them; the host waits for all.
  void broadcast_and_wait(cuda_towers<Layout>& towers, const std::vector<std::vector<tree_edge<stored_type>>>& rounds,
                          stage_seconds& stages) {
    {
      device_guard on(towers.device(0));
      root_end_.record(towers.stream(0));
      nodes_[0]->parameters_done.record(towers.stream(0));
    }
    nodes_[0]->parameters_ready = &nodes_[0]->parameters_done;
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      for (const tree_edge<stored_type>& edge : *r) {
        const std::size_t child = static_cast<std::size_t>(edge.right), parent = static_cast<std::size_t>(edge.left);
        node& own = *nodes_[child];
        const cuda_stream& stream = towers.stream(child);
        device_guard on(stream.device());
        nodes_[parent]->parameters_ready->make_wait(stream);
        if (wiring_.written_by_root[child]) {
          own.parameters_ready = nodes_[parent]->parameters_ready;
          continue;
        }
        own.pull_start.record(stream);
        if (wiring_.pulls_directly[child]) {
          own.chunks.template launch<Policy>(copy_agent<stored_type>{own.parent_replica->const_view(), own.own_replica->view(), 1}, stream);
        } else {
          run_copies_async(own.pull_copies, stream);
        }
        own.parameters_done.record(stream);
        own.parameters_ready = &own.parameters_done;
      }
    }
    for (const auto& own : nodes_) own->parameters_ready->synchronize();
    tree_start_.synchronize();  // on a stream of its own, which nothing above waited for
    stages.reduce = seconds_between(tree_start_, root_end_);
    stages.broadcast = broadcast_seconds();
    if (towers.trace().on()) record_device_spans(towers, rounds);
  }

  struct node {
    // `timed_rounds`: how many tree rounds get timing events (0 without a timeline).
    node(const variable_set& variables, int device, std::size_t chunk_elements, std::size_t timed_rounds)
        : chunks(make_chunk_table(variables, chunk_elements), device),
          key(cuda_device_memory{device}.allocate<nonfinite_key>(1, 256)),
          host_key(cuda_pinned_memory{}.allocate<nonfinite_key>(1)),
          partial_done(device),
          pull_start(device, true),
          parameters_done(device, true) {
      for (std::size_t r = 0; r < timed_rounds; ++r) {
        edge_start.emplace_back(device, true);
        edge_end.emplace_back(device, true);
      }
    }

    device_chunk_table chunks;
    std::unique_ptr<device_buffer> scratch;                // only without peer access to some tower
    std::unique_ptr<device_pointer_table<stored_type>> sums;          // role = tower: partial sums as this tower reads them
    std::unique_ptr<device_pointer_table<stored_type>> parent_replica, own_replica;  // only for towers that pull
    copy_list<stored_type> operand_copies;  // this tower's partial into its parent's scratch, where the parent needs one
    copy_list<stored_type> pull_copies;     // its parent's replica into its own, where it pulls through a copy
    cuda_device_memory::owner<nonfinite_key> key;  // checked steps: the first non-finite raw operand it read
    cuda_pinned_memory::owner<nonfinite_key> host_key;
    cuda_event partial_done;
    cuda_event pull_start, parameters_done;  // timing: the pull of the new parameters, where it pulls
    const cuda_event* parameters_ready = nullptr;  // this step: when this tower's new parameters are in
    const cuda_event* partial_ready = nullptr;     // this step: the last write to this tower's sums
    std::vector<cuda_event> edge_start, edge_end;  // per round where this tower is the left side
  };

  // The broadcast's critical path: the longest chain of pulls from the root down the tree, each pull timed
  // on its own device (towers on different devices have no common device clock).
  double broadcast_seconds() const {
    std::vector<double> arrival(nodes_.size(), 0.0);  // parents come before their children
    double longest = 0;
    for (std::size_t t = 1; t < nodes_.size(); ++t) {
      arrival[t] = arrival[static_cast<std::size_t>(wiring_.parent[t])];
      if (!wiring_.written_by_root[t]) arrival[t] += seconds_between(nodes_[t]->pull_start, nodes_[t]->parameters_done);
      longest = std::max(longest, arrival[t]);
    }
    return longest;
  }

  // After a step, with a timeline: the root edge on row "reduce (GPU)", the other edges and the pulls of
  // the new parameters on the rows of the towers whose streams ran them.
  void record_device_spans(cuda_towers<Layout>& towers, const std::vector<std::vector<tree_edge<stored_type>>>& rounds) const {
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + apply", "reduce (GPU)");
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<stored_type>& edge : rounds[r]) {
        const std::size_t left = static_cast<std::size_t>(edge.left);
        towers.device_span(left, nodes_[left]->edge_start[r], nodes_[left]->edge_end[r],
                           make_message("tree edge: + tower ", edge.right), "tower ", left, " (GPU)");
      }
    }
    for (std::size_t t = 1; t < nodes_.size(); ++t) {
      if (wiring_.written_by_root[t]) continue;  // written by the root's pass, on row "reduce (GPU)"
      towers.device_span(t, nodes_[t]->pull_start, nodes_[t]->parameters_done,
                         make_message("broadcast: pull from tower ", wiring_.parent[t]), "tower ", t, " (GPU)");
    }
  }

  tree_wiring wiring_;          // which buffers each edge and pull uses in place, which through copies
  cuda_stream timing_stream_;  // on tower 0's device: marks when the last tower's gradients were ready
  cuda_event tree_start_, root_start_, root_end_;
  std::unique_ptr<device_pointer_table<stored_type>> root_targets_;  // role 0: tower 0's replica, then those towers'
  int root_replica_count_ = 1;
  std::vector<std::unique_ptr<node>> nodes_;
  device_average<Layout> average_;  // checked steps, on tower 0's device
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
};
using p2p_tree = p2p_tree_with<>;

}  // namespace reduce

template <class Optim, class Layout, class LaunchPolicy>
struct reducer_for<exec::cuda, reduce::p2p_tree_with<LaunchPolicy>, Optim, Layout> {
  using type = detail::p2p_tree_reducer<Optim, Layout, LaunchPolicy>;
};

}  // namespace towerpipe
