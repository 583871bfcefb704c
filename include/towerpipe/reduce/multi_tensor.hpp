#pragma once
// Multi-tensor work: a table of chunks that covers every element of every variable exactly once, built
// once at construction, and "agents" — per-element programs that the device backends run over it (a
// CUDA block per chunk, a thread per element) and that tests run over it on the host. Both layouts use
// the same table: variable v of role r lives at pointer_table.at(r, v); layout::flat only makes those
// pointers consecutive in one arena. Chunks start on multiples of chunk_elements (a multiple of 64
// floats, 256 bytes), so vector loads inside a chunk stay aligned.
//
// This header is plain C++ (usable without nvcc); TOWERPIPE_HOST_DEVICE marks what kernels call.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/reduce/canonical_order.hpp"

namespace towerpipe {

struct tensor_chunk {
  int variable;
  unsigned first;  // first element of the chunk inside its variable
  unsigned count;
};

inline std::vector<tensor_chunk> make_chunk_table(const variable_set& variables, std::size_t chunk_elements) {
  std::vector<tensor_chunk> chunks;
  for (std::size_t v = 0; v < variables.count(); ++v) {
    if (variables[v].size > 0xFFFFFFFFu)
      detail::fail("variable '", variables[v].name, "' has ", variables[v].size, " elements; at most 2^32 - 1 supported");
    for (std::size_t first = 0; first < variables[v].size; first += chunk_elements)
      chunks.push_back({static_cast<int>(v), static_cast<unsigned>(first),
                        static_cast<unsigned>(std::min(chunk_elements, variables[v].size - first))});
  }
  return chunks;
}

// Pointers of several roles (towers' gradients, towers' replicas, optimizer slots), one per
// (role, variable), in one array laid out [role][variable].
template <class T>
struct pointer_table {
  T* const* pointers = nullptr;
  int variables = 0;
  TOWERPIPE_HOST_DEVICE T* at(int role, int variable) const { return pointers[role * variables + variable]; }
};

// The table's pointer array for buffers of one layout: roles[r]->data(v) at [r][v].
template <class T, class Buffer>
std::vector<T*> gather_pointers(const std::vector<Buffer*>& roles) {
  std::vector<T*> pointers;
  for (Buffer* role : roles) {
    for (std::size_t v = 0; v < role->variables().count(); ++v) pointers.push_back(role->data(v));
  }
  return pointers;
}

// The most towers a device reduction takes in one pass (their weights travel in the kernel's arguments).
constexpr int max_device_towers = 64;

// The optimizer step of one element and its broadcast: p = replica 0; Optim::update(g, p, state);
// p is written to replicas [0, replica_count).
template <class Optim, class T>
struct optimizer_apply {
  pointer_table<T> replicas;  // role = tower
  pointer_table<T> state;     // role = optimizer slot
  int replica_count;
  int state_slots;
  typename Optim::template step_constants<T> constants;

  TOWERPIPE_HOST_DEVICE void operator()(int v, unsigned i, T g) const {
    T p = replicas.at(0, v)[i];
    T s[Optim::max_state_slots] = {};
    for (int slot = 0; slot < state_slots; ++slot) s[slot] = state.at(slot, v)[i];
    Optim::update(constants, g, p, s);
    for (int slot = 0; slot < state_slots; ++slot) state.at(slot, v)[i] = s[slot];
    for (int r = 0; r < replica_count; ++r) replicas.at(r, v)[i] = p;
  }
};

// reduce::device0 in one pass: g = canonical sum over towers t of weights[t] * gradient_t, then apply.
// Towers > 0 fixes the tower count at compile time (unrolled, partial sums in registers); 0 reads `towers`.
template <class Optim, class T, int Towers>
struct fused_apply_agent {
  pointer_table<const T> gradients;  // role = tower
  int towers;
  T weights[max_device_towers];
  optimizer_apply<Optim, T> apply;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned k) const {
    const int v = chunk.variable;
    const unsigned i = chunk.first + k;
    const int n = Towers > 0 ? Towers : towers;
    apply(v, i, canonical_sum<T>(n, [&](int t) { return detail::rounded_mul(weights[t], gradients.at(t, v)[i]); }));
  }
};

// One edge of the canonical tree (reduce/canonical_order.hpp): s_left = s_left + s_right. Partial sums
// live in the towers' gradient buffers: a tower's buffer holds its raw gradient until the tower has been
// the left side of an edge, its weighted partial sum after; raw operands are multiplied by their weight.
template <class T>
struct tree_edge {
  int left, right;
  bool left_raw, right_raw;
  T left_weight, right_weight;

  TOWERPIPE_HOST_DEVICE T combine(const pointer_table<T>& sums, int v, unsigned i) const {
    const T l = sums.at(left, v)[i];
    const T r = sums.at(right, v)[i];
    return detail::rounded_add(left_raw ? detail::rounded_mul(left_weight, l) : l,
                               right_raw ? detail::rounded_mul(right_weight, r) : r);
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

// A p2p tree round that is not the last: s_left = s_left + s_right in place.
template <class T>
struct tree_round_agent {
  pointer_table<T> sums;  // role = tower
  tree_edge<T> edge;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned k) const {
    const unsigned i = chunk.first + k;
    sums.at(edge.left, chunk.variable)[i] = edge.combine(sums, chunk.variable, i);
  }
};

// The p2p tree's root: the last edge (into tower 0) fused with the optimizer and the root's replica.
template <class Optim, class T>
struct tree_root_agent {
  pointer_table<T> sums;  // role = tower
  tree_edge<T> edge;
  optimizer_apply<Optim, T> apply;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned k) const {
    const unsigned i = chunk.first + k;
    apply(chunk.variable, i, edge.combine(sums, chunk.variable, i));
  }
};

// Copies one tower's replica into others (the p2p tree's broadcast edges).
template <class T>
struct copy_agent {
  pointer_table<const T> source;  // role 0
  pointer_table<T> targets;       // roles [0, target_count)
  int target_count;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned k) const {
    const unsigned i = chunk.first + k;
    const T value = source.at(0, chunk.variable)[i];
    for (int t = 0; t < target_count; ++t) targets.at(t, chunk.variable)[i] = value;
  }
};

// Runs an agent over every element of a chunk table on the calling thread: the host form of the
// kernel launch, for tests and for hosts without a device.
template <class Agent>
void run_agent_on_host(const Agent& agent, const std::vector<tensor_chunk>& chunks) {
  for (const tensor_chunk& chunk : chunks) {
    for (unsigned k = 0; k < chunk.count; ++k) agent(chunk, k);
  }
}

}  // namespace towerpipe
