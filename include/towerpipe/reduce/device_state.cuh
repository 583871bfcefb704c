#pragma once
// Pieces the device reductions share: the optimizer state on the device that applies the optimizer
// (with a host mirror for reading it between steps), the launches of the fused agent and of the screen
// with the tower count fixed at compile time where it is small, and a checked step's average.

#include <cuda_runtime.h>

#include <cuda/std/type_traits>

#include <cstddef>
#include <type_traits>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/programs/screen.hpp"

namespace towerpipe {
namespace detail {

// The optimizer state of a device reduction, on the device that applies the optimizer (tower 0's), and
// the part of the reducer interface that goes with it: the device reducers derive from it. Their master
// copy of the parameters is tower 0's replica, so setting parameters needs nothing more from them —
// except with mixed precision (a bf16 or fp16 layout), where the master is an fp32 buffer of its own
// on that device, beside the fp32 state.
template <class Optim, class Layout>
class device_optimizer_state {
 public:
  using stored_type = typename Layout::value_type;
  using T = master_type_t<stored_type>;
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using device_buffer = typename Layout::template buffer<cuda_device_memory, T>;

  device_optimizer_state(const variable_set& variables, const typename Optim::hyper_parameters& h, int device)
      : device_(device),
        host_mirror_(variables),
        master_(variables_if(mixed, variables), cuda_device_memory{device}),
        master_mirror_(variables_if(mixed, variables)),
        master_table_(gather_pointers<T>(std::vector<device_buffer*>{&master_}),
                      static_cast<int>(master_.variables().count()), device) {
    const int slots = Optim::state_slots(h);
    for (int s = 0; s < slots; ++s) slots_.emplace_back(variables, cuda_device_memory{device});
    std::vector<device_buffer*> roles;
    for (device_buffer& slot : slots_) roles.push_back(&slot);
    table_ = std::make_unique<device_pointer_table<T>>(gather_pointers<T>(roles),
                                                       static_cast<int>(variables.count()), device);
  }

  std::size_t state_slots() const { return slots_.size(); }
  // Without mixed precision tower 0's replica, the master copy, is set by the towers.
  void parameter_set(std::size_t index, const T* values) {
    if constexpr (mixed) {
      device_guard on(device_);
      TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
      copy_to_device_now(master_.data(index), values, master_.view(index).size() * sizeof(T));
    }
  }
  // Mixed precision: the fp32 master, copied to the host (call between steps).
  tensor_view<const T> master_on_host(std::size_t index) {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    const tensor_view<T> target = master_mirror_.view(index);
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(target.data(), master_.data(index), target.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return target;
  }

  // Call only when no reduction is in flight (between steps).
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    copy_to_device_now(slots_[slot].data(index), values, slots_[slot].view(index).size() * sizeof(T));
  }

  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    const tensor_view<T> target = host_mirror_.view(index);
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(target.data(), slots_[slot].data(index), target.size() * sizeof(T),
                                    cudaMemcpyDeviceToHost));
    return target;
  }

 protected:
  // The state as the fused agents see it: role = slot.
  pointer_table<T> state_table() const { return table_->view(); }
  int state_slot_count() const { return static_cast<int>(slots_.size()); }
  // The fp32 master as optimizer_apply::master sees it (mixed precision; an empty table otherwise).
  pointer_table<T> master_table() const { return master_table_.view(); }

 private:
  int device_;
  std::vector<device_buffer> slots_;
  typename Layout::template buffer<host_memory, T> host_mirror_;
  std::unique_ptr<device_pointer_table<T>> table_;
  device_buffer master_;
  typename Layout::template buffer<host_memory, T> master_mirror_;
  device_pointer_table<T> master_table_;
};

// Launches fused_apply_agent<Optim, T, Towers>: the tower count fixed at compile time (unrolled, partial
// sums in registers).
template <class Policy, int Towers, class Optim, class T, class Stored>
void launch_fused_apply_for(const device_chunk_table& chunks, const cuda_stream& stream, int towers,
                            const pointer_table<const T>& gradients, const std::vector<T>& weights,
                            const optimizer_apply<Optim, T, Stored>& apply, const chunk_group& run = every_chunk) {
  fused_apply_agent<Optim, T, Towers, Stored> agent{gradients, towers, {}, apply};
  for (int t = 0; t < towers; ++t) agent.weights[t] = weights[static_cast<std::size_t>(t)];
  chunks.launch<Policy>(agent, stream, run);
}

// Calls body(integral_constant<int, towers>) for 1..8 towers, else body(integral_constant<int, 0>) (the
// count read at run time): kernels unrolled over the towers where the count is small.
template <class Body>
void with_tower_count(int towers, Body&& body) {
  switch (towers) {
    case 1: return body(::cuda::std::integral_constant<int, 1>{});
    case 2: return body(::cuda::std::integral_constant<int, 2>{});
    case 3: return body(::cuda::std::integral_constant<int, 3>{});
    case 4: return body(::cuda::std::integral_constant<int, 4>{});
    case 5: return body(::cuda::std::integral_constant<int, 5>{});
    case 6: return body(::cuda::std::integral_constant<int, 6>{});
    case 7: return body(::cuda::std::integral_constant<int, 7>{});
    case 8: return body(::cuda::std::integral_constant<int, 8>{});
    default: return body(::cuda::std::integral_constant<int, 0>{});
  }
}

// launch_fused_apply_for with the tower count fixed where it is small.
template <class Policy, class Optim, class T>
void launch_fused_apply(const device_chunk_table& chunks, const cuda_stream& stream, int towers,
                        const pointer_table<const T>& gradients, const std::vector<T>& weights,
                        const optimizer_apply<Optim, T>& apply, const chunk_group& run = every_chunk) {
  with_tower_count(towers, [&](auto towers_constant) {
    launch_fused_apply_for<Policy, decltype(towers_constant)::value>(chunks, stream, towers, gradients, weights, apply, run);
  });
}

// The screen (programs/screen.hpp) of the canonical average of every tower's gradient (of type Stored,
// widened), into `averaged`.
template <class T, class Stored>
void launch_tower_screen(const device_screen& screen, const cuda_stream& stream, int towers,
                         const pointer_table<const Stored>& gradients, const std::vector<T>& weights,
                         const pointer_table<T>& averaged, const accumulation<T>& step, const chunk_group& tiles = every_chunk) {
  with_tower_count(towers, [&](auto towers_constant) {
    using tower_source = tower_average_source<T, decltype(towers_constant)::value, weight_array<T>, Stored>;
    accumulating_source<tower_source, T> source{{gradients, towers, {}}, averaged, step};
    for (int t = 0; t < towers; ++t) source.inner.weights.value[t] = weights[static_cast<std::size_t>(t)];
    screen.launch(source, averaged, stream, tiles);
  });
}

// A checked step's average on the device that applies the optimizer (in the master type), and its screen.
template <class Layout>
struct device_average {
  using T = master_type_t<typename Layout::value_type>;
  using average_buffer = typename Layout::template buffer<cuda_device_memory, T>;
  device_average(const variable_set& variables, int device)
      : buffer(variables, cuda_device_memory{device}),
        table(gather_pointers<T>(std::vector<average_buffer*>{&buffer}), static_cast<int>(variables.count()), device),
        screen(variables, device) {}
  average_buffer buffer;
  device_pointer_table<T> table;  // role 0: the average
  device_screen screen;
};

inline void check_device_tower_count(const char* backend, std::size_t towers) {
  if (towers > static_cast<std::size_t>(max_device_towers))
    fail(backend, " takes at most ", max_device_towers, " towers, ", towers, " requested");
}

}  // namespace detail
}  // namespace towerpipe
