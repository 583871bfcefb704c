#pragma once
// The multi-tensor agents: per-element programs (the operation, as a CUTLASS epilogue is) that the
// device backends run over a chunk table — a CUDA block per chunk, a thread per group of elements
// (cuda/multi_tensor_dispatch.cuh, the schedule) — and that tests run over the same tables on the host.
// Plain C++ (usable without nvcc); TOWERPIPE_HOST_DEVICE marks what kernels call.
//
// Every agent and screen source also lists what it touches, for executors that check launches (the
// simulated devices, exec/simulated/); kernels never call it. `template <class F> void operands(F&& f)
// const` calls, in terms of the launch's chunks:
//   f(const pointer_table<U>& table, int first_role, int roles, operand_access access)
//       roles [first_role, first_role + roles) of `table`: for every chunk c of the launch, the
//       elements [c.first, c.first + c.count) of variable c.variable at table.at(role, c.variable);
//   f(const U* word, std::size_t bytes, operand_access access)
//       one fixed place (a non-finite key word); read_write: an atomic read-modify-write
//       (record_nonfinite, an atomicMin on the device), which does not race with others of its kind.
// It must say exactly what process()/average() reach: the simulation checks every access against it.
// Why: docs/design-notes.md#kernels-agents

#include <cstddef>
#include <type_traits>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/kernels/lanes.hpp"
#include "towerpipe/kernels/screen.hpp"

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace detail {

// How an agent's work is spread: thread `thread` of `threads` takes groups thread, thread + threads, ...
// of W elements (the launch policy's vector_elements), then the same for the chunk's last count % W
// single elements. agent.template process<W>(variable, element) does one group; an agent is nothing
// but that member and its data.
TOWERPIPE_EXEC_CHECK_DISABLE
template <unsigned W, class Agent>
TOWERPIPE_HOST_DEVICE void process_chunk(const Agent& agent, const tensor_chunk& chunk, unsigned thread,
                                         unsigned threads) {
  const unsigned groups = chunk.count / W;
  for (unsigned q = thread; q < groups; q += threads) agent.template process<W>(chunk.variable, chunk.first + W * q);
  for (unsigned k = W * groups + thread; k < chunk.count; k += threads)
    agent.template process<1>(chunk.variable, chunk.first + k);
}

// The optimizer step of a group and its broadcast: p = the master parameters (replica 0 where the
// replicas hold T); Optim::update(g, p, state) per element; p is written to replicas [0, replica_count).
// Mixed precision (Stored = bf16 or fp16): the master is a T buffer of its own (role 0 of `master`),
// written back in T, and the replicas get p rounded to nearest even.
template <class Optim, class T, class Stored = T>
struct optimizer_apply {
  static constexpr bool mixed = !std::is_same<T, Stored>::value;
  pointer_table<Stored> replicas;  // role = tower
  pointer_table<T> state;          // role = optimizer slot
  int replica_count;
  int state_slots;
  typename Optim::template step_constants<T> constants;
  pointer_table<T> master;  // mixed precision only

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void apply(int v, unsigned i, const lanes<T, W>& g) const {
    // Loops over slots run to the compile-time maximum with a guard, so that they unroll and the state
    // stays in registers instead of an indexed local array.
    lanes<T, W> p;
    if constexpr (mixed) {
      p = load_lanes<W>(master.at(0, v) + i);
    } else {
      p = load_lanes<W>(replicas.at(0, v) + i);
    }
    lanes<T, W> s[Optim::max_state_slots] = {};
    for (int slot = 0; slot < Optim::max_state_slots; ++slot) {
      if (slot < state_slots) s[slot] = load_lanes<W>(state.at(slot, v) + i);
    }
    for (unsigned l = 0; l < W; ++l) {
      T element_state[Optim::max_state_slots] = {};
      for (int slot = 0; slot < Optim::max_state_slots; ++slot) element_state[slot] = s[slot].value[l];
      Optim::update(constants, g.value[l], p.value[l], element_state);
      for (int slot = 0; slot < Optim::max_state_slots; ++slot) s[slot].value[l] = element_state[slot];
    }
    for (int slot = 0; slot < Optim::max_state_slots; ++slot) {
      if (slot < state_slots) store_lanes<W>(state.at(slot, v) + i, s[slot]);
    }
    if constexpr (mixed) store_lanes<W>(master.at(0, v) + i, p);
    const lanes<Stored, W> stored = cast_lanes<Stored>(p);
    for (int r = 0; r < replica_count; ++r) store_lanes<W>(replicas.at(r, v) + i, stored);
  }

  // What apply() touches, for the operands() of the agents that call it.
  template <class F>
  void operands(F&& f) const {
    if constexpr (mixed) {
      f(master, 0, 1, operand_access::read_write);
      f(replicas, 0, replica_count, operand_access::write);
    } else {
      // p is read from replica 0, which is written back with the others.
      f(replicas, 0, 1, replica_count > 0 ? operand_access::read_write : operand_access::read);
      if (replica_count > 1) f(replicas, 1, replica_count - 1, operand_access::write);
    }
    f(state, 0, state_slots, operand_access::read_write);
  }
};

// reduce::device0 in one pass: g = canonical sum over towers t of weights[t] * gradient_t, then apply.
// Towers > 0 fixes the tower count at compile time (unrolled, partial sums in registers); 0 reads `towers`.
template <class Optim, class T, int Towers, class Stored = T>
struct fused_apply_agent {
  using value_type = T;
  pointer_table<const T> gradients;  // role = tower
  int towers;
  T weights[max_device_towers];
  optimizer_apply<Optim, T, Stored> apply;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    const int n = Towers > 0 ? Towers : towers;
    // The canonical tree keeps canonical_slots(n) partial sums alive (7 for 64 towers), in registers.
    lanes<T, W> partial[canonical_slots(Towers > 0 ? Towers : max_device_towers)];
    canonical_tree_reduce(
        n, [&](int t, int slot) { partial[slot] = scaled_lanes<W>(weights[t], gradients.at(t, v) + i); },
        [&](int left, int right) { partial[left] = add_lanes(partial[left], partial[right]); });
    apply.template apply<W>(v, i, partial[0]);
  }

  template <class F>
  void operands(F&& f) const {
    f(gradients, 0, Towers > 0 ? Towers : towers, operand_access::read);
    apply.operands(f);
  }
};

// Where the p2p tree's operands lie as one tower reads them (role = tower): raw gradients and partial sums.
template <class T, class Stored = T>
struct tree_operands {
  pointer_table<const Stored> raw;
  pointer_table<T> sums;  // null where a tower has no children: its operand is always raw
};

// One edge of the canonical tree (plan/canonical_order.hpp): s_left = s_left + s_right. A tower's
// operand is its raw gradient until the tower has been the left side of an edge, its weighted partial
// sum after; raw operands are widened and multiplied by their weight, and checked: every tower's raw
// gradient is an operand of exactly one edge, so the tree finds the first non-finite value of each
// tower as the screen does (kernels/screen.hpp).
template <class T>
struct tree_edge {
  int left, right;
  bool left_raw, right_raw;
  T left_weight, right_weight;

  template <unsigned W, class Stored>
  TOWERPIPE_HOST_DEVICE lanes<T, W> combine(const tree_operands<T, Stored>& at, int v, unsigned i, nonfinite_key& first) const {
    return add_lanes(operand<W>(at, left, left_raw, left_weight, v, i, first), operand<W>(at, right, right_raw, right_weight, v, i, first));
  }

  // What combine() reads: each side's raw gradient or partial sum, and nothing of the other towers.
  template <class Stored, class F>
  void operands(const tree_operands<T, Stored>& at, F&& f) const {
    if (left_raw) f(at.raw, left, 1, operand_access::read);
    else f(at.sums, left, 1, operand_access::read);
    if (right_raw) f(at.raw, right, 1, operand_access::read);
    else f(at.sums, right, 1, operand_access::read);
  }

 private:
  template <unsigned W, class Stored>
  TOWERPIPE_HOST_DEVICE static lanes<T, W> operand(const tree_operands<T, Stored>& at, int tower, bool raw, T weight, int v, unsigned i,
                                                   nonfinite_key& first) {
    if (!raw) return load_lanes<W>(at.sums.at(tower, v) + i);
    const lanes<T, W> value = cast_lanes<T>(load_lanes<W>(at.raw.at(tower, v) + i));
    note_nonfinite(value, v, i, static_cast<unsigned>(tower), first);
    return scale_lanes(weight, value);
  }
};

// The p2p tree's last edge as the screen's source (kernels/screen.hpp).
template <class T, class Stored = T>
struct edge_average_source {
  tree_operands<T, Stored> tree;
  tree_edge<T> edge;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> average(int v, unsigned i, nonfinite_key& first) const {
    return edge.template combine<W>(tree, v, i, first);
  }

  template <class F>
  void operands(F&& f) const {
    edge.operands(tree, f);
  }
};

// The rounds of the canonical tree for n towers, as edges in the order they may run: every edge of
// round r after every edge of round r - 1 that touches its towers. The last edge has left = 0.
template <class T>
std::vector<std::vector<tree_edge<T>>> canonical_tree_rounds(int towers, const std::vector<T>& weights) {
  std::vector<std::vector<tree_edge<T>>> rounds;
  std::vector<char> raw(static_cast<std::size_t>(towers), 1);
  for (int stride = 1; stride < towers; stride *= 2) {
    rounds.emplace_back();
    for (int left = 0; left + stride < towers; left += 2 * stride) {
      const int right = left + stride;
      rounds.back().push_back({left, right, raw[left] != 0, raw[right] != 0, weights[static_cast<std::size_t>(left)],
                               weights[static_cast<std::size_t>(right)]});
      raw[static_cast<std::size_t>(left)] = 0;
    }
  }
  return rounds;
}

// A p2p tree round that is not the last: s_left = s_left + s_right, into the left tower's partial sum.
// In a checked step the first non-finite raw operand's key is kept at first_nonfinite (null: unchecked).
template <class T, class Stored = T>
struct tree_round_agent {
  using value_type = T;
  tree_operands<T, Stored> tree;
  tree_edge<T> edge;
  nonfinite_key* first_nonfinite;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    nonfinite_key first = no_nonfinite;
    store_lanes<W>(tree.sums.at(edge.left, v) + i, edge.template combine<W>(tree, v, i, first));
    if (first != no_nonfinite && first_nonfinite != nullptr) record_nonfinite(first_nonfinite, first);
  }

  template <class F>
  void operands(F&& f) const {
    edge.operands(tree, f);
    f(tree.sums, edge.left, 1, operand_access::write);
    if (first_nonfinite != nullptr) f(first_nonfinite, sizeof(nonfinite_key), operand_access::read_write);
  }
};

// The p2p tree's root: the last edge (into tower 0) fused with the optimizer and the root's replica.
template <class Optim, class T, class Stored = T>
struct tree_root_agent {
  using value_type = T;
  tree_operands<T, Stored> tree;
  tree_edge<T> edge;
  optimizer_apply<Optim, T, Stored> apply;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    nonfinite_key unchecked = no_nonfinite;
    apply.template apply<W>(v, i, edge.template combine<W>(tree, v, i, unchecked));
  }

  template <class F>
  void operands(F&& f) const {
    edge.operands(tree, f);
    apply.operands(f);
  }
};

// Copies one tower's replica into others (the p2p tree's broadcast edges). Stored: the targets' type;
// with mixed precision (T the master type, Stored bf16 or fp16) the copy rounds to nearest even, as
// reduce::sharded across processes writes the gathered master into its towers' replicas.
template <class T, class Stored = T>
struct copy_agent {
  using value_type = T;
  pointer_table<const T> source;  // role 0
  pointer_table<Stored> targets;  // roles [0, target_count)
  int target_count;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    const lanes<Stored, W> value = cast_lanes<Stored>(load_lanes<W>(source.at(0, v) + i));  // the identity where T == Stored
    for (int t = 0; t < target_count; ++t) store_lanes<W>(targets.at(t, v) + i, value);
  }

  template <class F>
  void operands(F&& f) const {
    f(source, 0, 1, operand_access::read);
    f(targets, 0, target_count, operand_access::write);
  }
};

}  // namespace detail
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
