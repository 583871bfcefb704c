#pragma once
// What one process of reduce::sharded with host towers (reduce/sharded/host_towers.hpp) computes, element
// by element: the exchange plan's compact storage (plan/exchange_plan.hpp: the rows it sends every owner,
// the rows it receives as an owner, its slice of the new parameters, of the state and, for checked steps,
// of the average; the whole padded buffer a gather fills) with the pointer tables over it, and the
// passes over chunks of it on a thread pool: the contributions, the owner's canonical sum and screen, the
// optimizer's update of the slice, the new parameters into the towers'. The reducer decides when each
// runs and exchanges the rows between the processes.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <vector>

#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/plan/owner_slices.hpp"
#include "towerpipe/reduce/common/host_pass.hpp"
#include "towerpipe/step/processes.hpp"

namespace towerpipe {
namespace detail {

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
template <class Optim, class Layout>
class sharded_host_slices {
 public:
  using towers_type = host_towers<Layout>;
  using stored_type = typename precision<Layout>::stored_type;
  using master_type = typename precision<Layout>::master_type;
  static constexpr bool mixed = precision<Layout>::mixed;
  using constants_type = typename Optim::template step_constants<master_type>;
  static constexpr std::size_t block = host_reduce_policy::block_elements;        // elements per canonical_block_sum
  static constexpr std::size_t work_elements = host_reduce_policy::chunk_elements;  // about this many per task on the pool
  // A task on the thread pool: consecutive chunks of one owner's slice, about work_elements in all.
  struct run {
    int owner;
    chunk_group chunks;
  };

  // `checked`: with the owner's slice of the average.
  sharded_host_slices(const variable_set& variables, const processes& span, const bucket_plan& buckets, int slots, bool checked)
      : variables_(variables),
        span_(span),
        partials_(contributions_per_process(span.local_towers()) == 1),
        slots_(slots),
        table_(make_chunk_table(variables, screen_tile_elements)),
        plan_(table_, variables.count(), span.size(), span.rank(), partials_ ? 1 : span.local_towers(), max_host_process_rows,
              buckets.bucket_of),
        padded_starts_(padded_flat_starts(variables)),
        send_(plan_.send_elements()),
        // One process receives what it sent and gathers what it updated: it reads them where they are.
        received_(span.size() > 1 ? plan_.receive_elements() : 0),
        updated_(plan_.mine().stored_elements),
        gathered_(plan_.total()),
        master_(mixed ? plan_.total() : 0),
        state_(static_cast<std::size_t>(slots) * plan_.mine().stored_elements, master_type(0)),
        averaged_(checked ? plan_.mine().stored_elements : 0),
        by_variable_(table_, variables.count()) {
    for (int owner = 0; owner < span.size(); ++owner) {
      send_rows_.push_back(plan_.send_row_pointers(owner, send_.data()));
      const owner_slice& slice = plan_.slice(owner);
      for (const chunk_group& group : group_chunks(slice.chunk_list(table_), work_elements)) {
        const chunk_group chunks{slice.chunks.first + group.first, slice.chunks.first + group.last};
        runs_.push_back({owner, chunks});
        if (owner == span.rank()) my_runs_.push_back({owner, chunks});
      }
    }
    received_rows_ = plan_.received_row_pointers(span.size() > 1 ? received_.data() : send_.data());
    updated_slice_ = slice_pointers(plan_.mine(), updated_.data(), variables.count());
    state_rows_ = slice_row_pointers(plan_.mine(), state_.data(), static_cast<std::size_t>(slots), variables.count());
    averaged_slice_ = slice_pointers(plan_.mine(), averaged_.data(), variables.count());
  }

  const exchange_plan& plan() const { return plan_; }
  // The storage the exchanges move: the rows to send, the rows received, this slice's new parameters, the
  // gathered buffer (every variable end to end, padded), and with mixed precision the whole master (laid
  // out as the gathered buffer).
  master_type* send() { return send_.data(); }
  master_type* received() { return received_.data(); }
  master_type* updated() { return updated_.data(); }
  master_type* gathered() { return gathered_.data(); }
  master_type* master() { return master_.data(); }
  master_type* slot_base(std::size_t slot) { return state_.data() + slot * plan_.mine().stored_elements; }
  std::size_t padded_start(std::size_t variable) const { return padded_starts_[variable]; }
  std::size_t tiles() const { return plan_.mine().chunks.last - plan_.mine().chunks.first; }

  // Every owner's chunks, and this process's, within the variables of a part of the step.
  std::vector<run> every_owner(const std::vector<std::size_t>& variables) const { return within(runs_, by_variable_.runs(variables)); }
  std::vector<run> mine(const std::vector<std::size_t>& variables) const { return within(my_runs_, by_variable_.runs(variables)); }
  const std::vector<run>& every_owner() const { return runs_; }
  const std::vector<run>& mine() const { return my_runs_; }

  // Every owner's contributions from this process's towers into the rows of the send buffer: with
  // partials, row 0 gets the local canonical sum of w_t * g_t; else row t gets tower t's w_t * g_t.
  // `screen`: also the first non-finite gradient value (global tower index), which only the process that
  // holds it can see.
  template <class Runner>
  nonfinite_key weigh_contributions(Runner& runner, towers_type& towers, const std::vector<run>& runs,
                                    const std::vector<master_type>& weights, bool screen) {
    const std::size_t local = span_.local_towers();
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
          for (std::size_t t = 0; t < local; ++t) weigh(t, rows[t * variables_.count() + v] + i);
          return;
        }
        master_type scratch[32][block];
        canonical_block_sum(static_cast<int>(local), n, scratch, [&](int tower, master_type* out) { weigh(static_cast<std::size_t>(tower), out); });
        std::copy(scratch[0], scratch[0] + n, rows[v] + i);
      });
    });
    return least(keys);
  }

  // The owner's canonical average of `runs` (chunks of its slice; with accumulation: its running sum), each
  // tile's sum of squares into tile_sums (a chunk is a screen tile, indexed from the slice's first);
  // returns the first non-finite key of the average.
  template <class Runner>
  nonfinite_key screen_slice(Runner& runner, const std::vector<run>& runs, const accumulation<master_type>& step,
                             std::vector<double>& tile_sums) {
    const chunk_group slice = plan_.mine().chunks;
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
      tile_sums[c - slice.first] = tile_sum_of_squares(average + chunk.first, chunk.count);
    });
    return least(keys);
  }

  // The optimizer on the owner's `runs` with the canonical sum of the rows that arrived; the new
  // parameters go into updated().
  template <class Runner>
  void apply_rows(Runner& runner, towers_type& towers, const std::vector<run>& runs, const constants_type& constants) {
    update_slice(runner, towers, runs, constants, [&](int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) {
      canonical_sum(v, i, n, scratch);
    });
  }
  // The same with scale * the slice's average: a checked step's second pass.
  template <class Runner>
  void apply_average(Runner& runner, towers_type& towers, const std::vector<run>& runs, const constants_type& constants,
                     master_type scale) {
    update_slice(runner, towers, runs, constants, [&](int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) {
      const master_type* average = averaged_slice_[static_cast<std::size_t>(v)] + i;
      for (std::size_t k = 0; k < n; ++k) scratch[0][k] = rounded_mul(scale, average[k]);
    });
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
                     [](master_type x) { return static_cast<stored_type>(x); });
    });
  }

 private:
  // f(task, owner, chunk index) for every chunk of `runs`, one task per run, on `runner` (the towers'
  // thread pool, or a pool of the calling thread alone).
  template <class Runner, class F>
  static void for_each_chunk(Runner& runner, const std::vector<run>& runs, F&& f) {
    rethrow_first(runner.run(runs.size(), [&](std::size_t task) {
      for (std::size_t c = runs[task].chunks.first; c < runs[task].chunks.last; ++c) f(task, runs[task].owner, c);
    }));
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
    for (std::size_t begin = 0; begin < chunk.count; begin += block) f(chunk.first + begin, std::min<std::size_t>(block, chunk.count - begin));
  }
  static nonfinite_key least(const std::vector<nonfinite_key>& keys) {
    nonfinite_key first = no_nonfinite;
    for (nonfinite_key key : keys) first = std::min(first, key);
    return first;
  }

  // Elements [i, i + n) of variable v of the canonical sum of the rows that arrived — the tree's upper
  // levels over the processes' partials, or the whole tree over every tower's w_t * g_t — into scratch[0].
  void canonical_sum(int v, std::size_t i, std::size_t n, master_type (&scratch)[32][block]) const {
    canonical_block_sum(plan_.rows(), n, scratch, [&](int row, master_type* out) {
      const master_type* x = received_rows_[static_cast<std::size_t>(row) * variables_.count() + static_cast<std::size_t>(v)] + i;
      std::copy(x, x + n, out);
    });
  }
  // gradient(v, i, n, scratch) puts the gradient of elements [i, i + n) of variable v into scratch[0]; the
  // optimizer's update of them goes into updated_.
  template <class Runner, class Gradient>
  void update_slice(Runner& runner, towers_type& towers, const std::vector<run>& runs, const constants_type& constants,
                    Gradient&& gradient) {
    for_each_chunk(runner, runs, [&](std::size_t, int, std::size_t c) {
      const tensor_chunk& chunk = table_[c];
      const std::size_t v = static_cast<std::size_t>(chunk.variable);
      for_each_block(chunk, [&](std::size_t i, std::size_t n) {
        master_type scratch[32][block];
        gradient(chunk.variable, i, n, scratch);
        const master_type* parameters = master_of(towers, v) + i;
        master_type* p = updated_slice_[v] + i;
        std::copy(parameters, parameters + n, p);
        master_type* slots[Optim::max_state_slots > 0 ? Optim::max_state_slots : 1] = {};
        for (int s = 0; s < slots_; ++s) slots[s] = state_rows_[static_cast<std::size_t>(s) * variables_.count() + v] + i;
        update_host_block<Optim>(slots_, p, slots, scratch[0], n, constants);
      });
    });
  }
  // Variable v of the master parameters: the towers' shared parameters, or (mixed precision) the master copy.
  const master_type* master_of(towers_type& towers, std::size_t v) const {
    if constexpr (mixed) return master_.data() + padded_starts_[v];
    else return towers.shared_parameters().data(v);
  }

  const variable_set& variables_;
  const processes& span_;
  bool partials_;  // L a power of two: one local partial per process (reduce/sharded/policy.hpp)
  int slots_;      // optimizer state slots
  std::vector<tensor_chunk> table_;  // the variables in chunks of one screen tile
  exchange_plan plan_;
  std::vector<std::size_t> padded_starts_;  // per variable: where it starts in a gathered buffer
  // Compact storage: send_ every owner's rows, received_ this owner's rows from every process (global
  // order), updated_ its new master parameters; gathered_ the variables end to end, padded.
  std::vector<master_type> send_, received_, updated_, gathered_;
  std::vector<master_type> master_;    // mixed precision: the whole master copy, laid out as gathered_
  std::vector<master_type> state_;     // this process's slice of each state slot, one after another
  std::vector<master_type> averaged_;  // checked steps: the owner's slice of the average (or running sum)
  // Pointer tables over that storage ([row or slot][variable]; plan/owner_slices.hpp slice_pointers).
  std::vector<std::vector<master_type*>> send_rows_;  // per owner
  std::vector<master_type*> received_rows_, updated_slice_, state_rows_, averaged_slice_;
  std::vector<run> runs_, my_runs_;  // every owner's chunks; this process's
  chunks_by_variable by_variable_;   // a part's chunks
};
TOWERPIPE_EXACT_ARITHMETIC_END

}  // namespace detail
}  // namespace towerpipe
