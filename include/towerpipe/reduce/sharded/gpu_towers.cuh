#pragma once
// reduce::sharded for GPU towers, in one process: the optimizer sharded over the towers' devices.
// Tower t's device owns slice t of the chunk table (programs/owner_slices.hpp: whole chunks, about 1/N of
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
// Checked steps (programs/screen.hpp): each owner screens its slice's average into its own buffer; slices
// start where screen tiles start (chunks are whole tiles), so the owners' tile sums in owner order are
// the whole table's, and the first non-finite key is their minimum. Then each owner applies.
//
// Where an owner's device cannot address a tower's (no peer access, or
// pipeline_options::direct_device_access off), the owner copies that tower's slice of the gradients in
// and its new slice of the parameters out, with a one-time warning through the log sink. Not yet: mixed
// precision.
//
// With pipeline_options::processes, the towers of several processes: reduce/sharded/gpu_towers_across_processes.cuh
// (sharded_gpu_reducer below chooses).

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/cuda/slice_copy.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/owner_slices.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/reduce/sharded/host_towers.hpp"
#include "towerpipe/reduce/sharded/gpu_towers_across_processes.cuh"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class sharded_device_reducer {
 public:
  using T = typename Layout::value_type;
  using hyper_parameters = typename Optim::hyper_parameters;
  static_assert(check_sharded_gpu_types<T, Policy>());

  sharded_device_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                         const pipeline_options& options)
      : slots_(Optim::state_slots(h)), host_mirror_(variables) {
    const std::size_t n = towers.towers();
    check_device_tower_count("reduce::sharded", n);
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
      o->stage_in(towers, true, true);
      launch_fused_apply<Policy, Optim, T>(o->chunks, o->stream, static_cast<int>(towers.towers()), o->gradients.const_view(),
                                           weights, apply_for(*o, towers, constants));
      o->stage_out(towers);
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
      o->stage_in(towers, true, false);
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
      o->stage_in(towers, false, true);
      launch_fused_apply_for<Policy, 1>(o->chunks, o->stream, 1, o->checked().table.const_view(), std::vector<T>{scale},
                                        apply_for(*o, towers, constants));
      o->stage_out(towers);
    }
    stages.reduce += finish(towers, "sharded apply + broadcast");
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }

  // Bytes of optimizer state on each tower's device: the owner's slice of every slot.
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    std::vector<std::size_t> bytes(towers, 0);
    for (const auto& o : owners_) bytes[o->tower] = static_cast<std::size_t>(slots_) * o->slice.stored_elements * sizeof(T);
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
      copy_to_device_now(device_part, values + begin, count * sizeof(T));
    });
  }

 private:
  using checked_buffers = sharded_checked_buffers<T, Policy>;

  // One owner: tower `tower`'s device, its slice, its slice of the state. It reads and writes the towers'
  // buffers directly where its device can (pipeline_options::direct_device_access, peer access); for
  // the others it copies their slice of the gradients in and its new slice of the parameters out
  // (cuda/slice_copy.cuh), through compact buffers of its own.
  struct owner {
    owner(const variable_set& variables, const std::vector<tensor_chunk>& table, owner_slice owned, std::size_t k,
          cuda_towers<Layout>& towers, int slots, bool checked)
        : tower(k),
          device(towers.device(k)),
          slice(std::move(owned)),
          stream(device),
          start(device, true),
          end(device, true),
          chunk_list(slice.chunk_list(table)),
          chunks(chunk_list, device),
          state_storage(cuda_device_memory{device}.allocate<T>(static_cast<std::size_t>(slots) * slice.stored_elements, 256)),  // zeros
          state(vector_pointer_table<Policy>(slice_row_pointers(slice, state_storage.get(), static_cast<std::size_t>(slots), variables.count()),
                                             static_cast<int>(variables.count()), chunk_list, device,
                                             "reduce::sharded: an owner's slice of the optimizer state")),
          staged(stage_where_needed(towers)),
          gradients(vector_pointer_table<Policy>(
              tower_pointers(towers, &cuda_towers<Layout>::gradients, &copies::gradients, variables.count()),
              static_cast<int>(variables.count()), chunk_list, device, "reduce::sharded: the gradients an owner reads")),
          replicas(vector_pointer_table<Policy>(tower_pointers(towers, &cuda_towers<Layout>::replica, &copies::replica, variables.count()),
                                                static_cast<int>(variables.count()), chunk_list, device,
                                                "reduce::sharded: the replicas an owner writes")) {
      if (checked) checked_ = std::make_unique<checked_buffers>(variables, slice, chunk_list, device);
    }

    checked_buffers& checked() {
      if (!checked_) fail("reduce::sharded: a checked step on a pipeline built for unchecked steps");
      return *checked_;
    }
    T* slot_base(std::size_t slot) const { return state_storage.get() + slot * slice.stored_elements; }

    // On the owner's stream: the copied towers' slices of their gradients, and replica 0's (the master
    // copy the optimizer reads) where it is copied; then, after the kernel, the new slice to the copied towers.
    void stage_in(cuda_towers<Layout>& towers, bool gradients_too, bool master_too) {
      for (std::size_t t = 0; t < staged.size(); ++t) {
        if (!staged[t]) continue;
        if (gradients_too)
          copy_slice_async(slice, slice_copy::into_compact, towers.gradients(t), towers.device(t), staged[t]->gradients.get(),
                           device, stream);
        if (master_too && t == 0)
          copy_slice_async(slice, slice_copy::into_compact, towers.replica(0), towers.device(0), staged[0]->replica.get(), device,
                           stream);
      }
    }
    void stage_out(cuda_towers<Layout>& towers) {
      for (std::size_t t = 0; t < staged.size(); ++t) {
        if (staged[t])
          copy_slice_async(slice, slice_copy::out_of_compact, towers.replica(t), towers.device(t), staged[t]->replica.get(), device,
                           stream);
      }
    }

    // A copied tower's slice of its gradients and replica, on the owner's device.
    struct copies {
      cuda_device_memory::owner<T> gradients, replica;
    };

    std::size_t tower;
    int device;
    owner_slice slice;
    cuda_stream stream;
    cuda_event start, end;
    std::vector<tensor_chunk> chunk_list;  // the slice's chunks
    device_chunk_table chunks;
    cuda_device_memory::owner<T> state_storage;  // slot after slot, each the slice's compact storage
    device_pointer_table<T> state;               // role = slot, indexed as whole variables
    std::vector<std::unique_ptr<copies>> staged;  // per tower; null: read and written directly
    device_pointer_table<T> gradients;           // role = tower
    device_pointer_table<T> replicas;            // role = tower; replica 0 is the master copy every owner reads
    std::unique_ptr<checked_buffers> checked_;

   private:
    std::vector<std::unique_ptr<copies>> stage_where_needed(cuda_towers<Layout>& towers) const {
      std::vector<std::unique_ptr<copies>> result(towers.towers());
      const std::vector<char> copied = towers.access().copied_by(tower);  // never its own tower
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        if (!copied[t]) continue;
        log_warning(make_message("reduce::sharded: owner ", tower, " (device ", device, ") does not reach tower ", t,
                                 " (device ", towers.device(t), ") directly; its slice of that tower's buffers is copied"));
        const cuda_device_memory memory{device};
        result[t] = std::make_unique<copies>(
            copies{memory.allocate<T>(slice.stored_elements, 256), memory.allocate<T>(slice.stored_elements, 256)});
      }
      return result;
    }
    // Every tower's buffer of one kind, in tower order (the canonical tree's): the tower's own, or the
    // owner's compact copy of its slice.
    using buffer_of = typename cuda_towers<Layout>::device_buffer& (cuda_towers<Layout>::*)(std::size_t);
    using copy_of = cuda_device_memory::owner<T> copies::*;
    std::vector<T*> tower_pointers(cuda_towers<Layout>& towers, buffer_of which, copy_of copied, std::size_t variables) const {
      std::vector<T*> pointers;
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        const std::vector<T*> role = staged[t] ? slice_pointers(slice, ((*staged[t]).*copied).get(), variables)
                                               : gather_pointers<T>(std::vector<typename cuda_towers<Layout>::device_buffer*>{&(towers.*which)(t)});
        pointers.insert(pointers.end(), role.begin(), role.end());
      }
      return pointers;
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
      o->slice.for_each_stored_range([&](const element_range& r, std::size_t offset) {
        if (r.variable == index) part(o->slot_base(slot) + offset, r.begin, r.end - r.begin);
      });
    }
  }

  int slots_;
  typename Layout::template buffer<host_memory> host_mirror_;
  std::vector<std::unique_ptr<owner>> owners_;  // one per tower with a non-empty slice
};

// reduce::sharded for GPU towers: over the towers' devices in this process, or, given a process group
// (even of one process), across its processes. The choice is made at run time, so that a pipeline's
// type does not depend on how it is launched.
template <class Optim, class Layout>
class sharded_gpu_reducer {
 public:
  using T = typename Layout::value_type;
  using hyper_parameters = typename Optim::hyper_parameters;
  using constants_type = typename Optim::template step_constants<T>;

  // `span`: the processes, their configuration already compared (step/processes.hpp).
  sharded_gpu_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                      const pipeline_options& options, const processes& span) {
    if (options.processes) across_ = std::make_unique<sharded_process_reducer<Optim, Layout>>(variables, h, towers, options, span);
    else within_ = std::make_unique<sharded_device_reducer<Optim, Layout>>(variables, h, towers, options);
  }

  void average_and_apply(cuda_towers<Layout>& towers, const std::vector<T>& weights, const constants_type& constants,
                         stage_seconds& stages) {
    either([&](auto& r) { r.average_and_apply(towers, weights, constants, stages); });
  }
  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<T>& weights, const accumulation<T>& step,
                                 stage_seconds& stages) {
    return either([&](auto& r) { return r.screen_average(towers, weights, step, stages); });
  }
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const constants_type& constants, stage_seconds& stages) {
    either([&](auto& r) { r.apply_averaged(towers, scale, constants, stages); });
  }
  void parameter_set(std::size_t index, const T* values) {
    if (across_) across_->parameter_set(index, values);  // within one process, the owners read tower 0's replica
  }
  std::size_t state_slots() const { return within_ ? within_->state_slots() : across_->state_slots(); }
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    return within_ ? within_->state_bytes_per_tower(towers) : across_->state_bytes_per_tower(towers);
  }
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    return either([&](auto& r) { return r.state_on_host(slot, index); });
  }
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    either([&](auto& r) { r.set_state(slot, index, values); });
  }

 private:
  template <class F>
  decltype(auto) either(F&& f) {
    return within_ ? f(*within_) : f(*across_);
  }

  std::unique_ptr<sharded_device_reducer<Optim, Layout>> within_;
  std::unique_ptr<sharded_process_reducer<Optim, Layout>> across_;
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::cuda, reduce::sharded, Optim, Layout> {
  // Here, where the pair is chosen, so that this is the first message rather than a missing member.
  static_assert(std::is_same<typename Layout::value_type, master_type_t<typename Layout::value_type>>::value,
                "towerpipe: reduce::sharded with 16-bit GPU towers (mixed precision) is not supported yet; use "
                "reduce::device0, or reduce::sharded with exec::host");
  using type = detail::sharded_gpu_reducer<Optim, Layout>;
};

}  // namespace towerpipe
