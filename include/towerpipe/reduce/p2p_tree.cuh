#pragma once
// reduce::p2p_tree — the canonical tree itself, run by the towers: in round r tower i adds tower
// i + 2^r's partial sum into its own gradient buffer (programs/canonical_order.hpp), on its own stream,
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
// the reading tower's device (cudaMemcpyPeerAsync), with a one-time warning through the log sink.
//
// A checked step (programs/screen.hpp): the same rounds, each checking the raw gradients it reads; the
// root's edge runs as the screen into an average on tower 0's device; the apply reads that average.
//
// Mixed precision (bf16 or fp16 towers; every such step is a checked one): each tower with children in
// the tree keeps its partial sum in an fp32 buffer on its device beside its 16-bit gradients
// (programs/agents.hpp tree_operands), since the canonical sums are fp32's; a raw 16-bit gradient is
// widened where an edge reads it. The optimizer runs on an fp32 master on tower 0's device (as
// device0's) and the replicas get it rounded to nearest even; the pulls move 16-bit replicas.
//
// Gradient buckets (reduce/overlapped_reduction.hpp): once every tower has marked a bucket, its rounds,
// root edge (fused apply, or screen) and pulls run over the bucket's chunks only, each on the side
// stream that runs it in the whole step, after the bucket's events; each element still goes through the
// same edges in the same order, so the bits are the unbucketed step's. A bucket's edges write partial
// sums into the towers' gradients of that bucket and its pass writes replicas of that bucket only:
// what every tower has marked, so none of them writes or reads it any more this step.

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
#include "towerpipe/reduce/whole_step.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/stats.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class p2p_tree_reducer : public device_optimizer_state<Optim, Layout>,
                         public whole_step_as_one_part<p2p_tree_reducer<Optim, Layout, Policy>> {
 public:
  using stored_type = typename Layout::value_type;  // the towers' gradients and replicas
  using T = master_type_t<stored_type>;             // partial sums, master, state, average
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using device_buffer = typename Layout::template buffer<cuda_device_memory>;
  using partial_buffer = typename Layout::template buffer<cuda_device_memory, T>;  // device_buffer in full precision
  using hyper_parameters = typename Optim::hyper_parameters;

  p2p_tree_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                   const pipeline_options& options)
      : device_optimizer_state<Optim, Layout>(variables, h, towers.device(0)),
        whole_step_as_one_part<p2p_tree_reducer>(variables.count()),
        wiring_(towers.access()),
        timing_stream_(towers.device(0)),
        tree_start_(towers.device(0), true),
        root_start_(towers.device(0), true),
        root_end_(towers.device(0), true),
        average_(variables, towers.device(0)),
        chunk_runs_(make_chunk_table(variables, Policy::chunk_elements), variables.count()),
        tile_runs_(average_.screen.tiles(), variables.count()),
        // The poison check reads a tower's whole gradients after it returns, where in full precision the
        // edges of its marked buckets may have written partial sums already (16-bit towers keep theirs apart).
        overlaps_(mixed || !options.poison_gradients) {
    check_device_tower_count("reduce::p2p_tree", towers.towers());
    const std::size_t n = towers.towers();
    const std::size_t count = variables.count();
    // The root's apply writes these replicas in the same pass: one pass instead of one plus a pull each.
    const std::vector<stored_type*> root_targets = wiring_.root_target_pointers<stored_type>(towers);
    root_replica_count_ = wiring_.root_replicas();
    const std::vector<tensor_chunk> chunk_list = make_chunk_table(variables, Policy::chunk_elements);
    const auto aligned_table = [&](const auto& pointers, int device, const char* what) {
      using element = std::remove_pointer_t<typename std::decay_t<decltype(pointers)>::value_type>;
      return std::make_unique<device_pointer_table<element>>(
          vector_pointer_table<Policy>(pointers, static_cast<int>(count), chunk_list, device, what));
    };
    root_targets_ = aligned_table(root_targets, towers.device(0), "reduce::p2p_tree: the replicas the root writes");
    // Where each tower with children keeps its partial sum: its gradient buffer, or (mixed) an fp32 buffer.
    std::vector<partial_buffer*> partials(n, nullptr);
    for (std::size_t t = 0; t < n; ++t) {
      if (!wiring_.has_children[t]) continue;
      if constexpr (mixed) {
        own_partials_.push_back(std::make_unique<partial_buffer>(variables, cuda_device_memory{towers.device(t)}));
        partials[t] = own_partials_.back().get();
      } else {
        partials[t] = &towers.gradients(t);
      }
    }
    const std::size_t rounds = canonical_tree_rounds<T>(static_cast<int>(n), std::vector<T>(n, T(1))).size();
    for (std::size_t t = 0; t < n; ++t) {
      const int device = towers.device(t);
      nodes_.push_back(std::make_unique<node>(variables, device, Policy::chunk_elements, towers.trace().on() ? rounds : 0));
      node& own = *nodes_.back();
      if (wiring_.needs_scratch[t]) {
        // Full precision: one scratch serves a child's raw gradient and a child's partial sum alike.
        if (!mixed || wiring_.needs_raw_scratch[t]) own.raw_scratch = std::make_unique<device_buffer>(variables, cuda_device_memory{device});
        if (mixed && wiring_.needs_partial_scratch[t])
          own.partial_scratch = std::make_unique<partial_buffer>(variables, cuda_device_memory{device});
        log_warning(make_message("reduce::p2p_tree: tower ", t, " (device ", device,
                                 ") reads some of its children in the tree through copies: no direct access"));
        overlaps_ = false;  // whole copies: every bucket waits for the whole gradients
      }
      own.raw = aligned_table(wiring_.raw_pointers<stored_type>(towers, t, own.raw_scratch.get()), device,
                              "reduce::p2p_tree: the raw gradients a tower reads");
      own.sums = aligned_table(wiring_.partial_pointers<T>(partials, t, own.partial_scratch_or_raw(), count), device,
                               "reduce::p2p_tree: the partial sums a tower reads and writes");
      if (t == 0) continue;
      // Parents come first in tower order (left < right on every edge): the parent's scratch exists.
      const node& parent = *nodes_[static_cast<std::size_t>(wiring_.parent[t])];
      own.raw_operand_copies = wiring_.raw_operand_copies<stored_type>(towers, t, parent.raw_scratch.get());
      own.partial_operand_copies = wiring_.partial_operand_copies<T>(towers, t, partials, parent.partial_scratch_or_raw());
      own.pull_copies = wiring_.pull_copies<stored_type>(towers, t);
      if (wiring_.written_by_root[t]) continue;
      if (!wiring_.pulls_directly[t]) overlaps_ = false;  // a whole copy of the parent's replica
      // A tower that pulls its parameters from its parent.
      std::vector<device_buffer*> target{&towers.replica(t)};
      own.own_replica = aligned_table(gather_pointers<stored_type>(target), device, "reduce::p2p_tree: the replica a tower pulls into");
      std::vector<device_buffer*> source{&towers.replica(static_cast<std::size_t>(wiring_.parent[t]))};
      own.parent_replica = aligned_table(gather_pointers<stored_type>(source), device, "reduce::p2p_tree: the replica a tower pulls from");
    }
  }

  // Gradient buckets (reduce/overlapped_reduction.hpp): a bucket's rounds, root edge and pulls over the
  // bucket's chunks, each tower's share on its side stream after the bucket's events, enqueued from the
  // worker thread while the towers go on; what the towers left waits for their whole gradients and
  // finishes the step. Off where an edge or a pull copies whole buffers (no peer access) and with
  // poison_gradients.
  bool overlaps_buckets() const { return overlaps_; }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                              const typename Optim::template step_constants<T>& constants, stage_seconds& stages) {
    if constexpr (mixed) {
      fail("reduce::p2p_tree: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    } else {
      const nvtx_range range("towerpipe reduce::p2p_tree part");
      const std::vector<chunk_group> runs = chunk_runs_.runs(part.variables);
      const auto rounds = run_rounds(towers, part, weights, runs, false);
      const optimizer_apply<Optim, T, stored_type> apply = apply_for(constants);
      node& root = *nodes_[0];
      {
        device_guard on(root.side.device());
        if (!part.during_towers()) root_start_.record(root.side);
        for (const chunk_group& run : runs) {
          if (rounds.empty()) {
            launch_fused_apply_for<Policy, 1>(root.chunks, root.side, 1, root.raw->const_view(), weights, apply, run);
          } else {
            root.chunks.template launch<Policy>(tree_root_agent<Optim, T>{root.operands(), rounds.back().front(), apply}, root.side, run);
          }
        }
        if (!part.during_towers()) root_end_.record(root.side);
      }
      broadcast(rounds, runs);
      if (part.during_towers()) return;
      finish_step(towers, false, stages);
      if (towers.trace().on()) record_device_spans(towers, rounds);
    }
  }
  // After a failed step: the parts enqueued on the side streams done, and the towers' next work after them.
  void join_parts(cuda_towers<Layout>& towers) { order_towers_after_sides(towers); }

  // Before a checked step's parts: the raw operands' keys and the screen's, on the streams that lower them.
  screen_partials begin_screen() {
    for (const auto& own : nodes_) {
      device_guard on(own->side.device());
      TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(own->key.get(), 0xFF, sizeof(nonfinite_key), own->side.get()));
      own->host_key[0] = no_nonfinite;
    }
    average_.screen.reset(nodes_[0]->side);
    return {};
  }
  // A checked step's part: the same rounds, each checking the raw gradients it reads, then the root's
  // edge through the screen (programs/screen.hpp) into the average on tower 0's device.
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights, const accumulation<T>& step,
                   screen_partials& partials, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::p2p_tree screen part");
    const auto rounds = run_rounds(towers, part, weights, chunk_runs_.runs(part.variables), true);
    const cuda_stream& stream = nodes_[0]->side;
    device_guard on(stream.device());
    if (!part.during_towers()) root_start_.record(stream);
    for (const chunk_group& tiles : tile_runs_.runs(part.variables)) {
      if (rounds.empty()) {
        launch_tower_screen(average_.screen, stream, 1, nodes_[0]->raw->const_view(), weights, average_.table.view(), step, tiles);
      } else {
        const edge_average_source<T, stored_type> edge{nodes_[0]->operands(), rounds.back().front()};
        average_.screen.launch(accumulating_source<edge_average_source<T, stored_type>, T>{edge, average_.table.view(), step},
                               average_.table.view(), stream, tiles);
      }
    }
    if (part.during_towers()) return;
    average_.screen.read_key(stream);  // also when no tile was launched
    root_end_.record(stream);
    finish_step(towers, true, stages);  // the towers may write their gradients again once this returns
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + screen", "reduce (GPU)");
    partials = average_.screen.results();
    for (const auto& own : nodes_) partials.first_nonfinite = std::min(partials.first_nonfinite, own->host_key[0]);
  }

  // Pass 2: the optimizer on scale * average on tower 0's device, then the broadcast down the tree.
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const typename Optim::template step_constants<T>& constants,
                      stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::p2p_tree apply");
    const cuda_stream& stream = nodes_[0]->side;
    {
      device_guard on(stream.device());
      root_start_.record(stream);
      launch_fused_apply_for<Policy, 1>(nodes_[0]->chunks, stream, 1, average_.table.const_view(), std::vector<T>{scale},
                                        apply_for(constants));
      root_end_.record(stream);
    }
    const std::size_t n = towers.towers();
    const auto rounds = canonical_tree_rounds<T>(static_cast<int>(n), std::vector<T>(n, T(1)));
    broadcast(rounds, {every_chunk});
    finish_step(towers, false, stages);
    if (towers.trace().on()) record_device_spans(towers, rounds);
  }

 private:
  // A part's work on the side streams, up to the root's edge: every side stream waits for its tower's
  // gradients of the part (the bucket's event, or all of them after the towers), then every round but
  // the last over the part's chunk runs, each edge on its left tower's side stream after the right
  // tower's last write to its operand; the root's side stream last waits for the root edge's right
  // operand (copying it where it has no peer access). Returns the rounds (the last one's only edge is
  // the root's: left = 0). `checked`: the raw operands' non-finite keys go to each left tower's key.
  std::vector<std::vector<tree_edge<T>>> run_rounds(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                                                    const std::vector<chunk_group>& runs, bool checked) {
    const auto rounds = canonical_tree_rounds<T>(static_cast<int>(towers.towers()), weights);
    const bool last_part = !part.during_towers();
    if (last_part) {  // stages.reduce starts when the last tower's gradients are ready, on a stream no tower waits for
      device_guard on(towers.device(0));
      for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(timing_stream_);
      tree_start_.record(timing_stream_);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      node& own = *nodes_[t];
      // Its edges add into its partial sum and its pull overwrites its parameters: both after its marks.
      own.partial_ready = last_part ? &towers.gradients_ready(t) : &towers.bucket_done(t, part.bucket);
      own.partial_ready->make_wait(own.side);
    }
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<T>& edge : rounds[r]) {
        node& left = *nodes_[static_cast<std::size_t>(edge.left)];
        const node& right = *nodes_[static_cast<std::size_t>(edge.right)];
        device_guard on(left.side.device());
        right.partial_ready->make_wait(left.side);
        right.copy_operand(left.side);
        const bool timed = last_part && !left.edge_start.empty();
        if (timed) left.edge_start[r].record(left.side);
        for (const chunk_group& run : runs)
          left.chunks.template launch<Policy>(
              tree_round_agent<T, stored_type>{left.operands(), edge, checked ? left.key.get() : nullptr}, left.side, run);
        if (timed) left.edge_end[r].record(left.side);
        left.partial_done.record(left.side);
        left.partial_ready = &left.partial_done;
      }
    }
    if (!rounds.empty()) {
      const node& right = *nodes_[static_cast<std::size_t>(rounds.back().front().right)];
      const cuda_stream& stream = nodes_[0]->side;
      device_guard on(stream.device());
      right.partial_ready->make_wait(stream);
      right.copy_operand(stream);
    }
    return rounds;
  }

  optimizer_apply<Optim, T, stored_type> apply_for(const typename Optim::template step_constants<T>& constants) const {
    return {root_targets_->view(), this->state_table(), root_replica_count_, this->state_slot_count(), constants, this->master_table()};
  }

  // After the root's pass over `runs` on its side stream: the parameters go down the tree — the towers
  // the root wrote have them with the root's; every other tower pulls its parent's replica over the same
  // runs on its side stream, after its parent's.
  void broadcast(const std::vector<std::vector<tree_edge<T>>>& rounds, const std::vector<chunk_group>& runs) {
    nodes_[0]->parameters_done.record(nodes_[0]->side);
    nodes_[0]->parameters_ready = &nodes_[0]->parameters_done;
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      for (const tree_edge<T>& edge : *r) {
        const std::size_t child = static_cast<std::size_t>(edge.right), parent = static_cast<std::size_t>(edge.left);
        node& own = *nodes_[child];
        if (wiring_.written_by_root[child]) {
          own.parameters_ready = nodes_[parent]->parameters_ready;
          continue;
        }
        device_guard on(own.side.device());
        nodes_[parent]->parameters_ready->make_wait(own.side);
        own.pull_start.record(own.side);
        if (wiring_.pulls_directly[child]) {
          for (const chunk_group& run : runs)
            own.chunks.template launch<Policy>(copy_agent<stored_type>{own.parent_replica->const_view(), own.own_replica->view(), 1},
                                               own.side, run);
        } else {
          run_copies_async(own.pull_copies, own.side);
        }
        own.parameters_done.record(own.side);
        own.parameters_ready = &own.parameters_done;
      }
    }
  }

  // The end of a step's last part: checked, each tower's key to the host; then order_towers_after_sides
  // and the stages' seconds.
  void finish_step(cuda_towers<Layout>& towers, bool checked, stage_seconds& stages) {
    if (checked) {
      for (const auto& own : nodes_) {
        device_guard on(own->side.device());
        TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(own->host_key.get(), own->key.get(), sizeof(nonfinite_key), cudaMemcpyDeviceToHost,
                                             own->side.get()));
      }
    }
    order_towers_after_sides(towers);
    tree_start_.synchronize();  // on a stream of its own, which nothing above waited for
    stages.reduce = seconds_between(tree_start_, root_end_);
    if (!checked) stages.broadcast = broadcast_seconds();
  }

  // Each tower's next work waits for the side streams that touch its buffers — its own (its edges, its
  // pull) and its parent's (the edge that reads its partial; the root's writes its replica) — and the
  // host waits for every side stream.
  void order_towers_after_sides(cuda_towers<Layout>& towers) {
    for (const auto& own : nodes_) own->side_done.record(own->side);
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      nodes_[t]->side_done.make_wait(towers.stream(t));
      if (t != 0) nodes_[static_cast<std::size_t>(wiring_.parent[t])]->side_done.make_wait(towers.stream(t));
    }
    for (const auto& own : nodes_) own->side_done.synchronize();
  }

  struct node {
    // `timed_rounds`: how many tree rounds get timing events (0 without a timeline).
    node(const variable_set& variables, int device, std::size_t chunk_elements, std::size_t timed_rounds)
        : chunks(make_chunk_table(variables, chunk_elements), device),
          side(device),
          side_done(device),
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
    // The tree's work on this tower's device, beside the tower's own stream: a bucket's edges and pull
    // run while the tower computes the next layers' gradients.
    cuda_stream side;
    cuda_event side_done;  // the end of the side stream's work of a step
    // Only without peer access to some child: where its operands are copied (programs/copy_wiring.hpp
    // tree_wiring). In full precision raw_scratch takes both kinds.
    std::unique_ptr<device_buffer> raw_scratch;
    std::unique_ptr<partial_buffer> partial_scratch;
    std::unique_ptr<device_pointer_table<stored_type>> raw;  // role = tower: raw gradients as this tower reads them
    std::unique_ptr<device_pointer_table<T>> sums;           // role = tower: partial sums as this tower reads and writes them
    std::unique_ptr<device_pointer_table<stored_type>> parent_replica, own_replica;  // only for towers that pull
    // This tower's operand into its parent's scratch, where the parent needs one: its raw gradient or its
    // partial sum (one of the two lists is empty).
    copy_list<stored_type> raw_operand_copies;
    copy_list<T> partial_operand_copies;
    copy_list<stored_type> pull_copies;  // its parent's replica into its own, where it pulls through a copy
    cuda_device_memory::owner<nonfinite_key> key;  // checked steps: the first non-finite raw operand it read
    cuda_pinned_memory::owner<nonfinite_key> host_key;
    cuda_event partial_done;
    cuda_event pull_start, parameters_done;  // timing: the pull of the new parameters, where it pulls
    const cuda_event* parameters_ready = nullptr;  // this step: when this tower's new parameters are in
    const cuda_event* partial_ready = nullptr;     // this step: the last write to this tower's sums
    std::vector<cuda_event> edge_start, edge_end;  // per round where this tower is the left side

    tree_operands<T, stored_type> operands() const { return {raw->const_view(), sums->view()}; }
    const partial_buffer* partial_scratch_or_raw() const {
      if constexpr (mixed) return partial_scratch.get();
      else return raw_scratch.get();
    }
    // On `stream` (its parent's side stream): this tower's operand into the parent's scratch, where needed.
    void copy_operand(const cuda_stream& stream) const {
      run_copies_async(raw_operand_copies, stream);
      run_copies_async(partial_operand_copies, stream);
    }
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
  void record_device_spans(cuda_towers<Layout>& towers, const std::vector<std::vector<tree_edge<T>>>& rounds) const {
    towers.device_span(0, root_start_, root_end_, "p2p_tree root: last edge + apply", "reduce (GPU)");
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<T>& edge : rounds[r]) {
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
  std::vector<std::unique_ptr<partial_buffer>> own_partials_;  // mixed precision: the fp32 partial sums of the towers with children
  device_average<Layout> average_;  // checked steps, on tower 0's device
  chunks_by_variable chunk_runs_, tile_runs_;  // where a part's variables lie in the chunk table and the screen's tiles
  bool overlaps_;                              // buckets go during the towers (overlaps_buckets)
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
