#pragma once
// Pieces the device reductions share, written once against an executor: the optimizer state, the fused and screen
// launches, a checked step's average, the vector-aligned tables and the copy lists.
// Why: docs/design-notes.md#reduce-common-device_state

#include <cstddef>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/copy_list.hpp"
#include "towerpipe/kernels/screen.hpp"

namespace towerpipe {
namespace detail {

template <class Executor>
using device_memory_of = decltype(std::declval<const Executor&>().device_memory(0));

// A pointer table for Policy's launches over `chunks`, its vector alignment checked on the host first
// (check_vector_aligned): a layout the kernel cannot take fails here, with `what` in the message.
template <class Policy, class Executor, class T>
typename Executor::template pointer_table<T> vector_pointer_table(const Executor& exec, const std::vector<T*>& pointers, int variables,
                                                                  const std::vector<tensor_chunk>& chunks, int device, const char* what) {
  check_vector_aligned(pointers, static_cast<std::size_t>(variables), chunks, Policy::vector_elements * sizeof(T), what);
  return typename Executor::template pointer_table<T>(exec, pointers, variables, device);
}

// Runs a copy list (plan/copy_list.hpp) on a stream; a peer copy works with or without peer access
// (without it the driver stages through the host), which makes it the fallback path.
template <class Executor, class T>
void run_copies_async(const Executor& exec, const copy_list<T>& copies, const typename Executor::stream& stream) {
  for (const peer_copy<T>& c : copies)
    exec.copy_peer_async(c.target, c.target_device, c.source, c.source_device, c.elements * sizeof(T), stream);
}

// The optimizer state of a device reduction on the device that applies it (tower 0's) and its part of the contract;
// the master is tower 0's replica, or with mixed precision a master-type buffer beside the state.
template <class Optim, class Layout, class Executor>
class device_optimizer_state {
 public:
  using T = typename precision<Layout>::master_type;
  static constexpr bool mixed = precision<Layout>::mixed;
  using device_buffer = typename Layout::template buffer<device_memory_of<Executor>, T>;
  using towers_type = device_towers<Layout, Executor>;

  device_optimizer_state(const variable_set& variables, const typename Optim::hyper_parameters& h, towers_type& towers)
      : exec_(towers.executor()),
        towers_(towers),
        device_(towers.device(0)),
        master_(variables_if(mixed, variables), exec_.device_memory(device_)),
        master_mirror_(variables_if(mixed, variables)),
        master_table_(exec_, gather_pointers<T>(std::vector<device_buffer*>{&master_}),
                      static_cast<int>(master_.variables().count()), device_) {
    const int slots = Optim::state_slots(h);
    for (int s = 0; s < slots; ++s) slots_.emplace_back(variables, exec_.device_memory(device_));
    std::vector<device_buffer*> roles;
    for (device_buffer& slot : slots_) roles.push_back(&slot);
    table_ = std::make_unique<typename Executor::template pointer_table<T>>(exec_, gather_pointers<T>(roles),
                                                                            static_cast<int>(variables.count()), device_);
  }

  std::size_t state_slots() const { return slots_.size(); }
  // Mixed precision: the master follows the towers' parameters (between steps); else it is tower 0's replica.
  void set_master(std::size_t index, const T* values) {
    if constexpr (mixed) {
      exec_.synchronize_device(device_);
      const typename Executor::device_guard on(exec_, device_);
      exec_.copy_to_device_now(master_.data(index), values, master_.view(index).size() * sizeof(T));
    }
  }
  // The master, copied to the host (between steps).
  tensor_view<const T> master(std::size_t index) {
    if constexpr (!mixed) return towers_.parameter_on_host(index);
    exec_.synchronize_device(device_);
    const typename Executor::device_guard on(exec_, device_);
    const tensor_view<T> target = master_mirror_.view(index);
    exec_.copy_to_host_now(target.data(), master_.data(index), target.size() * sizeof(T));
    return target;
  }
  // Between steps.
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    exec_.synchronize_device(device_);
    const typename Executor::device_guard on(exec_, device_);
    exec_.copy_to_device_now(slots_[slot].data(index), values, slots_[slot].view(index).size() * sizeof(T));
  }
  tensor_view<const T> state(std::size_t slot, std::size_t index) const {
    exec_.synchronize_device(device_);
    const typename Executor::device_guard on(exec_, device_);
    // The slot's own copy, made when first read (views of two slots coexist; nothing is held for programs
    // that never read the state).
    const tensor_view<T> target = host_mirrors_.try_emplace(slot, slots_[slot].variables()).first->second.view(index);
    exec_.copy_to_host_now(target.data(), slots_[slot].data(index), target.size() * sizeof(T));
    return target;
  }
  // Bytes of the state on the device: tower 0's.
  std::vector<std::size_t> state_bytes_per_tower() const {
    std::vector<std::size_t> bytes(towers_.towers(), 0);
    for (const device_buffer& slot : slots_)
      for (std::size_t v = 0; v < slot.variables().count(); ++v) bytes[0] += slot.view(v).size() * sizeof(T);
    return bytes;
  }

 protected:
  // The state as the fused agents see it: role = slot.
  pointer_table<T> state_table() const { return table_->view(); }
  int state_slot_count() const { return static_cast<int>(slots_.size()); }
  // The master as optimizer_apply::master sees it (mixed precision; an empty table otherwise).
  pointer_table<T> master_table() const { return master_table_.view(); }

 private:
  const Executor& exec_;
  towers_type& towers_;
  int device_;
  std::vector<device_buffer> slots_;
  mutable std::map<std::size_t, typename Layout::template buffer<host_memory, T>> host_mirrors_;  // per slot read
  std::unique_ptr<typename Executor::template pointer_table<T>> table_;
  device_buffer master_;
  typename Layout::template buffer<host_memory, T> master_mirror_;
  typename Executor::template pointer_table<T> master_table_;
};

// Launches fused_apply_agent<Optim, T, Towers>: the tower count fixed at compile time (unrolled, partial
// sums in registers).
template <class Policy, int Towers, class Optim, class T, class Stored, class Table, class Stream>
void launch_fused_apply_for(const Table& chunks, const Stream& stream, int towers, const pointer_table<const T>& gradients,
                            const std::vector<T>& weights, const optimizer_apply<Optim, T, Stored>& apply,
                            const chunk_group& run = every_chunk) {
  fused_apply_agent<Optim, T, Towers, Stored> agent{gradients, towers, {}, apply};
  for (int t = 0; t < towers; ++t) agent.weights[t] = weights[static_cast<std::size_t>(t)];
  chunks.template launch<Policy>(agent, stream, run);
}

// Calls body(integral_constant<int, towers>) for 1..8 towers, else body(integral_constant<int, 0>) (the
// count read at run time): kernels unrolled over the towers where the count is small.
template <int Towers = 8, class Body>
void with_tower_count(int towers, Body&& body) {
  if constexpr (Towers == 0) body(std::integral_constant<int, 0>{});
  else if (towers == Towers) body(std::integral_constant<int, Towers>{});
  else with_tower_count<Towers - 1>(towers, body);
}

// launch_fused_apply_for with the tower count fixed where it is small.
template <class Policy, class Optim, class T, class Table, class Stream>
void launch_fused_apply(const Table& chunks, const Stream& stream, int towers, const pointer_table<const T>& gradients,
                        const std::vector<T>& weights, const optimizer_apply<Optim, T>& apply, const chunk_group& run = every_chunk) {
  with_tower_count(towers, [&](auto towers_constant) {
    launch_fused_apply_for<Policy, decltype(towers_constant)::value>(chunks, stream, towers, gradients, weights, apply, run);
  });
}

// The screen (kernels/screen.hpp) of the canonical average of every tower's gradient (of type Stored,
// widened), into `averaged`.
template <class T, class Stored, class Screen, class Stream>
void launch_tower_screen(const Screen& screen, const Stream& stream, int towers, const pointer_table<const Stored>& gradients,
                         const std::vector<T>& weights, const pointer_table<T>& averaged, const accumulation<T>& step,
                         const chunk_group& tiles = every_chunk) {
  with_tower_count(towers, [&](auto towers_constant) {
    using tower_source = tower_average_source<T, decltype(towers_constant)::value, weight_array<T>, Stored>;
    accumulating_source<tower_source, T> source{{gradients, towers, {}}, averaged, step};
    for (int t = 0; t < towers; ++t) source.inner.weights.value[t] = weights[static_cast<std::size_t>(t)];
    screen.launch(source, averaged, stream, tiles);
  });
}

// A checked step's average on the device that applies the optimizer (in the master type), and its screen.
template <class Layout, class Executor>
struct device_average {
  using T = typename precision<Layout>::master_type;
  using average_buffer = typename Layout::template buffer<device_memory_of<Executor>, T>;
  device_average(const Executor& exec, const variable_set& variables, int device)
      : buffer(variables, exec.device_memory(device)),
        table(exec, gather_pointers<T>(std::vector<average_buffer*>{&buffer}), static_cast<int>(variables.count()), device),
        screen(exec, variables, device) {}
  average_buffer buffer;
  typename Executor::template pointer_table<T> table;  // role 0: the average
  typename Executor::screen screen;
};

inline void check_device_tower_count(const char* backend, std::size_t towers) {
  if (towers > static_cast<std::size_t>(max_device_towers))
    fail(backend, " takes at most ", max_device_towers, " towers, ", towers, " requested");
}

}  // namespace detail
}  // namespace towerpipe
