#pragma once
// The per-element programs of reduce::sharded for GPU towers across processes
// (reduce/sharded/device_towers_across_processes.hpp), run as multi-tensor agents (kernels/agents.hpp) over chunk tables:
//   contribution_agent  a process's contributions to one owner's slice, from its own towers;
//   rows_sum_source     an owner's canonical sum over the contributions every process sent it;
//   rows_apply_agent    that sum and the optimizer, fused.
// Plain C++ (usable without nvcc): the simulated executor runs them on the host.
// Why: docs/design-notes.md#kernels-process_agents

#include <cstddef>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/kernels/lanes.hpp"
#include "towerpipe/kernels/screen.hpp"

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace detail {

// This process's rows of the send buffer: with `partial`, row 0 the local canonical sum; else row t tower t's w_t * g_t.
template <class T, class Stored = T>
struct contribution_agent {
  using value_type = T;
  pointer_table<const Stored> gradients;  // role = local tower
  int towers;
  bool partial;
  weight_array<T> weights;
  unsigned first_tower;
  pointer_table<T> rows;            // role = row
  nonfinite_key* first_nonfinite;  // null: unchecked

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    nonfinite_key first = no_nonfinite;
    const auto weighed = [&](int t) {
      const lanes<T, W> raw = cast_lanes<T>(load_lanes<W>(gradients.at(t, v) + i));
      if (first_nonfinite != nullptr) note_nonfinite(raw, v, i, first_tower + static_cast<unsigned>(t), first);
      return scale_lanes(weights[t], raw);
    };
    if (partial) {
      lanes<T, W> sums[canonical_slots(max_device_towers)];
      canonical_tree_reduce(
          towers, [&](int t, int slot) { sums[slot] = weighed(t); },
          [&](int left, int right) { sums[left] = add_lanes(sums[left], sums[right]); });
      store_lanes<W>(rows.at(0, v) + i, sums[0]);
    } else {
      for (int t = 0; t < towers; ++t) store_lanes<W>(rows.at(t, v) + i, weighed(t));
    }
    if (first != no_nonfinite) record_nonfinite(first_nonfinite, first);
  }

  template <class F>
  void operands(F&& f) const {
    f(gradients, 0, towers, operand_access::read);
    f(rows, 0, partial ? 1 : towers, operand_access::write);
    if (first_nonfinite != nullptr) f(first_nonfinite, sizeof(nonfinite_key), operand_access::read_write);
  }
};

// The canonical sum over the rows that arrived at an owner, in global order. The rows are weighted
// already. As a screen source (kernels/screen.hpp) it checks nothing on the way in: rows are sums, whose
// raw values their senders screened; a non-finite row makes the sum non-finite, which the screen notes
// as the sum's, as one process would note the overflow of that subtree.
template <class T>
struct rows_sum_source {
  pointer_table<const T> rows;  // role = row
  int count;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> sum(int v, unsigned i) const {
    lanes<T, W> partial[canonical_slots(max_process_rows)];
    canonical_tree_reduce(
        count, [&](int row, int slot) { partial[slot] = load_lanes<W>(rows.at(row, v) + i); },
        [&](int left, int right) { partial[left] = add_lanes(partial[left], partial[right]); });
    return partial[0];
  }
  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> average(int v, unsigned i, nonfinite_key&) const {
    return sum<W>(v, i);
  }

  template <class F>
  void operands(F&& f) const {
    f(rows, 0, count, operand_access::read);
  }
};

// An owner's unchecked step: the sum over its rows, then the optimizer (kernels/agents.hpp).
template <class Optim, class T>
struct rows_apply_agent {
  using value_type = T;
  rows_sum_source<T> rows;
  optimizer_apply<Optim, T> apply;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    apply.template apply<W>(v, i, rows.template sum<W>(v, i));
  }

  template <class F>
  void operands(F&& f) const {
    rows.operands(f);
    apply.operands(f);
  }
};

// Pointer-table entries for a buffer that holds the variables end to end, each padded
// (plan/owner_slices.hpp padded_flat_starts: the owners' compact storage in owner order): one per
// variable, at base + the variable's padded start.
template <class T>
std::vector<T*> padded_flat_pointers(T* base, const variable_set& variables) {
  const std::vector<std::size_t> starts = padded_flat_starts(variables);
  std::vector<T*> pointers;
  for (std::size_t v = 0; v < variables.count(); ++v) pointers.push_back(base + starts[v]);
  return pointers;
}

}  // namespace detail
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
