#pragma once
// The host's fused pass, shared by the reducers that average and apply on the CPU: reduce::host for host
// towers (reduce/host/host_towers.hpp) and for device towers (reduce/host/device_towers.hpp), and the
// block programs reduce::sharded's host form uses (reduce/sharded/host_towers.hpp).
// Why: docs/design-notes.md#reduce-common-host_pass

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/executor/thread_pool.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/plan/canonical_order.hpp"
#include "towerpipe/plan/chunk_table.hpp"

namespace towerpipe {

// Launch shape of the host reduction, a plain value struct as CUB's tuning policies are.
struct host_reduce_policy {
  static constexpr std::size_t chunk_elements = 1 << 15;  // unit of work a thread takes from the table
  static constexpr std::size_t block_elements = 256;      // scratch arrays: canonical_slots(N) x 256 values
};

namespace detail {

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
template <int Slots, class Body>
void with_slot_count(int active, Body&& body) {
  if constexpr (Slots >= 0) {
    if (active == Slots) return body(std::integral_constant<int, Slots>{});
    with_slot_count<Slots - 1>(active, body);
  }
}

// The optimizer over one block of `count` elements on the host, vectorised (why: docs/design-notes.md#reduce-common-host_pass).
template <class Optim, class T>
void update_host_block(int active, T* p, T* const* slots, const T* g, std::size_t count,
                       const typename Optim::template step_constants<T>& constants) {
  with_slot_count<Optim::max_state_slots>(active, [&](auto slot_count) {
    constexpr int used = decltype(slot_count)::value;
    const typename Optim::template step_constants<T> c = constants;
    for (std::size_t k = 0; k < count; ++k) {
      T state[Optim::max_state_slots > 0 ? Optim::max_state_slots : 1] = {};
      for (int s = 0; s < used; ++s) state[s] = slots[s][k];
      Optim::update(c, g[k], p[k], state);
      for (int s = 0; s < used; ++s) slots[s][k] = state[s];
    }
  });
}

// The sum of squares of a screen tile's `count` values (kernels/screen.hpp) in the lane order the device
// follows: lane j takes elements 128 row + 4 j + l, row outer, l inner — 32 independent chains, in memory
// order, added pairwise at the end.
template <class T>
double tile_sum_of_squares(const T* x, unsigned count) {
  double sums[screen_lanes] = {};
  const unsigned row_elements = screen_lanes * screen_group;
  const unsigned full_rows = count / row_elements;
  for (unsigned row = 0; row < full_rows; ++row, x += row_elements) {
    for (unsigned j = 0; j < screen_lanes; ++j) {
      for (unsigned l = 0; l < screen_group; ++l) sums[j] = add_square(sums[j], x[j * screen_group + l]);
    }
  }
  for (unsigned index = 0; index < count - full_rows * row_elements; ++index)
    sums[index / screen_group] = add_square(sums[index / screen_group], x[index]);
  return pairwise_lane_sum(sums);
}

// 1 for an infinity or a NaN (the exponent's bits all set), else 0: an integer, so that OR-ing it over
// a block vectorises (a floating-point test would need the comparisons kept in order).
template <class T>
unsigned exponent_all_ones(T x) {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7F800000u) == 0x7F800000u;
  } else {
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return (bits & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
  }
}

// out[k] = w * g[k], g widened to the master type, for `count` elements. Returns 1 if any g[k] is an
// infinity or a NaN (first_nonfinite_in then says which), else 0.
template <class Master, class Stored>
unsigned weigh_block(Master w, const Stored* g, std::size_t count, Master* out) {
  unsigned bad = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const Master x = static_cast<Master>(g[k]);
    bad |= exponent_all_ones(x);
    out[k] = rounded_mul(w, x);
  }
  return bad;
}

// The key of the first non-finite value of values[0, count), which are elements at, at + 1, ... of the
// variable, as seen in `tower`; no_nonfinite when all are finite.
template <class Master, class U>
nonfinite_key first_nonfinite_in(const U* values, unsigned count, int variable, unsigned at, unsigned tower) {
  for (unsigned k = 0; k < count; ++k) {
    if (!is_finite_value(static_cast<Master>(values[k]))) return make_nonfinite_key(variable, at + k, tower);
  }
  return no_nonfinite;
}

// A screen's average from the towers' canonical sum, in accumulating_source's order (kernels/screen.hpp):
// micro_weight * sum, + the running sum already in out, * inverse_total. Returns 1 if any result is
// not finite, else 0.
template <class T>
unsigned accumulate_average(const accumulation<T>& step, const T* sum, T* out, std::size_t count) {
  const accumulation<T> s = step;
  unsigned bad = 0;
  for (std::size_t k = 0; k < count; ++k) {
    T x = rounded_mul(s.micro_weight, sum[k]);
    if (!s.first) x = rounded_add(out[k], x);
    if (s.last) x = rounded_mul(s.inverse_total, x);
    out[k] = x;
    bad |= exponent_all_ones(x);
  }
  return bad;
}

// body(runner) for a part of a step (plan/buckets.hpp): a bucket on the calling thread, since the towers
// hold the pool's threads then; what the towers left on the pool, after them.
template <class Body>
void run_part_on(thread_pool& pool, const step_part& part, Body&& body) {
  if (part.during_towers()) {
    thread_pool here(1);
    body(here);
  } else {
    body(pool);
  }
}

// The optimizer state in host memory and the fused pass over any range of the chunk table; shared by
// reduce::host for host towers and for GPU towers.
// Mixed precision (a bf16 or fp16 layout): the state and the average are in the master type, the
// gradients read are widened, and run() can write a rounded copy of the parameters (the replica).
template <class Optim, class Layout>
class host_optimizer_pass {
 public:
  using stored_type = typename precision<Layout>::stored_type;
  using master_type = typename precision<Layout>::master_type;
  using buffer = typename Layout::template buffer<host_memory, master_type>;
  using constants_type = typename Optim::template step_constants<master_type>;

  host_optimizer_pass(const variable_set& variables, const typename Optim::hyper_parameters& h)
      : chunks_(make_chunk_table(variables, host_reduce_policy::chunk_elements)),
        averaged_(variables),
        by_variable_(chunks_, variables.count()) {
    static_assert(host_reduce_policy::chunk_elements % screen_tile_elements == 0,
                  "towerpipe: host chunks must hold whole screen tiles");
    for (int slot = 0; slot < Optim::state_slots(h); ++slot) state_.emplace_back(variables);
    std::size_t tiles = 0;
    for (const variable& v : variables) {
      first_tile_.push_back(tiles);
      tiles += (v.size + screen_tile_elements - 1) / screen_tile_elements;
    }
    first_tile_.push_back(tiles);
  }

  // Where the variables of a part (a bucket's, or several buckets') lie in chunks().
  const chunks_by_variable& by_variable() const { return by_variable_; }
  static std::vector<std::size_t> chunk_range(std::size_t first, std::size_t last) {
    std::vector<std::size_t> list(last - first);
    for (std::size_t c = first; c < last; ++c) list[c - first] = c;
    return list;
  }

  // A checked step's average (kernels/screen.hpp), where screen() leaves it.
  const buffer& averaged() const { return averaged_; }
  // A checked step's screen before its first part: every tile's sum zero, nothing found.
  screen_partials fresh_partials() const {
    screen_partials partials;
    partials.tile_sums.assign(first_tile_.back(), 0.0);
    return partials;
  }

  const std::vector<tensor_chunk>& chunks() const { return chunks_; }
  std::size_t state_slots() const { return state_.size(); }
  tensor_view<const master_type> state_view(std::size_t slot, std::size_t index) const { return state_[slot].view(index); }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    std::copy(values, values + state_[slot].view(index).size(), state_[slot].data(index));
  }

  // For the listed chunks: parameters = update(canonical_sum_t(weights[t] * gradients[t]), parameters,
  // state), a task per chunk on `runner` (the pool, or one of the calling thread alone); `replica`, where
  // given, gets the new parameters rounded to the stored type (mixed precision).
  template <class Runner, class GradientBuffer, class ParameterBuffer, class ReplicaBuffer = ParameterBuffer>
  void run(Runner& runner, const std::vector<std::size_t>& chunk_list, const std::vector<const GradientBuffer*>& gradients,
           ParameterBuffer& parameters, const std::vector<master_type>& weights, const constants_type& constants,
           ReplicaBuffer* replica = nullptr) {
    rethrow_first(runner.run(chunk_list.size(), [&](std::size_t c) {
      const tensor_chunk& work = chunks_[chunk_list[c]];
      const std::size_t v = static_cast<std::size_t>(work.variable);
      std::vector<const master_type*> sources(gradients.size());
      for (std::size_t t = 0; t < sources.size(); ++t) sources[t] = gradients[t]->data(v);
      for (std::size_t begin = work.first; begin < work.first + work.count; begin += host_reduce_policy::block_elements) {
        const std::size_t count = std::min(host_reduce_policy::block_elements, work.first + work.count - begin);
        master_type scratch[32][host_reduce_policy::block_elements];
        canonical_block_sum(static_cast<int>(sources.size()), count, scratch, [&](int tower, master_type* out) {
          const master_type* g = sources[static_cast<std::size_t>(tower)] + begin;
          const master_type w = weights[static_cast<std::size_t>(tower)];
          for (std::size_t k = 0; k < count; ++k) out[k] = rounded_mul(w, g[k]);  // no finiteness check: hot path
        });
        master_type* const p = parameters.data(v) + begin;
        master_type* slots[Optim::max_state_slots > 0 ? Optim::max_state_slots : 1] = {};
        for (std::size_t s = 0; s < state_.size(); ++s) slots[s] = state_[s].data(v) + begin;
        update_host_block<Optim>(static_cast<int>(state_.size()), p, slots, scratch[0], count, constants);
        if (replica != nullptr) {
          auto* r = replica->data(v) + begin;
          for (std::size_t k = 0; k < count; ++k) r[k] = static_cast<stored_type>(p[k]);
        }
      }
    }));
  }

  // Pass 1 of a checked step for the listed chunks: the canonical average into averaged() (with
  // accumulation: the running sum), and partials.tile_sums / first_nonfinite for their tiles
  // (partials.tile_sums sized as fresh_partials() sizes it).
  template <class Runner, class GradientBuffer>
  void screen(Runner& runner, const std::vector<std::size_t>& chunk_list, const std::vector<const GradientBuffer*>& gradients,
              const std::vector<master_type>& weights, const accumulation<master_type>& step, screen_partials& partials) {
    std::vector<nonfinite_key> first_in_chunk(chunk_list.size(), no_nonfinite);
    rethrow_first(runner.run(chunk_list.size(), [&](std::size_t c) {
      const tensor_chunk& work = chunks_[chunk_list[c]];
      const std::size_t v = static_cast<std::size_t>(work.variable);
      std::vector<const stored_type*> sources(gradients.size());
      for (std::size_t t = 0; t < sources.size(); ++t) sources[t] = gradients[t]->data(v);
      std::size_t tile = first_tile_[v] + work.first / screen_tile_elements;
      for (unsigned begin = 0; begin < work.count; begin += screen_tile_elements, ++tile) {
        const tensor_chunk piece{work.variable, work.first + begin,
                                 std::min<unsigned>(screen_tile_elements, work.count - begin)};
        const screen_lane_result r = screen_tile(piece, sources, weights, step, averaged_.data(v));
        partials.tile_sums[tile] = r.sum_of_squares;
        first_in_chunk[c] = std::min(first_in_chunk[c], r.first_nonfinite);
      }
    }));
    for (nonfinite_key key : first_in_chunk) partials.first_nonfinite = std::min(partials.first_nonfinite, key);
  }

 private:
  // One screen tile on the host: the average, partial and key that the lane program (screen_lane over
  // 32 lanes, kernels/screen.hpp) gives, computed block by block so that the loops vectorise; a
  // non-finite value only costs a scan of the block it is in. `out`: the variable's average.
  screen_lane_result screen_tile(const tensor_chunk& tile, const std::vector<const stored_type*>& sources,
                                 const std::vector<master_type>& weights, const accumulation<master_type>& step,
                                 master_type* out) const {
    constexpr unsigned block = host_reduce_policy::block_elements;
    nonfinite_key first = no_nonfinite;
    master_type scratch[32][block];
    for (unsigned begin = 0; begin < tile.count; begin += block) {
      const unsigned count = std::min(block, tile.count - begin), at = tile.first + begin;
      canonical_block_sum(static_cast<int>(sources.size()), count, scratch, [&](int tower, master_type* weighted) {
        const stored_type* g = sources[static_cast<std::size_t>(tower)] + at;
        if (weigh_block(weights[static_cast<std::size_t>(tower)], g, count, weighted) != 0)
          first = std::min(first, first_nonfinite_in<master_type>(g, count, tile.variable, at, static_cast<unsigned>(tower)));
      });
      master_type* o = out + at;
      const unsigned bad = accumulate_average(step, scratch[0], o, count);
      if (bad != 0) first = std::min(first, first_nonfinite_in<master_type>(o, count, tile.variable, at, nonfinite_sum_tower));
    }
    return {tile_sum_of_squares(out + tile.first, tile.count), first};
  }

  std::vector<tensor_chunk> chunks_;
  std::vector<buffer> state_;  // one buffer per optimizer state slot
  buffer averaged_;            // a checked step's average
  std::vector<std::size_t> first_tile_;  // per variable: the index of its first screen tile; last: the tile count
  chunks_by_variable by_variable_;
};
TOWERPIPE_EXACT_ARITHMETIC_END

}  // namespace detail
}  // namespace towerpipe
