#pragma once
// The gradient screen: the first pass of a checked step. It writes the canonical average of the towers' gradients into
// a buffer and measures it: its first non-finite value (and the lowest tower at fault) and its sum of squares.
// Why: docs/design-notes.md#kernels-screen
// Plain C++; TOWERPIPE_HOST_DEVICE marks what kernels call.

#include <cstddef>
#include <type_traits>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/kernels/lanes.hpp"

#if defined(__CUDACC__)
#include <nv/target>
#endif

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace detail {

constexpr std::size_t screen_tile_elements = 2048;
constexpr unsigned screen_lanes = 32;
constexpr unsigned screen_group = 4;  // elements a lane takes at once (one vector load of 4 floats)
constexpr unsigned screen_rows = screen_tile_elements / (screen_lanes * screen_group);

// Where a non-finite value is, packed so that the smallest key is the first in (variable, element,
// tower) order and the device can keep the minimum with one atomicMin. Tower field nonfinite_sum_tower:
// the weighted sum overflowed (after every tower at the same element).
using nonfinite_key = unsigned long long;
constexpr nonfinite_key no_nonfinite = ~0ull;
constexpr unsigned nonfinite_tower_bits = 14, nonfinite_element_bits = 32;
constexpr unsigned nonfinite_sum_tower = (1u << nonfinite_tower_bits) - 1;
constexpr std::size_t max_screened_variables = std::size_t(1) << (64 - nonfinite_tower_bits - nonfinite_element_bits);

TOWERPIPE_HOST_DEVICE constexpr nonfinite_key make_nonfinite_key(int variable, unsigned element, unsigned tower) {
  return (nonfinite_key(variable) << (nonfinite_tower_bits + nonfinite_element_bits)) |
         (nonfinite_key(element) << nonfinite_tower_bits) | tower;
}
struct nonfinite_place {
  std::size_t variable, element;
  unsigned tower;  // nonfinite_sum_tower: the sum
};
inline nonfinite_place decode_nonfinite_key(nonfinite_key key) {
  return {static_cast<std::size_t>(key >> (nonfinite_tower_bits + nonfinite_element_bits)),
          static_cast<std::size_t>((key >> nonfinite_tower_bits) & 0xFFFFFFFFull),
          static_cast<unsigned>(key & nonfinite_sum_tower)};
}

// x - x is 0 for every finite x and NaN for an infinity or a NaN: the same test on host and device,
// without library calls.
template <class T>
TOWERPIPE_HOST_DEVICE bool is_finite_value(T x) {
  return rounded_sub(x, x) == T(0);
}

template <class T, unsigned W>
TOWERPIPE_HOST_DEVICE void note_nonfinite(const lanes<T, W>& values, int variable, unsigned first_element,
                                          unsigned tower, nonfinite_key& first) {
  for (unsigned l = 0; l < W; ++l) {
    if (!is_finite_value(values.value[l])) {
      const nonfinite_key key = make_nonfinite_key(variable, first_element + l, tower);
      if (key < first) first = key;
    }
  }
}

// Keeps the smallest key at *target: an atomicMin on the device, a plain compare on the host (where the
// agents run on one thread, the access reported as lanes.hpp's host I/O reports its own).
inline void record_nonfinite_on_host(nonfinite_key* target, nonfinite_key key) {
  if (report_access(target, sizeof(nonfinite_key), operand_access::read_write) && key < *target) *target = key;
}
TOWERPIPE_HOST_DEVICE inline void record_nonfinite(nonfinite_key* target, nonfinite_key key) {
#if defined(__CUDACC__)
  NV_IF_TARGET(NV_IS_DEVICE, (atomicMin(target, key);), (record_nonfinite_on_host(target, key);))
#else
  record_nonfinite_on_host(target, key);
#endif
}

template <class T>
TOWERPIPE_HOST_DEVICE double add_square(double sum, T value) {
  const double x = static_cast<double>(value);
  return rounded_add(sum, rounded_mul(x, x));
}

// The towers' weights inside a kernel's arguments (the host passes a pointer to its vector instead).
template <class T>
struct weight_array {
  T value[max_device_towers];
  TOWERPIPE_HOST_DEVICE T operator[](int tower) const { return value[tower]; }
};

// The canonical weighted average of every tower's raw gradient (reduce::device0 and the host), each
// raw value checked. Towers > 0 fixes the count at compile time, as fused_apply_agent does. Weights:
// weight_array<T> on the device, const T* on the host. Stored: the gradients' type, widened to T on
// load (mixed precision: bf16 or fp16 towers, fp32 average).
template <class T, int Towers, class Weights, class Stored = T>
struct tower_average_source {
  pointer_table<const Stored> gradients;  // role = tower
  int towers;
  Weights weights;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> average(int v, unsigned i, nonfinite_key& first) const {
    // Host towers (weights by pointer) are not bounded by max_device_towers: 32 slots hold 2^31 towers.
    constexpr int slots = Towers > 0                       ? canonical_slots(Towers)
                          : std::is_pointer<Weights>::value ? 32
                                                            : canonical_slots(max_device_towers);
    lanes<T, W> partial[slots];
    canonical_tree_reduce(
        Towers > 0 ? Towers : towers,
        [&](int t, int slot) {
          const lanes<T, W> raw = cast_lanes<T>(load_lanes<W>(gradients.at(t, v) + i));
          note_nonfinite(raw, v, i, static_cast<unsigned>(t), first);
          partial[slot] = scale_lanes(weights[t], raw);
        },
        [&](int left, int right) { partial[left] = add_lanes(partial[left], partial[right]); });
    return partial[0];
  }

  // What average() reads (kernels/agents.hpp says how agents and sources declare their operands).
  template <class F>
  void operands(F&& f) const {
    f(gradients, 0, Towers > 0 ? Towers : towers, operand_access::read);
  }
};

// Where a micro-batch stands in gradient accumulation (pipeline_options::accumulation_steps). The
// screen's average buffer holds the running sum: a = (first ? 0 : a) + micro_weight * average of this
// micro-batch; the last one also multiplies by inverse_total. Without accumulation (first and last,
// both factors 1) the average passes through unchanged: 1 * x is x.
template <class T>
struct accumulation {
  bool first = true, last = true;
  T micro_weight = T(1);   // the micro-batch's examples (1 without accumulation)
  T inverse_total = T(1);  // 1 / the examples of every micro-batch of the step
};

// A screen source (above, or edge_average_source) with the running sum of accumulation around it.
template <class Inner, class T>
struct accumulating_source {
  Inner inner;
  pointer_table<T> running;  // role 0: the screen's average buffer
  accumulation<T> step;

  template <unsigned W>
  TOWERPIPE_HOST_DEVICE lanes<T, W> average(int v, unsigned i, nonfinite_key& first) const {
    lanes<T, W> sum = scale_lanes(step.micro_weight, inner.template average<W>(v, i, first));
    if (!step.first) sum = add_lanes(load_lanes<W>(running.at(0, v) + i), sum);
    return step.last ? scale_lanes(step.inverse_total, sum) : sum;
  }

  // The inner source's operands and the running sum where it is read; the screen itself writes role 0
  // of its averaged table (the buffer `running` points into).
  template <class F>
  void operands(F&& f) const {
    inner.operands(f);
    if (!step.first) f(running, 0, 1, operand_access::read);
  }
};

struct screen_lane_result {
  double sum_of_squares;
  nonfinite_key first_nonfinite;
};

// One group of W elements of the lane program: average, store, check the sum, add the squares.
template <unsigned W, class Source, class T>
TOWERPIPE_HOST_DEVICE void screen_group_of(const Source& source, const pointer_table<T>& averaged, int v, unsigned i,
                                           screen_lane_result& result) {
  const lanes<T, W> g = source.template average<W>(v, i, result.first_nonfinite);
  store_lanes<W>(averaged.at(0, v) + i, g);
  note_nonfinite(g, v, i, nonfinite_sum_tower, result.first_nonfinite);
  for (unsigned l = 0; l < W; ++l) result.sum_of_squares = add_square(result.sum_of_squares, g.value[l]);
}

// Lane `lane`'s part of a tile (see the norm order at the top). Source::average<W>(v, i, first) gives
// the averaged group at (v, i) and lowers `first` to the key of any non-finite input it read.
TOWERPIPE_EXEC_CHECK_DISABLE
template <class Source, class T>
TOWERPIPE_HOST_DEVICE screen_lane_result screen_lane(const Source& source, const pointer_table<T>& averaged,
                                                     const tensor_chunk& tile, unsigned lane) {
  screen_lane_result result{0.0, no_nonfinite};
  for (unsigned row = 0; row < screen_rows; ++row) {
    const unsigned offset = row * screen_lanes * screen_group + lane * screen_group;
    if (offset >= tile.count) break;
    if (offset + screen_group <= tile.count) {
      screen_group_of<screen_group>(source, averaged, tile.variable, tile.first + offset, result);
    } else {
      for (unsigned e = offset; e < tile.count; ++e) screen_group_of<1>(source, averaged, tile.variable, tile.first + e, result);
    }
  }
  return result;
}

// The pairwise tree over the 32 lane sums (the device does it with warp shuffles, in the same order).
inline double pairwise_lane_sum(double (&sums)[screen_lanes]) {
  for (unsigned stride = 1; stride < screen_lanes; stride *= 2) {
    for (unsigned j = 0; j + stride < screen_lanes; j += 2 * stride) sums[j] = rounded_add(sums[j], sums[j + stride]);
  }
  return sums[0];
}

// A tile as a warp of the screen kernel computes it (cuda/screen_kernel.cuh), on the host: the 32 lanes
// one after another, then the tree the kernel takes with shuffles; the least key. The simulated
// executor's screen runs it.
template <class Source, class T>
screen_lane_result screen_tile_as_a_warp(const Source& source, const pointer_table<T>& averaged, const tensor_chunk& tile) {
  double sums[screen_lanes];
  nonfinite_key first = no_nonfinite;
  for (unsigned lane = 0; lane < screen_lanes; ++lane) {
    const screen_lane_result r = screen_lane(source, averaged, tile, lane);
    sums[lane] = r.sum_of_squares;
    if (r.first_nonfinite < first) first = r.first_nonfinite;
  }
  return {pairwise_lane_sum(sums), first};
}

// What the screen found over every tile: tile_sums in tile order (the tile table of
// make_chunk_table(variables, screen_tile_elements)) and the smallest key.
struct screen_partials {
  std::vector<double> tile_sums;
  nonfinite_key first_nonfinite = no_nonfinite;

  // The tiles' sums added in tile order.
  double sum_of_squares() const {
    double total = 0;
    for (double s : tile_sums) total = rounded_add(total, s);
    return total;
  }
};

}  // namespace detail
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
