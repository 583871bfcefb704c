#pragma once
// reduce::sharded — the optimizer sharded over the processes of a pipeline (pipeline_options::processes,
// comm/process_group.hpp; one process without it), for host towers (GPU towers: reduce/sharded/gpu_towers.cuh).
// Bitwise equal to one process with the same total towers (README.md, invariant 2), whatever the process
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
// Gradient buckets (reduce/overlapped_reduction.hpp): while the towers run, a bucket's contributions go
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

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <type_traits>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/plan/owner_slices.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/host_pass.hpp"
#include "towerpipe/reduce/sharded/policy.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/data/split.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {


namespace detail {

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
template <class Optim, class Layout>
class sharded_host_reducer {
 public:
  using towers_type = host_towers<Layout>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' parameters and gradients
  using master_type = typename precision<Layout>::master_type;  // the master parameters, state, sums
  static constexpr bool mixed = precision<Layout>::mixed;
  using constants_type = typename Optim::template step_constants<master_type>;
  static constexpr reducer_capabilities capabilities{true, false};
  static constexpr std::size_t block = host_reduce_policy::block_elements;        // elements per canonical_block_sum
  static constexpr std::size_t work_elements = host_reduce_policy::chunk_elements;  // about this many per task on the pool

  // setup.span: the processes, their configuration already compared (step/processes.hpp).
  explicit sharded_host_reducer(const reducer_setup<towers_type, Optim>& setup)
      : sharded_host_reducer(setup, setup.variables, setup.options) {}

 private:
  sharded_host_reducer(const reducer_setup<towers_type, Optim>& setup, const variable_set& variables, const pipeline_options& options)
      : variables_(variables),
        towers_(setup.towers),
        span_(setup.span),
        rank_(span_.rank()),
        local_towers_(span_.local_towers()),
        partials_(contributions_per_process(local_towers_) == 1),
        checked_(takes_checked_steps(options, mixed)),
        slots_(Optim::state_slots(setup.hyper)),
        table_(make_chunk_table(variables, screen_tile_elements)),
        buckets_(make_bucket_plan(variables, options.buckets, sizeof(stored_type))),  // as the pipeline's driver cuts them
        plan_(table_, variables.count(), span_.size(), rank_, partials_ ? 1 : local_towers_, max_host_process_rows,
              buckets_.bucket_of),
        padded_starts_(padded_flat_starts(variables)),
        send_blocks_(plan_.send_blocks(sizeof(master_type))),
        receive_blocks_(plan_.receive_blocks(sizeof(master_type))),
        gather_blocks_(plan_.gather_blocks(sizeof(master_type))),
        send_(plan_.send_elements()),
        // One process receives what it sent and gathers what it updated: it reads them where they are.
        received_(span_.size() > 1 ? plan_.receive_elements() : 0),
        updated_(plan_.mine().stored_elements),
        gathered_(plan_.total()),
        master_(mixed ? plan_.total() : 0),
        state_(static_cast<std::size_t>(slots_) * plan_.mine().stored_elements, master_type(0)),
        averaged_(checked_ ? plan_.mine().stored_elements : 0),
        by_variable_(table_, variables.count()) {
    for (int owner = 0; owner < span_.size(); ++owner) {
      send_rows_.push_back(plan_.send_row_pointers(owner, send_.data()));
      const owner_slice& slice = plan_.slice(owner);
      for (const chunk_group& group : group_chunks(slice.chunk_list(table_), work_elements)) {
        const chunk_group chunks{slice.chunks.first + group.first, slice.chunks.first + group.last};
        runs_.push_back({owner, chunks});
        if (owner == rank_) my_runs_.push_back({owner, chunks});
      }
    }
    received_rows_ = plan_.received_row_pointers(span_.size() > 1 ? received_.data() : send_.data());
    updated_slice_ = slice_pointers(plan_.mine(), updated_.data(), variables.count());
    state_rows_ = slice_row_pointers(plan_.mine(), state_.data(), static_cast<std::size_t>(slots_), variables.count());
    averaged_slice_ = slice_pointers(plan_.mine(), averaged_.data(), variables.count());
    for (std::size_t b = 0; b < buckets_.count(); ++b) {
      bucket_send_blocks_.push_back(plan_.send_blocks(sizeof(master_type), b));
      bucket_receive_blocks_.push_back(plan_.receive_blocks(sizeof(master_type), b));
    }
    exchanges_buckets_ = span_.size() > 1 && every_process_says(span_.group().callable_from_any_thread());
  }

 public:
  backend_choice choice() const { return named_by_type("sharded"); }
  // Across processes only where every process's group may be called from the bucket worker (see the top).
  bool buckets_during_towers() const { return span_.size() == 1 || exchanges_buckets_; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    if (work.checked && !checked_) fail("reduce::sharded: built for unchecked steps");
    work_ = work;
    forget_parts();
    raw_key_ = owner_key_ = no_nonfinite;
    std::fill(tile_sums_.begin(), tile_sums_.end(), 0.0);
  }

  // A bucket on the calling thread (the worker), what the towers left on the pool. In one process the
  // owner is here: its update and the new parameters (or its screen) follow each part at once. Across
  // processes a part is its contributions and the exchanges they complete; the rest also runs after a
  // tower failed, so that every process makes the same exchanges (see the top).
  void reduce_part(towers_type& towers, const step_part& part) {
    const std::vector<chunk_group> chunks = by_variable_.runs(part.variables);
    if (!part.during_towers()) rest_started_ = step_clock::now();
    if (span_.size() > 1) return contribute(towers, part, chunks);
    run_part_on(towers.pool(), part, [&](auto& runner) {
      raw_key_ = std::min(raw_key_, weigh_contributions(runner, towers, within(runs_, chunks), work_.weights, work_.checked));
      if (work_.checked) {
        owner_key_ = std::min(owner_key_, screen_slice(runner, within(my_runs_, chunks), work_.window));
      } else if constexpr (!mixed) {
        update_slice(runner, towers, within(my_runs_, chunks), work_.constants, received_sum());
        scatter_parameters(runner, towers, within(runs_, chunks), updated_.data());
      }
    });
  }

  // After the processes agreed on the towers: the owner's update and every slice to every process, or a
  // checked step's screen of the owner's slice, shared.
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    if (work_.checked) {
      if (span_.size() > 1) owner_key_ = screen_slice(towers.pool(), my_runs_, work_.window);
      const screen_partials partials = span_.share_screen({tile_sums_, std::min(raw_key_, owner_key_)});
      stages.reduce = seconds_since(rest_started_);
      return partials;
    }
    if constexpr (!mixed) {
      if (span_.size() > 1) update_slice(towers.pool(), towers, my_runs_, work_.constants, received_sum());
    }
    finish_step(towers, stages, span_.size() > 1);
    return {};
  }

  // A checked step's second pass: the optimizer on scale * the owner's average, then the parameters gathered.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const double screened = stages.reduce;
    rest_started_ = step_clock::now();
    update_slice(towers.pool(), towers, my_runs_, work_.constants, [&](int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) {
      const master_type* average = averaged_slice_[static_cast<std::size_t>(v)] + i;
      for (std::size_t k = 0; k < n; ++k) scratch[0][k] = rounded_mul(scale, average[k]);
      return scratch[0];
    });
    finish_step(towers, stages, true);
    stages.reduce += screened;
  }
  // Its parts ran on the calling thread or the pool: only the step's bookkeeping goes.
  void abandon(towers_type&) { forget_parts(); }

  // Mixed precision: every process keeps the whole master copy (the gather brings it every step), whose
  // rounded copy the towers see.
  tensor_view<const master_type> master(std::size_t index) const {
    if constexpr (mixed) return tensor_view<const master_type>(master_.data() + padded_starts_[index], variables_[index].shape);
    else return towers_.parameter_on_host(index);
  }
  void set_master(std::size_t index, const master_type* values) {
    if constexpr (mixed) std::copy(values, values + variables_[index].size, master_.data() + padded_starts_[index]);
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }
  // Collective (see the top): gathers the slot's slices, once per slot between steps.
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) {
    if (gathered_slot_ != static_cast<int>(slot)) {
      gather(slot_base(slot), gathered_.data(), "gathering optimizer state");
      gathered_slot_ = static_cast<int>(slot);
    }
    return tensor_view<const master_type>(gathered_.data() + padded_starts_[index], variables_[index].shape);
  }
  // This process's part of the values (no communication).
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    gathered_slot_ = -1;
    plan_.mine().for_each_stored_range_of(index, [&](const element_range& range, std::size_t offset) {
      std::copy(values + range.begin, values + range.end, slot_base(slot) + offset);
    });
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return std::vector<std::size_t>(local_towers_, 0); }  // host memory

 private:
  // A task on the thread pool: consecutive chunks of one owner's slice, about work_elements in all.
  struct run {
    int owner;
    chunk_group chunks;
  };

  // f(task, owner, chunk index) for every chunk of `runs`, one task per run, on `runner` (the towers'
  // thread pool, or calling_thread).
  template <class Runner, class F>
  static void for_each_chunk(Runner& runner, const std::vector<run>& runs, F&& f) {
    for (const std::exception_ptr& failure : runner.run(runs.size(), [&](std::size_t task) {
           for (std::size_t c = runs[task].chunks.first; c < runs[task].chunks.last; ++c) f(task, runs[task].owner, c);
         })) {
      if (failure) std::rethrow_exception(failure);
    }
  }
  // The pieces of `runs` inside the chunk runs `part` (a part of the step's chunks, in table order).
  static std::vector<run> within(const std::vector<run>& runs, const std::vector<chunk_group>& part) {
    std::vector<run> pieces;
    for (const run& r : runs) {
      for (const chunk_group& p : part) {
        const std::size_t first = std::max(r.chunks.first, p.first), last = std::min(r.chunks.last, p.last);
        if (first < last) pieces.push_back({r.owner, {first, last}});
      }
    }
    return pieces;
  }

  // f(first element, count) for each block of the chunk: small enough that the scratch arrays stay in L1.
  template <class F>
  static void for_each_block(const tensor_chunk& chunk, F&& f) {
    for (std::size_t begin = 0; begin < chunk.count; begin += block)
      f(chunk.first + begin, std::min<std::size_t>(block, chunk.count - begin));
  }

  std::size_t variable_count() const { return variables_.count(); }

  // Every owner's contributions from this process's towers into the rows of the send buffer, then the
  // exchange (see the top): with partials, row 0 gets the local canonical sum of w_t * g_t; else row t
  // gets tower t's w_t * g_t. `screen`: also the first non-finite gradient value (global tower index),
  // which only the process that holds it can see.
  template <class Runner>
  nonfinite_key weigh_contributions(Runner& runner, towers_type& towers, const std::vector<run>& runs,
                                    const std::vector<master_type>& weights, bool screen) {
    std::vector<nonfinite_key> keys(runs.size(), no_nonfinite);
    for_each_chunk(runner, runs, [&](std::size_t task, int owner, std::size_t c) {
      const tensor_chunk& chunk = table_[c];
      const std::size_t v = static_cast<std::size_t>(chunk.variable);
      master_type* const* rows = send_rows_[static_cast<std::size_t>(owner)].data();  // [row][variable]
      for_each_block(chunk, [&](std::size_t i, std::size_t n) {
        const auto weigh = [&](std::size_t t, master_type* out) {
          const stored_type* g = towers.gradients(t).data(v) + i;
          if (weigh_block(weights[t], g, n, out) != 0 && screen)
            keys[task] = std::min(keys[task], first_nonfinite_in<master_type>(g, static_cast<unsigned>(n), chunk.variable,
                                                                              static_cast<unsigned>(i),
                                                                              static_cast<unsigned>(span_.global_tower(t))));
        };
        if (!partials_) {  // each tower's product: the owner runs the whole tree
          for (std::size_t t = 0; t < local_towers_; ++t) weigh(t, rows[t * variable_count() + v] + i);
          return;
        }
        master_type scratch[32][block];
        canonical_block_sum(static_cast<int>(local_towers_), n, scratch,
                            [&](int tower, master_type* out) { weigh(static_cast<std::size_t>(tower), out); });
        std::copy(scratch[0], scratch[0] + n, rows[v] + i);
      });
    });
    nonfinite_key first = no_nonfinite;
    for (nonfinite_key key : keys) first = std::min(first, key);
    return first;
  }
  // Across processes, a part's contributions and what can be exchanged then (see the top): a bucket's on
  // the calling thread (the worker), then the buckets in order as far as they are in; what the towers
  // left on the pool, then every exchange not made yet — also when a contribution failed, whose error
  // follows the exchanges.
  void contribute(towers_type& towers, const step_part& part, const std::vector<chunk_group>& chunks) {
    std::exception_ptr failure;
    try {
      run_part_on(towers.pool(), part, [&](auto& runner) {
        raw_key_ = std::min(raw_key_, weigh_contributions(runner, towers, within(runs_, chunks), work_.weights, work_.checked));
      });
    } catch (...) {
      if (part.during_towers()) throw;
      failure = std::current_exception();
    }
    if (part.during_towers()) {
      contributed_[part.bucket] = 1;
      while (exchanged_ < buckets_.count() && contributed_[exchanged_]) exchange_bucket(exchanged_++);
      return;
    }
    if (work_.parts_during_towers) {
      while (exchanged_ < buckets_.count()) exchange_bucket(exchanged_++);
    } else {
      exchange(send_blocks_, receive_blocks_, "sending gradients to their owners");
    }
    if (failure) std::rethrow_exception(failure);
  }
  // A bucket's rows to their owners.
  void exchange_bucket(std::size_t bucket) {
    exchange(bucket_send_blocks_[bucket], bucket_receive_blocks_[bucket], "sending a gradient bucket to its owners");
  }
  // The send buffer's rows (`send`'s pieces) to their owners (several processes; one reads them where they are).
  void exchange(const exchange_plan::blocks& send, const exchange_plan::blocks& receive, const char* what) {
    span_.group().all_to_all(reinterpret_cast<const char*>(send_.data()), send.offsets, send.bytes,
                             reinterpret_cast<char*>(received_.data()), receive.offsets, receive.bytes, what);
  }
  // A new step's parts: no bucket contributed or exchanged yet.
  void forget_parts() {
    std::fill(contributed_.begin(), contributed_.end(), 0);
    exchanged_ = 0;
  }
  // Whether `mine` holds on every process (a collective).
  bool every_process_says(bool mine) const {
    const char flag = mine ? 1 : 0;
    for (const std::string& theirs : span_.group().all_gather(&flag, 1, "agreeing whether gradient buckets are exchanged during the towers"))
      if (theirs != std::string(1, char(1))) return false;
    return true;
  }

  // The owner's canonical average of `runs` (chunks of its slice; with accumulation: its running sum), each
  // tile's sum of squares into tile_sums_; returns the first non-finite key of the average.
  template <class Runner>
  nonfinite_key screen_slice(Runner& runner, const std::vector<run>& runs, const accumulation<master_type>& step) {
    const chunk_group mine = plan_.mine().chunks;
    std::vector<nonfinite_key> keys(runs.size(), no_nonfinite);
    for_each_chunk(runner, runs, [&](std::size_t task, int, std::size_t c) {
      const tensor_chunk& chunk = table_[c];
      master_type* average = averaged_slice_[static_cast<std::size_t>(chunk.variable)];
      for_each_block(chunk, [&](std::size_t i, std::size_t n) {
        master_type scratch[32][block];
        canonical_sum(chunk.variable, i, n, scratch);
        if (accumulate_average(step, scratch[0], average + i, n) != 0)
          keys[task] = std::min(keys[task], first_nonfinite_in<master_type>(average + i, static_cast<unsigned>(n), chunk.variable,
                                                                            static_cast<unsigned>(i), nonfinite_sum_tower));
      });
      tile_sums_[c - mine.first] = tile_sum_of_squares(average + chunk.first, chunk.count);  // a chunk is a screen tile
    });
    nonfinite_key first = no_nonfinite;
    for (nonfinite_key key : keys) first = std::min(first, key);
    return first;
  }

  // Elements [i, i + n) of variable v of the canonical sum of the rows that arrived — the tree's upper
  // levels over the processes' partials, or the whole tree over every tower's w_t * g_t — into scratch[0].
  void canonical_sum(int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) const {
    canonical_block_sum(plan_.rows(), n, scratch, [&](int row, master_type* out) {
      const master_type* x = received_rows_[static_cast<std::size_t>(row) * variable_count() + static_cast<std::size_t>(v)] + i;
      std::copy(x, x + n, out);
    });
  }

  // The owner's slice: gradient(v, i, n, scratch) returns the gradient of elements [i, i + n) of variable
  // v; the optimizer's update of them goes into updated_.
  template <class Runner, class Gradient>
  void update_slice(Runner& runner, towers_type& towers, const std::vector<run>& runs, const constants_type& constants,
                    Gradient&& gradient) {
    gathered_slot_ = -1;
    for_each_chunk(runner, runs, [&](std::size_t, int, std::size_t c) {
      const tensor_chunk& chunk = table_[c];
      const std::size_t v = static_cast<std::size_t>(chunk.variable);
      for_each_block(chunk, [&](std::size_t i, std::size_t n) {
        master_type scratch[32][block];
        const master_type* sum = gradient(chunk.variable, i, n, scratch);
        const master_type* parameters = master_of(towers, v) + i;
        master_type* p = updated_slice_[v] + i;
        std::copy(parameters, parameters + n, p);
        master_type* slots[Optim::max_state_slots > 0 ? Optim::max_state_slots : 1] = {};
        for (int s = 0; s < slots_; ++s) slots[s] = state_rows_[static_cast<std::size_t>(s) * variable_count() + v] + i;
        update_host_block<Optim>(slots_, p, slots, sum, n, constants);
      });
    });
  }

  // Variable v of the master parameters: the towers' shared parameters, or (mixed precision) the master copy.
  const master_type* master_of(towers_type& towers, std::size_t v) const {
    if constexpr (mixed) return master_.data() + padded_starts_[v];
    else return towers.shared_parameters().data(v);
  }
  master_type* slot_base(std::size_t slot) { return state_.data() + slot * plan_.mine().stored_elements; }

  // The owner's sum of the rows that arrived (canonical_sum), for update_slice.
  auto received_sum() const {
    return [this](int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) {
      canonical_sum(v, i, n, scratch);
      return static_cast<const master_type*>(scratch[0]);
    };
  }

  // After the owners' updates: every slice to every process (the master copy, with mixed precision), into
  // the towers' parameters. `scatter`: whether the new parameters still go to the towers (an unchecked
  // step in one process has put each part's there already). stages.reduce from the rest's start.
  void finish_step(towers_type& towers, stage_seconds& stages, bool scatter) {
    const auto reduced = step_clock::now();
    master_type* all = mixed ? master_.data() : span_.size() > 1 ? gathered_.data() : updated_.data();
    if (all != updated_.data()) gather(updated_.data(), all, "gathering parameters");
    if (scatter) scatter_parameters(towers.pool(), towers, runs_, all);
    stages.reduce = std::chrono::duration<double>(reduced - rest_started_).count();
    stages.broadcast = seconds_since(reduced);
  }

  // Every process's slice (this process's: `slice`, in compact storage) into `all`, the variables end to
  // end, each padded (padded_flat_starts).
  void gather(const master_type* slice, master_type* all, const char* what) {
    span_.group().all_gather_blocks(reinterpret_cast<const char*>(slice), reinterpret_cast<char*>(all), gather_blocks_.offsets,
                                    gather_blocks_.bytes, what);
  }

  // All of the new parameters (`all`, as gathered) into the towers' shared parameters (rounded to nearest
  // even with mixed precision).
  template <class Runner>
  void scatter_parameters(Runner& runner, towers_type& towers, const std::vector<run>& runs, const master_type* all) {
    for_each_chunk(runner, runs, [&](std::size_t, int, std::size_t c) {
      const tensor_chunk& chunk = table_[c];
      const std::size_t v = static_cast<std::size_t>(chunk.variable);
      const master_type* from = all + padded_starts_[v] + chunk.first;
      std::transform(from, from + chunk.count, towers.shared_parameters().data(v) + chunk.first,
                     [](master_type x) { return narrow<stored_type>(x); });
    });
  }

  const variable_set& variables_;
  towers_type& towers_;
  const processes& span_;
  int rank_;
  std::size_t local_towers_;
  bool partials_;  // L a power of two: one local partial per process (see the top)
  bool checked_;   // built for checked steps
  int slots_;      // optimizer state slots
  std::vector<tensor_chunk> table_;  // the variables in chunks of one screen tile
  bucket_plan buckets_;  // the gradient buckets
  exchange_plan plan_;
  std::vector<std::size_t> padded_starts_;  // per variable: where it starts in a gathered buffer
  exchange_plan::blocks send_blocks_, receive_blocks_, gather_blocks_;
  std::vector<exchange_plan::blocks> bucket_send_blocks_, bucket_receive_blocks_;  // per bucket
  std::vector<run> runs_, my_runs_;  // every owner's chunks; this process's
  // Compact storage: send_ every owner's rows, received_ this owner's rows from every process (global
  // order), updated_ its new master parameters; gathered_ the variables end to end, padded.
  std::vector<master_type> send_, received_, updated_, gathered_;
  std::vector<master_type> master_;    // mixed precision: the whole master copy (see master_on_host), laid out as gathered_
  std::vector<master_type> state_;     // this process's slice of each state slot, one after another
  std::vector<master_type> averaged_;  // checked steps: the owner's slice of the average (or running sum)
  // Pointer tables over that storage ([row or slot][variable]; plan/owner_slices.hpp slice_pointers).
  std::vector<std::vector<master_type*>> send_rows_;  // per owner
  std::vector<master_type*> received_rows_, updated_slice_, state_rows_, averaged_slice_;
  int gathered_slot_ = -1;  // the state slot gathered_ holds, -1: none (parameters or stale)
  chunks_by_variable by_variable_;           // a part's chunks
  // A checked step's screen as its parts go: the first non-finite raw gradient and average, and the
  // owner's tiles' sums of squares (a chunk of the table is a tile).
  nonfinite_key raw_key_ = no_nonfinite, owner_key_ = no_nonfinite;
  // Across processes, this step's buckets: which are in the send buffer, how many (in order) exchanged;
  // whether buckets are exchanged while the towers run at all.
  std::vector<char> contributed_ = std::vector<char>(buckets_.count(), 0);
  std::size_t exchanged_ = 0;
  bool exchanges_buckets_ = false;
  step_work<master_type, Optim> work_;
  step_clock::time_point rest_started_;
  std::vector<double> tile_sums_ = std::vector<double>(plan_.mine().chunks.last - plan_.mine().chunks.first, 0.0);
};
TOWERPIPE_EXACT_ARITHMETIC_END

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::sharded, Optim, Layout> {
  using type = detail::sharded_host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
