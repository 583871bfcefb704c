#pragma once
// reduce::host — the parameter server on the CPU, done well: one pass over memory that averages the
// towers' gradients in the canonical order, applies the optimizer and writes the parameters, spread
// over the thread pool.
//
// The work is a table of chunks (variable, first element, count; reduce/multi_tensor.hpp) built once at
// construction — the host form of a multi-tensor apply. Each chunk is processed in blocks small enough for L1: the tower
// tree (reduce/canonical_order.hpp) runs element-wise over scratch arrays, then the optimizer's
// per-element update runs on the block. Every element's result depends only on its own inputs, never
// on which thread took the chunk, so the parameters are bitwise reproducible run to run.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <vector>

#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/reduce/canonical_order.hpp"
#include "towerpipe/reduce/chunk_table.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/stats.hpp"

namespace towerpipe {

// Launch shape of the host reduction, a plain value struct as CUB's tuning policies are.
struct host_reduce_policy {
  static constexpr std::size_t chunk_elements = 1 << 15;  // unit of work a thread takes from the table
  static constexpr std::size_t block_elements = 256;      // scratch arrays: canonical_slots(N) x 256 values
};

namespace detail {

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
// The optimizer state in host memory and the fused pass over any range of the chunk table; shared by
// reduce::host for host towers and for GPU towers.
template <class Optim, class Layout>
class host_optimizer_pass {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;
  using constants_type = typename Optim::template step_constants<value_type>;

  host_optimizer_pass(const variable_set& variables, const typename Optim::hyper_parameters& h)
      : chunks_(make_chunk_table(variables, host_reduce_policy::chunk_elements)) {
    for (int slot = 0; slot < Optim::state_slots(h); ++slot) state_.emplace_back(variables);
  }

  const std::vector<tensor_chunk>& chunks() const { return chunks_; }
  std::size_t state_slots() const { return state_.size(); }
  tensor_view<const value_type> state_view(std::size_t slot, std::size_t index) const { return state_[slot].view(index); }
  void set_state(std::size_t slot, std::size_t index, const value_type* values) {
    std::copy(values, values + state_[slot].view(index).size(), state_[slot].data(index));
  }

  // For chunks [first, last): parameters = update(canonical_sum_t(weights[t] * gradients[t]), parameters,
  // state), spread over the pool's threads.
  template <class GradientBuffer, class ParameterBuffer>
  void run(thread_pool& pool, std::size_t first, std::size_t last, const std::vector<const GradientBuffer*>& gradients,
           ParameterBuffer& parameters, const std::vector<value_type>& weights, const constants_type& constants) {
    std::vector<std::exception_ptr> failures = pool.run(last - first, [&](std::size_t c) {
      const tensor_chunk& work = chunks_[first + c];
      const std::size_t v = static_cast<std::size_t>(work.variable);
      std::vector<const value_type*> sources(gradients.size());
      for (std::size_t t = 0; t < sources.size(); ++t) sources[t] = gradients[t]->data(v);
      for (std::size_t begin = work.first; begin < work.first + work.count; begin += host_reduce_policy::block_elements) {
        const std::size_t count = std::min(host_reduce_policy::block_elements, work.first + work.count - begin);
        apply_block(parameters.data(v) + begin, v, begin, count, sources, weights, constants);
      }
    });
    for (const std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
  }

 private:
  void apply_block(value_type* p, std::size_t variable, std::size_t first, std::size_t count,
                   const std::vector<const value_type*>& gradients, const std::vector<value_type>& weights,
                   const constants_type& constants) {
    value_type scratch[32][host_reduce_policy::block_elements];
    canonical_tree_reduce(
        static_cast<int>(gradients.size()),
        [&](int tower, int slot) {
          const value_type* g = gradients[static_cast<std::size_t>(tower)] + first;
          const value_type w = weights[static_cast<std::size_t>(tower)];
          for (std::size_t k = 0; k < count; ++k) scratch[slot][k] = rounded_mul(w, g[k]);
        },
        [&](int left, int right) {
          for (std::size_t k = 0; k < count; ++k) scratch[left][k] = rounded_add(scratch[left][k], scratch[right][k]);
        });

    value_type* slots[Optim::max_state_slots] = {};
    for (std::size_t s = 0; s < state_.size(); ++s) slots[s] = state_[s].data(variable) + first;
    with_slot_count<Optim::max_state_slots>(static_cast<int>(state_.size()), [&](auto active) {
      update_block<decltype(active)::value>(p, slots, scratch[0], count, constants);
    });
  }

  // The optimizer over one block with the number of state slots fixed at compile time, so that the
  // compiler can vectorise the loop.
  // The constants are copied into a local: through the reference the compiler would have to assume
  // that the stores to p and the state alias them, reload them every element and give up vectorising.
  template <int Slots>
  static void update_block(value_type* p, value_type* const* slots, const value_type* g, std::size_t count,
                           const constants_type& constants) {
    const constants_type c = constants;
    for (std::size_t k = 0; k < count; ++k) {
      value_type state[Optim::max_state_slots] = {};
      for (int s = 0; s < Slots; ++s) state[s] = slots[s][k];
      Optim::update(c, g[k], p[k], state);
      for (int s = 0; s < Slots; ++s) slots[s][k] = state[s];
    }
  }

  template <int Slots, class Body>
  static void with_slot_count(int active, Body&& body) {
    if constexpr (Slots >= 0) {
      if (active == Slots) return body(std::integral_constant<int, Slots>{});
      with_slot_count<Slots - 1>(active, body);
    }
  }

  std::vector<tensor_chunk> chunks_;
  std::vector<buffer> state_;  // one buffer per optimizer state slot
};
TOWERPIPE_EXACT_ARITHMETIC_END

// reduce::host with exec::host (the reducer interface: reduce/reducer_contract.hpp).
template <class Optim, class Layout>
class host_reducer {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;
  using hyper_parameters = typename Optim::hyper_parameters;

  host_reducer(const variable_set& variables, const hyper_parameters& h, host_towers<Layout>&) : pass_(variables, h) {}

  std::size_t state_slots() const { return pass_.state_slots(); }
  tensor_view<const value_type> state_on_host(std::size_t slot, std::size_t index) { return pass_.state_view(slot, index); }
  void set_state(std::size_t slot, std::size_t index, const value_type* values) { pass_.set_state(slot, index, values); }
  // The fused pass over every chunk, in the towers' shared parameters: there is nothing to broadcast.
  void average_and_apply(host_towers<Layout>& towers, const std::vector<value_type>& weights,
                         const typename Optim::template step_constants<value_type>& constants, stage_seconds& stages) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<const buffer*> gradients;
    for (std::size_t t = 0; t < towers.towers(); ++t) gradients.push_back(&towers.gradients(t));
    pass_.run(towers.pool(), 0, pass_.chunks().size(), gradients, towers.shared_parameters(), weights, constants);
    stages.reduce = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  host_optimizer_pass<Optim, Layout> pass_;
};

}  // namespace detail

namespace reduce {

// Average + optimizer on the CPU (see the top of this header).
struct host {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "host";
};

}  // namespace reduce

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::host, Optim, Layout> {
  using type = detail::host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
