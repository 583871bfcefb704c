#pragma once
// reduce::host — the parameter server on the CPU, done well: one pass over memory that averages the
// towers' gradients in the canonical order, applies the optimizer and writes the parameters, spread
// over the thread pool.
//
// The work is a table of chunks (variable, first element, count) built once at construction — the
// host form of a multi-tensor apply. Each chunk is processed in blocks small enough for L1: the tower
// tree (reduce/canonical_order.hpp) runs element-wise over scratch arrays, then the optimizer's
// per-element update runs on the block. Every element's result depends only on its own inputs, never
// on which thread took the chunk, so the parameters are bitwise reproducible run to run.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/reduce/canonical_order.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/stats.hpp"

namespace towerpipe {

// Launch shape of the host reduction, a plain value struct as CUB's tuning policies are.
struct host_reduce_policy {
  std::size_t chunk_elements = 1 << 15;  // unit of work a thread takes from the table
  static constexpr std::size_t block_elements = 256;  // scratch arrays: canonical_slots(N) x 256 values
};

template <class Optim, class Layout>
class host_reducer {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;
  using hyper_parameters = typename Optim::hyper_parameters;

  host_reducer(const variable_set& variables, const hyper_parameters& h, host_towers<Layout>&,
               host_reduce_policy policy = {}) {
    for (int slot = 0; slot < Optim::state_slots(h); ++slot) state_.emplace_back(variables);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      for (std::size_t first = 0; first < variables[v].size; first += policy.chunk_elements)
        chunks_.push_back({v, first, std::min(policy.chunk_elements, variables[v].size - first)});
    }
  }

  std::size_t state_slots() const { return state_.size(); }
  tensor_view<const value_type> state_on_host(std::size_t slot, std::size_t index) { return state_[slot].view(index); }

  // parameters = update(canonical_sum_i(weights[i] * gradients(i)), parameters, state) for every element,
  // in the towers' shared parameters: there is nothing to broadcast.
  void average_and_apply(host_towers<Layout>& towers, const std::vector<value_type>& weights,
                         const typename Optim::template step_constants<value_type>& constants, stage_seconds&) {
    buffer& parameters = towers.shared_parameters();
    std::vector<std::exception_ptr> failures = towers.pool().run(chunks_.size(), [&](std::size_t c) {
      const chunk& work = chunks_[c];
      std::vector<const value_type*> gradients(towers.towers());
      for (std::size_t t = 0; t < gradients.size(); ++t) gradients[t] = towers.gradients(t).data(work.variable);
      for (std::size_t first = work.first; first < work.first + work.count; first += host_reduce_policy::block_elements) {
        const std::size_t count = std::min(host_reduce_policy::block_elements, work.first + work.count - first);
        apply_block(parameters.data(work.variable) + first, work.variable, first, count, gradients, weights, constants);
      }
    });
    for (const std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);
    }
  }

 private:
  struct chunk {
    std::size_t variable, first, count;
  };

  void apply_block(value_type* p, std::size_t variable, std::size_t first, std::size_t count,
                   const std::vector<const value_type*>& gradients, const std::vector<value_type>& weights,
                   const typename Optim::template step_constants<value_type>& constants) {
    value_type scratch[32][host_reduce_policy::block_elements];
    canonical_tree_reduce(
        static_cast<int>(gradients.size()),
        [&](int tower, int slot) {
          const value_type* g = gradients[tower] + first;
          const value_type w = weights[tower];
          for (std::size_t k = 0; k < count; ++k) scratch[slot][k] = detail::rounded_mul(w, g[k]);
        },
        [&](int left, int right) {
          for (std::size_t k = 0; k < count; ++k) scratch[left][k] = detail::rounded_add(scratch[left][k], scratch[right][k]);
        });

    value_type* slots[Optim::max_state_slots] = {};
    const std::size_t active_slots = state_.size();
    for (std::size_t s = 0; s < active_slots; ++s) slots[s] = state_[s].data(variable) + first;
    for (std::size_t k = 0; k < count; ++k) {
      value_type state[Optim::max_state_slots] = {};
      for (std::size_t s = 0; s < active_slots; ++s) state[s] = slots[s][k];
      Optim::update(constants, scratch[0][k], p[k], state);
      for (std::size_t s = 0; s < active_slots; ++s) slots[s][k] = state[s];
    }
  }

  std::vector<buffer> state_;  // one buffer per optimizer state slot
  std::vector<chunk> chunks_;
};

namespace reduce {

// Average + optimizer on the CPU (see the top of this header).
struct host {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "host";
};

}  // namespace reduce

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::host, Optim, Layout> {
  using type = host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
