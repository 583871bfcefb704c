#pragma once
// reduce::sharded — the optimizer sharded over the processes of a pipeline (pipeline_options::processes,
// comm/process_group.hpp; one process without it), for host towers (GPU towers: reduce/sharded/gpu_towers.cuh).
// Bitwise equal to one process with the same total towers (README.md, invariant 2), whatever the process
// count.
//
// The parameters' elements, all variables end to end, are cut into one contiguous slice per process.
// A step:
//   1. contributions: each process sends every owner its contributions to the owner's slice (one
//      personalised all-to-all). With a power-of-two count L of towers per process, process r's towers
//      rL ... rL + L - 1 form a subtree of the canonical tree (programs/canonical_order.hpp), so the
//      process sends its local canonical sum of w_i * g_i: one partial per process crosses the wire.
//      With other counts that is not so, and it sends each tower's w_i * g_i (L times the bytes): the
//      owner runs the whole tree.
//   2. owner: the canonical sum over the leaves it received (the tree's upper levels over the R
//      partials, or the whole tree over the N = R * L gradients), then the optimizer on its slice with
//      its slice of the optimizer state (1/R of the memory).
//   3. every process gathers every slice's new parameters (an all-gather: a copy, free of order).
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
// Checked steps (programs/screen.hpp: skipping or throwing on non-finite values, clipping, loss scaling,
// accumulation): the owners keep their slice of the average and screen it; slices start where screen
// tiles start, so each tile's sum of squares is computed whole by one owner, and every process gathers
// all of them and the first non-finite key — the same norm, skip and report as in one process.
//
// Mixed precision (bf16/fp16 towers): contributions are the widened gradients' products in the master
// type, the owners hold their slice of the state in it, and every process gathers the whole master copy
// (4 bytes a parameter) and rounds it for its towers — as one process's reduce::host does.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/programs/canonical_order.hpp"
#include "towerpipe/reduce/host.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/programs/screen.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/split.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {

namespace reduce {

// The optimizer sharded over processes (see the top of this header).
struct sharded {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "sharded";
};

}  // namespace reduce

namespace detail {

// The flat element space (every variable's elements, in variable order) and its slices, one per process.
// Slices start where screen tiles start (programs/screen.hpp: 2048 elements from each variable's start), so
// that every tile's sum of squares is one owner's, computed as one process computes it.
class slice_plan {
 public:
  slice_plan(const variable_set& variables, int processes) {
    for (const variable& v : variables) {
      variable_start_.push_back(total_);
      total_ += v.size;
    }
    variable_start_.push_back(total_);
    for (int r = 0; r <= processes; ++r)
      bounds_.push_back(tile_start_at_or_before(total_ * static_cast<std::size_t>(r) / static_cast<std::size_t>(processes)));
  }
  std::size_t total() const { return total_; }
  std::size_t first(int owner) const { return bounds_[static_cast<std::size_t>(owner)]; }
  std::size_t size(int owner) const { return first(owner + 1) - first(owner); }
  std::size_t variable_start(std::size_t v) const { return variable_start_[v]; }
  // The screen tiles of owner r's slice, in flat order: (first flat index, element count) each. A slice
  // starts at a tile, so each of its pieces does too.
  std::vector<std::pair<std::size_t, std::size_t>> tiles_of(int owner) const {
    std::vector<std::pair<std::size_t, std::size_t>> tiles;
    for_each_piece(first(owner), first(owner + 1), [&](std::size_t, std::size_t, std::size_t count, std::size_t flat) {
      for (std::size_t at = 0; at < count; at += screen_tile_elements)
        tiles.emplace_back(flat + at, std::min(screen_tile_elements, count - at));
    });
    return tiles;
  }

  // f(variable, first element, count, flat index of that element) for each variable's part of [lo, hi).
  template <class F>
  void for_each_piece(std::size_t lo, std::size_t hi, F&& f) const {
    for (std::size_t v = 0; v + 1 < variable_start_.size(); ++v) {
      const std::size_t begin = std::max(lo, variable_start_[v]), end = std::min(hi, variable_start_[v + 1]);
      if (begin < end) f(v, begin - variable_start_[v], end - begin, begin);
    }
  }

 private:
  std::size_t tile_start_at_or_before(std::size_t flat) const {
    if (flat >= total_) return total_;
    std::size_t v = 0;  // the variable holding `flat`
    while (flat >= variable_start_[v + 1]) ++v;
    return variable_start_[v] + (flat - variable_start_[v]) / screen_tile_elements * screen_tile_elements;
  }

  std::vector<std::size_t> variable_start_;  // per variable, then the total
  std::vector<std::size_t> bounds_;          // owner r: [bounds_[r], bounds_[r + 1])
  std::size_t total_ = 0;
};

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
template <class Optim, class Layout>
class sharded_host_reducer {
 public:
  using stored_type = typename Layout::value_type;  // the towers' parameters and gradients
  using T = master_type_t<stored_type>;             // the master parameters, state, sums
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using hyper_parameters = typename Optim::hyper_parameters;
  using constants_type = typename Optim::template step_constants<T>;
  static constexpr std::size_t block = 256;              // elements per canonical_tree_reduce over scratch rows
  static constexpr std::size_t work_elements = 1 << 15;  // elements per task on the thread pool (whole tiles)

  // `span`: the processes, their configuration already compared (step/processes.hpp).
  sharded_host_reducer(const variable_set& variables, const hyper_parameters& h, host_towers<Layout>&,
                       const pipeline_options& options, const processes& span)
      : variables_(variables),
        span_(span),
        rank_(span_.rank()),
        processes_(span_.size()),
        local_towers_(span_.local_towers()),
        plan_(variables, processes_),
        partials_(is_power_of_two(local_towers_)),
        contributions_(partials_ ? 1 : local_towers_) {
    const std::size_t mine = plan_.size(rank_);
    for (int slot = 0; slot < Optim::state_slots(h); ++slot) state_.emplace_back(mine, T(0));
    send_.resize(contributions_ * plan_.total());
    // One process receives what it sent and gathers what it updated: it reads them where they are.
    if (processes_ > 1) received_.resize(contributions_ * static_cast<std::size_t>(processes_) * mine);
    updated_.resize(mine);
    gathered_.resize(plan_.total());
    if constexpr (mixed) master_.resize(plan_.total());
    if (takes_checked_steps(options, mixed)) {
      averaged_.resize(mine);
      my_tiles_ = plan_.tiles_of(rank_);
    }
  }

  // Mixed precision: every process keeps the whole master copy (the gather brings it every step), whose
  // rounded copy the towers see; the pipeline reads it here and sets it through parameter_set.
  tensor_view<const T> master_on_host(std::size_t index) const {
    return tensor_view<const T>(master_.data() + plan_.variable_start(index), variables_[index].shape);
  }
  void parameter_set(std::size_t index, const T* values) {
    if constexpr (mixed) std::copy(values, values + variables_[index].size, master_.data() + plan_.variable_start(index));
  }

  std::size_t state_slots() const { return state_.size(); }
  // Collective (see the top): gathers the slot's slices, once per slot between steps.
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    if (gathered_slot_ != static_cast<int>(slot)) {
      gather(state_[slot].data(), gathered_.data(), "gathering optimizer state");
      gathered_slot_ = static_cast<int>(slot);
    }
    return tensor_view<const T>(gathered_.data() + plan_.variable_start(index), variables_[index].shape);
  }
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    gathered_slot_ = -1;
    const std::size_t lo = plan_.first(rank_);
    plan_.for_each_piece(lo, lo + plan_.size(rank_), [&](std::size_t v, std::size_t first, std::size_t count, std::size_t flat) {
      if (v == index) std::copy(values + first, values + first + count, state_[slot].data() + (flat - lo));
    });
  }

  // One fused step: contributions to their owners, canonical sum, optimizer, parameters gathered.
  void average_and_apply(host_towers<Layout>& towers, const std::vector<T>& weights, const constants_type& constants,
                         stage_seconds& stages) {
    if constexpr (mixed) fail("reduce::sharded: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    const auto start = std::chrono::steady_clock::now();
    send_contributions(towers, weights, false);
    update_slice(towers, constants, [&](std::size_t j, std::size_t n, const T*& sum, T (&scratch)[32][block]) {
      canonical_sum(j, n, scratch);
      sum = scratch[0];
    });
    finish_step(towers, start, stages);
  }

  // A checked step, pass 1 (programs/screen.hpp): contributions to their owners, who keep the canonical
  // average of their slice (with accumulation: its running sum) and screen it; every process gets every
  // tile's sum of squares and the first non-finite key — a raw gradient's, found by the process that
  // has it, or the average's, found by its owner — as one process would compute them.
  screen_partials screen_average(host_towers<Layout>& towers, const std::vector<T>& weights, const accumulation<T>& step,
                                 stage_seconds& stages) {
    if (averaged_.size() != plan_.size(rank_)) fail("reduce::sharded: built for unchecked steps");
    const auto start = std::chrono::steady_clock::now();
    const nonfinite_key raw = send_contributions(towers, weights, true);
    const std::size_t lo = plan_.first(rank_);
    std::vector<double> tile_sums(my_tiles_.size());
    std::vector<nonfinite_key> keys(tasks(lo, lo + plan_.size(rank_)), no_nonfinite);
    in_parallel(towers, lo, lo + plan_.size(rank_), [&](std::size_t task, std::size_t begin_flat, std::size_t end_flat) {
      plan_.for_each_piece(begin_flat, end_flat, [&](std::size_t v, std::size_t first, std::size_t count, std::size_t flat) {
        T scratch[32][block];
        for (std::size_t begin = 0; begin < count; begin += block) {
          const std::size_t n = std::min(block, count - begin), j = flat - lo + begin;
          canonical_sum(j, n, scratch);
          if (accumulate_average(step, scratch[0], averaged_.data() + j, n) != 0)
            keys[task] = std::min(keys[task], first_nonfinite_in<T>(averaged_.data() + j, static_cast<unsigned>(n),
                                                                    static_cast<int>(v), static_cast<unsigned>(first + begin),
                                                                    nonfinite_sum_tower));
        }
      });
    });
    for (const std::exception_ptr& failure : towers.pool().run(tile_sums.size(), [&](std::size_t i) {
           const auto [flat, count] = my_tiles_[i];
           tile_sums[i] = tile_sum_of_squares(averaged_.data() + (flat - lo), static_cast<unsigned>(count));
         })) {
      if (failure) std::rethrow_exception(failure);
    }
    nonfinite_key first_key = raw;
    for (nonfinite_key key : keys) first_key = std::min(first_key, key);
    screen_partials partials = span_.share_screen({tile_sums, first_key});
    stages.reduce = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return partials;
  }

  // Pass 2: the optimizer on scale * the owner's average, then the parameters gathered.
  void apply_averaged(host_towers<Layout>& towers, T scale, const constants_type& constants, stage_seconds& stages) {
    const double screened = stages.reduce;
    const auto start = std::chrono::steady_clock::now();
    update_slice(towers, constants, [&](std::size_t j, std::size_t n, const T*& sum, T (&scratch)[32][block]) {
      for (std::size_t k = 0; k < n; ++k) scratch[0][k] = rounded_mul(scale, averaged_[j + k]);
      sum = scratch[0];
    });
    finish_step(towers, start, stages);
    stages.reduce += screened;
  }

 private:
  static bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

  std::size_t tasks(std::size_t lo, std::size_t hi) const { return (hi - lo + work_elements - 1) / work_elements; }

  // Runs f(task, begin, end) over [lo, hi) in tasks of work_elements on the towers' threads.
  template <class F>
  void in_parallel(host_towers<Layout>& towers, std::size_t lo, std::size_t hi, F&& f) {
    for (const std::exception_ptr& failure : towers.pool().run(tasks(lo, hi), [&](std::size_t task) {
           const std::size_t begin = lo + task * work_elements;
           f(task, begin, std::min(hi, begin + work_elements));
         })) {
      if (failure) std::rethrow_exception(failure);
    }
  }

  // Every owner's contributions from this process's towers, then the exchange (see the top): with
  // partials, the local canonical sum of w_t * g_t in flat order; else, for each owner o, each local
  // tower's w_t * g_t over o's slice, tower after tower. `screen`: also the first non-finite gradient
  // value (global tower index), which only the process that holds it can see.
  nonfinite_key send_contributions(host_towers<Layout>& towers, const std::vector<T>& weights, bool screen) {
    std::vector<nonfinite_key> keys(tasks(0, plan_.total()), no_nonfinite);
    in_parallel(towers, 0, plan_.total(), [&](std::size_t task, std::size_t lo, std::size_t hi) {
      for (int owner = 0; owner < processes_; ++owner) {
        const std::size_t start = plan_.first(owner), end = plan_.first(owner + 1);
        T* to_owner = send_.data() + start * contributions_;
        plan_.for_each_piece(std::max(lo, start), std::min(hi, end), [&](std::size_t v, std::size_t first, std::size_t count,
                                                                         std::size_t flat) {
          for (std::size_t begin = 0; begin < count; begin += block) {
            const std::size_t n = std::min(block, count - begin), at = flat - start + begin;
            // out[k] = w_t * g_t[k] for the block, noting the first non-finite gradient value.
            const auto weigh = [&](std::size_t t, T* out) {
              const stored_type* g = towers.gradients(t).data(v) + first + begin;
              unsigned bad = 0;
              for (std::size_t k = 0; k < n; ++k) {
                const T x = widen<T>(g[k]);
                out[k] = rounded_mul(weights[t], x);
                bad |= exponent_all_ones(x);
              }
              if (screen && bad != 0)
                keys[task] = std::min(keys[task], first_nonfinite_in<T>(g, static_cast<unsigned>(n), static_cast<int>(v),
                                                                        static_cast<unsigned>(first + begin),
                                                                        static_cast<unsigned>(span_.global_tower(t))));
            };
            if (!partials_) {  // each tower's product, tower after tower: the owner runs the whole tree
              for (std::size_t t = 0; t < local_towers_; ++t) weigh(t, to_owner + t * (end - start) + at);
              continue;
            }
            T scratch[32][block];
            canonical_tree_reduce(
                static_cast<int>(local_towers_), [&](int tower, int slot) { weigh(static_cast<std::size_t>(tower), scratch[slot]); },
                [&](int left, int right) {
                  for (std::size_t k = 0; k < n; ++k) scratch[left][k] = rounded_add(scratch[left][k], scratch[right][k]);
                });
            std::copy(scratch[0], scratch[0] + n, to_owner + at);
          }
        });
      }
    });
    exchange_contributions();
    nonfinite_key first = no_nonfinite;
    for (nonfinite_key key : keys) first = std::min(first, key);
    return first;
  }

  void exchange_contributions() {
    if (processes_ == 1) return;
    std::vector<std::size_t> send_offsets, send_bytes, recv_offsets, recv_bytes;
    const std::size_t mine = plan_.size(rank_);
    for (int r = 0; r < processes_; ++r) {
      send_offsets.push_back(plan_.first(r) * contributions_ * sizeof(T));
      send_bytes.push_back(plan_.size(r) * contributions_ * sizeof(T));
      recv_offsets.push_back(static_cast<std::size_t>(r) * contributions_ * mine * sizeof(T));
      recv_bytes.push_back(contributions_ * mine * sizeof(T));
    }
    span_.group().all_to_all(reinterpret_cast<const char*>(send_.data()), send_offsets, send_bytes,
                       reinterpret_cast<char*>(received_.data()), recv_offsets, recv_bytes, "sending gradients to their owners");
  }

  // Slice elements [j, j + n) of the canonical sum of what arrived — the tree's upper levels over the
  // processes' partials, or the whole tree over every tower's w_t * g_t — into scratch[0].
  void canonical_sum(std::size_t j, std::size_t n, T (&scratch)[32][block]) const {
    const std::size_t mine = plan_.size(rank_);
    const T* arrived = processes_ > 1 ? received_.data() : send_.data();
    const std::size_t leaves = static_cast<std::size_t>(processes_) * contributions_;
    canonical_tree_reduce(
        static_cast<int>(leaves),
        [&](int leaf, int slot) {
          const T* x = arrived + static_cast<std::size_t>(leaf) * mine + j;
          std::copy(x, x + n, scratch[slot]);
        },
        [&](int left, int right) {
          for (std::size_t k = 0; k < n; ++k) scratch[left][k] = rounded_add(scratch[left][k], scratch[right][k]);
        });
  }

  // The owner's slice: gradient(j, n, sum, scratch) points sum at the gradient of slice elements
  // [j, j + n); the optimizer's update of them goes into updated_.
  template <class Gradient>
  void update_slice(host_towers<Layout>& towers, const constants_type& constants, Gradient&& gradient) {
    gathered_slot_ = -1;
    const std::size_t lo = plan_.first(rank_);
    in_parallel(towers, lo, lo + plan_.size(rank_), [&](std::size_t, std::size_t begin_flat, std::size_t end_flat) {
      plan_.for_each_piece(begin_flat, end_flat, [&](std::size_t v, std::size_t first, std::size_t count, std::size_t flat) {
        const T* parameters = master_of(towers, v) + first;
        T scratch[32][block];
        for (std::size_t begin = 0; begin < count; begin += block) {
          const std::size_t n = std::min(block, count - begin), j = flat - lo + begin;
          const T* sum = nullptr;
          gradient(j, n, sum, scratch);
          T* p = updated_.data() + j;
          std::copy(parameters + begin, parameters + begin + n, p);
          T* slots[Optim::max_state_slots > 0 ? Optim::max_state_slots : 1] = {};
          for (std::size_t s = 0; s < state_.size(); ++s) slots[s] = state_[s].data() + j;
          update_host_block<Optim>(static_cast<int>(state_.size()), p, slots, sum, n, constants);
        }
      });
    });
  }

  // Variable v of the master parameters: the towers' shared parameters, or (mixed precision) the master copy.
  const T* master_of(host_towers<Layout>& towers, std::size_t v) const {
    if constexpr (mixed) return master_.data() + plan_.variable_start(v);
    else return towers.shared_parameters().data(v);
  }

  // After the owners' updates: every slice to every process (the master copy, with mixed precision), into
  // the towers' parameters.
  void finish_step(host_towers<Layout>& towers, std::chrono::steady_clock::time_point start, stage_seconds& stages) {
    const auto reduced = std::chrono::steady_clock::now();
    T* all = mixed ? master_.data() : processes_ > 1 ? gathered_.data() : updated_.data();
    if (all != updated_.data()) gather(updated_.data(), all, "gathering parameters");
    scatter_parameters(towers, all);
    stages.reduce = std::chrono::duration<double>(reduced - start).count();
    stages.broadcast = std::chrono::duration<double>(std::chrono::steady_clock::now() - reduced).count();
  }

  // Every process's slice of `slice` (this process's, plan_.size(rank_) values) into `all`.
  void gather(const T* slice, T* all, const char* what) {
    std::vector<std::size_t> offsets, bytes;
    for (int r = 0; r < processes_; ++r) {
      offsets.push_back(plan_.first(r) * sizeof(T));
      bytes.push_back(plan_.size(r) * sizeof(T));
    }
    span_.group().all_gather_blocks(reinterpret_cast<const char*>(slice), reinterpret_cast<char*>(all), offsets, bytes, what);
  }

  // All of the new parameters (`all`, in flat order) into the towers' shared parameters (rounded to
  // nearest even with mixed precision).
  void scatter_parameters(host_towers<Layout>& towers, const T* all) {
    in_parallel(towers, 0, plan_.total(), [&](std::size_t, std::size_t lo, std::size_t hi) {
      plan_.for_each_piece(lo, hi, [&](std::size_t v, std::size_t first, std::size_t count, std::size_t flat) {
        std::transform(all + flat, all + flat + count, towers.shared_parameters().data(v) + first,
                       [](T x) { return narrow<stored_type>(x); });
      });
    });
  }

  const variable_set& variables_;
  const processes& span_;
  int rank_, processes_;
  std::size_t local_towers_;
  slice_plan plan_;
  bool partials_;                      // L a power of two: one local partial per process (see the top)
  std::size_t contributions_;          // values per element each process sends an owner: 1 or L
  std::vector<std::vector<T>> state_;  // per slot: this process's slice
  std::vector<T> send_, received_, updated_, gathered_;
  std::vector<T> master_;              // mixed precision: the whole master copy (see master_on_host)
  std::vector<T> averaged_;            // checked steps: the owner's slice of the average (or running sum)
  std::vector<std::pair<std::size_t, std::size_t>> my_tiles_;  // checked steps: this slice's screen tiles
  int gathered_slot_ = -1;             // the state slot gathered_ holds, -1: none (parameters or stale)
};
TOWERPIPE_EXACT_ARITHMETIC_END

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::sharded, Optim, Layout> {
  using type = detail::sharded_host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
