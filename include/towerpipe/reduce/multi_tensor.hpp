#pragma once
// Multi-tensor work: a table of chunks that covers every element of every variable exactly once, built
// once at construction, and "agents" — per-element programs that the device backends run over it (a
// CUDA block per chunk, a thread per element) and that tests run over it on the host. Both layouts use
// the same table: variable v of role r lives at pointer_table.at(r, v); layout::flat only makes those
// pointers consecutive in one arena. Chunks start on multiples of chunk_elements (a multiple of 64
// floats, 256 bytes), so vector loads inside a chunk stay aligned.
//
// This header is plain C++ (usable without nvcc); TOWERPIPE_HOST_DEVICE marks what kernels call.
//
// Room left on purpose: the averaged gradient of a group passes through optimizer_apply::apply before
// the update, which is where a non-finite flag and a squared-norm partial for clipping will be taken
// (reduced per block with cub::BlockReduce in the kernel, per chunk on the host), and load_lanes is
// where bf16 gradients will be widened into the fp32 master weights' type.

#include <algorithm>
#include <cstddef>
#include <type_traits>
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

// Consecutive runs of chunks [first, last) of about group_elements elements each (a chunk larger than
// that is a group of its own): units of transfer that can overlap with work on the previous unit.
struct chunk_group {
  std::size_t first, last;
};

inline std::vector<chunk_group> group_chunks(const std::vector<tensor_chunk>& chunks, std::size_t group_elements) {
  std::vector<chunk_group> groups;
  for (std::size_t first = 0; first < chunks.size();) {
    std::size_t last = first, elements = 0;
    while (last < chunks.size() && (elements == 0 || elements + chunks[last].count <= group_elements))
      elements += chunks[last++].count;
    groups.push_back({first, last});
    first = last;
  }
  return groups;
}

// The elements [begin, end) of each variable a group touches, in variable order. Chunk tables list
// each variable's chunks consecutively and in order, so these ranges are contiguous.
struct element_range {
  std::size_t variable, begin, end;
};

inline std::vector<element_range> group_ranges(const std::vector<tensor_chunk>& chunks, const chunk_group& group) {
  std::vector<element_range> ranges;
  for (std::size_t c = group.first; c < group.last; ++c) {
    const tensor_chunk& chunk = chunks[c];
    const std::size_t v = static_cast<std::size_t>(chunk.variable);
    if (!ranges.empty() && ranges.back().variable == v) ranges.back().end = chunk.first + chunk.count;
    else ranges.push_back({v, chunk.first, std::size_t(chunk.first) + chunk.count});
  }
  return ranges;
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

// Agents work on groups of W consecutive elements (W = 4, loaded and stored as one 16-byte vector on the
// device for float; W = 1 for a chunk's last count % 4 elements). Chunks start on multiples of 64
// elements of 256-byte-aligned variables, so every group of 4 is 16-byte aligned.
template <class T, unsigned W>
struct lanes {
  T value[W];
};

// Whether a group is moved as one 16-byte vector: float groups of 4, in device code.
template <unsigned W, class T>
constexpr bool vector_lanes = TOWERPIPE_DEVICE_PASS() && W == 4 && std::is_same_v<T, float>;

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE lanes<T, W> load_lanes(const T* p) {
  lanes<T, W> result;
  if constexpr (vector_lanes<W, T>) {
#if TOWERPIPE_DEVICE_PASS()
    const float4 vector = *reinterpret_cast<const float4*>(p);
    result.value[0] = vector.x;
    result.value[1] = vector.y;
    result.value[2] = vector.z;
    result.value[3] = vector.w;
#endif
  } else {
    for (unsigned l = 0; l < W; ++l) result.value[l] = p[l];
  }
  return result;
}

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE void store_lanes(T* p, const lanes<T, W>& v) {
  if constexpr (vector_lanes<W, T>) {
#if TOWERPIPE_DEVICE_PASS()
    *reinterpret_cast<float4*>(p) = make_float4(v.value[0], v.value[1], v.value[2], v.value[3]);
#endif
  } else {
    for (unsigned l = 0; l < W; ++l) p[l] = v.value[l];
  }
}

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE lanes<T, W> scaled_lanes(T weight, const T* p) {
  lanes<T, W> v = load_lanes<W>(p);
  for (unsigned l = 0; l < W; ++l) v.value[l] = detail::rounded_mul(weight, v.value[l]);
  return v;
}

template <class T, unsigned W>
TOWERPIPE_HOST_DEVICE lanes<T, W> add_lanes(const lanes<T, W>& a, const lanes<T, W>& b) {
  lanes<T, W> sum;
  for (unsigned l = 0; l < W; ++l) sum.value[l] = detail::rounded_add(a.value[l], b.value[l]);
  return sum;
}

// How an agent's work is spread: thread `thread` of `threads` takes groups thread, thread + threads, ...
// of 4 elements, then the same for the chunk's last count % 4 single elements. agent.template
// process<W>(variable, element) does one group.
TOWERPIPE_EXEC_CHECK_DISABLE
template <class Agent>
TOWERPIPE_HOST_DEVICE void process_chunk(const Agent& agent, const tensor_chunk& chunk, unsigned thread,
                                         unsigned threads) {
  const unsigned groups = chunk.count / 4;
  for (unsigned q = thread; q < groups; q += threads) agent.template process<4>(chunk.variable, chunk.first + 4 * q);
  for (unsigned k = 4 * groups + thread; k < chunk.count; k += threads)
    agent.template process<1>(chunk.variable, chunk.first + k);
}

// The optimizer step of a group and its broadcast: p = replica 0; Optim::update(g, p, state) per
// element; p is written to replicas [0, replica_count).
template <class Optim, class T>
struct optimizer_apply {
  pointer_table<T> replicas;  // role = tower
  pointer_table<T> state;     // role = optimizer slot
  int replica_count;
  int state_slots;
  typename Optim::template step_constants<T> constants;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void apply(int v, unsigned i, const lanes<T, W>& g) const {
    // Loops over slots run to the compile-time maximum with a guard, so that they unroll and the state
    // stays in registers instead of an indexed local array.
    lanes<T, W> p = load_lanes<W>(replicas.at(0, v) + i);
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
    for (int r = 0; r < replica_count; ++r) store_lanes<W>(replicas.at(r, v) + i, p);
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

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned thread, unsigned threads) const {
    process_chunk(*this, chunk, thread, threads);
  }

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    const int n = Towers > 0 ? Towers : towers;
    lanes<T, W> partial[32];
    canonical_tree_reduce(
        n, [&](int t, int slot) { partial[slot] = scaled_lanes<W>(weights[t], gradients.at(t, v) + i); },
        [&](int left, int right) { partial[left] = add_lanes(partial[left], partial[right]); });
    apply.template apply<W>(v, i, partial[0]);
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

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> combine(const pointer_table<T>& sums, int v, unsigned i) const {
    const T* l = sums.at(left, v) + i;
    const T* r = sums.at(right, v) + i;
    return add_lanes(left_raw ? scaled_lanes<W>(left_weight, l) : load_lanes<W>(l),
                     right_raw ? scaled_lanes<W>(right_weight, r) : load_lanes<W>(r));
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

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned thread, unsigned threads) const {
    process_chunk(*this, chunk, thread, threads);
  }

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    store_lanes<W>(sums.at(edge.left, v) + i, edge.template combine<W>(sums, v, i));
  }
};

// The p2p tree's root: the last edge (into tower 0) fused with the optimizer and the root's replica.
template <class Optim, class T>
struct tree_root_agent {
  pointer_table<T> sums;  // role = tower
  tree_edge<T> edge;
  optimizer_apply<Optim, T> apply;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned thread, unsigned threads) const {
    process_chunk(*this, chunk, thread, threads);
  }

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    apply.template apply<W>(v, i, edge.template combine<W>(sums, v, i));
  }
};

// Copies one tower's replica into others (the p2p tree's broadcast edges).
template <class T>
struct copy_agent {
  pointer_table<const T> source;  // role 0
  pointer_table<T> targets;       // roles [0, target_count)
  int target_count;

  TOWERPIPE_HOST_DEVICE void operator()(const tensor_chunk& chunk, unsigned thread, unsigned threads) const {
    process_chunk(*this, chunk, thread, threads);
  }

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE void process(int v, unsigned i) const {
    const lanes<T, W> value = load_lanes<W>(source.at(0, v) + i);
    for (int t = 0; t < target_count; ++t) store_lanes<W>(targets.at(t, v) + i, value);
  }
};

// Runs an agent over a chunk table on the calling thread, as `threads` emulated threads each taking
// its share of every chunk: the host form of the kernel launch, for tests.
template <class Agent>
void run_agent_on_host(const Agent& agent, const std::vector<tensor_chunk>& chunks, unsigned threads = 3) {
  for (const tensor_chunk& chunk : chunks) {
    for (unsigned thread = 0; thread < threads; ++thread) agent(chunk, thread, threads);
  }
}

}  // namespace towerpipe
