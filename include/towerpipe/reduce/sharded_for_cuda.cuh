#pragma once
// reduce::sharded for GPU towers, in one process: the optimizer sharded over the towers' devices.
// Tower t's device owns slice t of the chunk table (reduce/owner_slices.hpp: whole chunks, about 1/N of
// the parameters) and holds only that slice's optimizer state (and, for checked steps, that slice of the
// average). A step runs, on every owner's stream at once, the fused multi-tensor kernel of
// reduce::device0 over the owner's chunks: it reads that slice of every tower's gradient (peer reads),
// sums in the canonical order, applies the optimizer with the owner's state, and writes the new slice
// into every tower's replica (peer writes). As for device0, the master copy of the parameters is tower
// 0's replica: each owner reads its slice there. The agents and the tree are device0's, element for element,
// so the result is bitwise device0's (README.md, invariant 2); only who computes which element differs.
//
// Bytes: every owner reads N gradients' and writes N replicas' worth of its slice, so all owners
// together move what device0 moves, spread over the devices: on one GPU it costs about device0's time,
// on devices joined by NVLink each link carries 1/N of it. The state is 1/N per device.
//
// Checked steps (reduce/screen.hpp): each owner screens its slice's average into its own buffer; slices
// start where screen tiles start (chunks are whole tiles), so the owners' tile sums in owner order are
// the whole table's, and the first non-finite key is their minimum. Then each owner applies.
//
// Needs peer access between every owner's device and every tower's (or one device for all); it says so
// at construction otherwise. Not yet: several processes with GPU towers (reduce::sharded across
// processes takes host towers, reduce/sharded.hpp), mixed precision.

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/pipeline_options.hpp"
#include "towerpipe/reduce/agents.hpp"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/reduce/owner_slices.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/reduce/sharded.hpp"
#include "towerpipe/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class sharded_device_reducer {
 public:
  using T = typename Layout::value_type;
  using hyper_parameters = typename Optim::hyper_parameters;
  static_assert(std::is_same<T, master_type_t<T>>::value,
                "towerpipe: reduce::sharded with 16-bit GPU towers (mixed precision) is not supported yet; use reduce::device0");
  static_assert(Policy::chunk_elements % screen_tile_elements == 0,
                "towerpipe: reduce::sharded needs chunks of whole screen tiles, so that each tile has one owner");

  sharded_device_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                         const pipeline_options& options)
      : slots_(Optim::state_slots(h)), host_mirror_(variables) {
    const std::size_t n = towers.towers();
    check_device_tower_count("reduce::sharded", n);
    if (options.processes && options.processes->size() > 1)
      fail("reduce::sharded with GPU towers runs in one process for now (pipeline_options::processes has ",
           options.processes->size(), "); across processes it takes host towers");
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t t = 0; t < n; ++t) {
        if (!towers.can_access(towers.device(k), towers.device(t)))
          fail("reduce::sharded: tower ", k, "'s device ", towers.device(k), " has no peer access to tower ", t,
               "'s device ", towers.device(t), "; every owner reads and writes every tower (reduce::device0 copies instead)");
      }
    }
    const std::vector<tensor_chunk> table = make_chunk_table(variables, Policy::chunk_elements);
    const bool checked = takes_checked_steps(options, false);
    std::vector<owner_slice> slices = cut_into_slices(table, n);
    for (std::size_t k = 0; k < n; ++k) {
      if (!slices[k].empty()) owners_.push_back(std::make_unique<owner>(variables, table, std::move(slices[k]), k, towers, slots_, checked));
    }
  }

  void average_and_apply(cuda_towers<Layout>& towers, const std::vector<T>& weights,
                         const typename Optim::template step_constants<T>& constants, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded");
    for (auto& o : owners_) {
      device_guard on(o->device);
      wait_for_gradients(towers, *o);
      launch_fused_apply<Policy, Optim, T>(o->chunks, o->stream, static_cast<int>(towers.towers()), o->gradients.const_view(),
                                           weights, apply_for(*o, towers, constants));
    }
    stages.reduce = finish(towers, "sharded average + apply + broadcast");
  }

  // A checked step, pass 1: each owner's slice of the average and its screen.
  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<T>& weights, const accumulation<T>& step,
                                 stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded screen");
    for (auto& o : owners_) {
      device_guard on(o->device);
      wait_for_gradients(towers, *o);
      o->checked().screen.reset(o->stream);
      launch_tower_screen(o->checked().screen, o->stream, static_cast<int>(towers.towers()), o->gradients.const_view(),
                          weights, o->checked().table.view(), step);
      o->end.record(o->stream);
    }
    // The towers may write their gradients again once every owner has read them.
    stages.reduce = wait_for_owners(towers, "sharded average + screen");
    screen_partials all;
    for (auto& o : owners_) {
      const screen_partials mine = o->checked().screen.results();
      all.tile_sums.insert(all.tile_sums.end(), mine.tile_sums.begin(), mine.tile_sums.end());
      all.first_nonfinite = std::min(all.first_nonfinite, mine.first_nonfinite);
    }
    return all;
  }

  // Pass 2: the optimizer on scale * each owner's slice of the average, the new slices into every replica.
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const typename Optim::template step_constants<T>& constants,
                      stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded apply");
    for (auto& o : owners_) {
      device_guard on(o->device);
      o->start.record(o->stream);
      launch_fused_apply_for<Policy, 1>(o->chunks, o->stream, 1, o->checked().table.const_view(), std::vector<T>{scale},
                                        apply_for(*o, towers, constants));
    }
    stages.reduce += finish(towers, "sharded apply + broadcast");
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }

  // Bytes of optimizer state on each tower's device: the owner's slice of every slot.
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    std::vector<std::size_t> bytes(towers, 0);
    for (const auto& o : owners_) bytes[o->tower] = static_cast<std::size_t>(slots_) * o->slice.elements * sizeof(T);
    return bytes;
  }

  // Between steps: the slot's values of one variable, gathered from the owners that hold parts of it.
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    const tensor_view<T> target = host_mirror_.view(index);
    for_each_part(slot, index, [&](const T* device_part, std::size_t begin, std::size_t count) {
      TOWERPIPE_CUDA_CHECK(cudaMemcpy(target.data() + begin, device_part, count * sizeof(T), cudaMemcpyDeviceToHost));
    });
    return target;
  }

  void set_state(std::size_t slot, std::size_t index, const T* values) {
    for_each_part(slot, index, [&](T* device_part, std::size_t begin, std::size_t count) {
      TOWERPIPE_CUDA_CHECK(cudaMemcpy(device_part, values + begin, count * sizeof(T), cudaMemcpyHostToDevice));
    });
  }

 private:
  // A checked step's slice of the average (or running sum, with accumulation) and the screen of its tiles.
  struct checked_buffers {
    checked_buffers(const variable_set& variables, const owner_slice& slice, int device)
        : storage(cuda_device_memory{device}.allocate<T>(slice.elements, 256)),
          table(slice_pointers(slice, storage.get(), variables.count()), static_cast<int>(variables.count()), device),
          screen(make_chunk_table(slice.ranges, screen_tile_elements), device) {}
    cuda_device_memory::owner<T> storage;
    device_pointer_table<T> table;  // role 0: the average, indexed as a whole variable
    device_screen screen;
  };

  // One owner: tower `tower`'s device, its slice, its slice of the state.
  struct owner {
    owner(const variable_set& variables, const std::vector<tensor_chunk>& table, owner_slice owned, std::size_t k,
          cuda_towers<Layout>& towers, int slots, bool checked)
        : tower(k),
          device(towers.device(k)),
          slice(std::move(owned)),
          stream(device),
          start(device, true),
          end(device, true),
          chunks(slice.chunk_list(table), device),
          state_storage(cuda_device_memory{device}.allocate<T>(static_cast<std::size_t>(slots) * slice.elements, 256)),  // zeros
          state(state_pointers(variables, slots), static_cast<int>(variables.count()), device),
          gradients(gather_pointers<T>(every_tower(towers, &cuda_towers<Layout>::gradients)),
                    static_cast<int>(variables.count()), device),
          replicas(gather_pointers<T>(every_tower(towers, &cuda_towers<Layout>::replica)),
                   static_cast<int>(variables.count()), device) {
      if (checked) checked_ = std::make_unique<checked_buffers>(variables, slice, device);
    }

    checked_buffers& checked() {
      if (!checked_) fail("reduce::sharded: a checked step on a pipeline built for unchecked steps");
      return *checked_;
    }
    T* slot_base(std::size_t slot) const { return state_storage.get() + slot * slice.elements; }

    std::size_t tower;
    int device;
    owner_slice slice;
    cuda_stream stream;
    cuda_event start, end;
    device_chunk_table chunks;
    cuda_device_memory::owner<T> state_storage;  // slot after slot, each the slice's elements end to end
    device_pointer_table<T> state;               // role = slot, indexed as whole variables
    device_pointer_table<T> gradients;           // role = tower
    device_pointer_table<T> replicas;            // role = tower; replica 0 is the master copy every owner reads
    std::unique_ptr<checked_buffers> checked_;

   private:
    std::vector<T*> state_pointers(const variable_set& variables, int slots) const {
      std::vector<T*> pointers;
      for (int s = 0; s < slots; ++s) {
        const std::vector<T*> slot = slice_pointers(slice, slot_base(static_cast<std::size_t>(s)), variables.count());
        pointers.insert(pointers.end(), slot.begin(), slot.end());
      }
      if (pointers.empty()) pointers.push_back(nullptr);  // a table needs one entry to allocate
      return pointers;
    }
    // Every tower's buffer of one kind, in tower order (the canonical tree's).
    using buffer_of = typename cuda_towers<Layout>::device_buffer& (cuda_towers<Layout>::*)(std::size_t);
    static std::vector<typename cuda_towers<Layout>::device_buffer*> every_tower(cuda_towers<Layout>& towers, buffer_of which) {
      std::vector<typename cuda_towers<Layout>::device_buffer*> roles;
      for (std::size_t t = 0; t < towers.towers(); ++t) roles.push_back(&(towers.*which)(t));
      return roles;
    }
  };

  // The owner's stream waits for every tower's gradients; its timing starts there.
  void wait_for_gradients(cuda_towers<Layout>& towers, owner& o) {
    for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(o.stream);
    o.start.record(o.stream);
  }

  optimizer_apply<Optim, T> apply_for(owner& o, cuda_towers<Layout>& towers,
                                      const typename Optim::template step_constants<T>& constants) {
    return {o.replicas.view(), o.state.view(), static_cast<int>(towers.towers()), slots_, constants, {}};
  }

  // Every tower's next work waits for every owner's writes; the host waits for all. Returns the slowest
  // owner's seconds.
  double finish(cuda_towers<Layout>& towers, const char* span_name) {
    for (auto& o : owners_) o->end.record(o->stream);
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      for (auto& o : owners_) o->end.make_wait(towers.stream(t));
    }
    return wait_for_owners(towers, span_name);
  }

  // The host waits for every owner's end event; each owner's span goes on the timeline. Returns the
  // slowest owner's seconds.
  double wait_for_owners(cuda_towers<Layout>& towers, const char* span_name) {
    double slowest = 0.0;
    for (auto& o : owners_) {
      o->end.synchronize();
      slowest = std::max(slowest, seconds_between(o->start, o->end));
      towers.device_span(o->tower, o->start, o->end, span_name, "reduce (GPU) owner ", o->tower);
    }
    return slowest;
  }

  // Calls part(device pointer, first element, count) for each owner's part of variable `index` of a slot,
  // after the owners' streams are idle.
  template <class Part>
  void for_each_part(std::size_t slot, std::size_t index, Part&& part) {
    if (slot >= static_cast<std::size_t>(slots_)) fail("reduce::sharded: state slot ", slot, " of ", slots_);
    for (auto& o : owners_) {
      device_guard on(o->device);
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(o->stream.get()));
      std::size_t offset = 0;
      for (const element_range& r : o->slice.ranges) {
        if (r.variable == index) part(o->slot_base(slot) + offset, r.begin, r.end - r.begin);
        offset += r.end - r.begin;
      }
    }
  }

  int slots_;
  typename Layout::template buffer<host_memory> host_mirror_;
  std::vector<std::unique_ptr<owner>> owners_;  // one per tower with a non-empty slice
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::cuda, reduce::sharded, Optim, Layout> {
  using type = detail::sharded_device_reducer<Optim, Layout>;
};

}  // namespace towerpipe
