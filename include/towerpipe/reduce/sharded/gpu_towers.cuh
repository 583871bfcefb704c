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
// Mixed precision (bf16/fp16 towers: layout::flat<bfloat16>, layout::per_variable<float16>, ...): as
// device0, every step is a checked one and the master is fp32 of its own — here each owner keeps its
// slice of it, beside its fp32 slice of the state and of the average. The screen widens the towers'
// 16-bit gradients into the owner's fp32 average; the apply reads and writes the owner's master slice
// and writes it rounded to nearest even into every tower's replica (optimizer_apply with a master
// table), so the master and the replicas are bitwise the host's mixed pipeline's. parameter_set sets
// every owner's part of the master, master_on_host gathers the owners' parts.
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
// and its new slice of the parameters out (16-bit values with mixed precision), with a one-time warning
// through the log sink.
//
// Gradient buckets (reduce/overlapped_reduction.hpp): each owner runs its pass over the chunks of a
// bucket that lie in its slice as soon as every tower has marked the bucket, while the towers go on;
// it writes every replica's elements of that bucket only, which no tower reads any more this step.
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
#include "towerpipe/cuda/peer_copies.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/owner_slices.hpp"
#include "towerpipe/programs/owner_wiring.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/reduce/whole_step.hpp"
#include "towerpipe/reduce/sharded/gpu_owner.cuh"
#include "towerpipe/reduce/sharded/host_towers.hpp"
#include "towerpipe/reduce/sharded/gpu_towers_across_processes.cuh"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class sharded_device_reducer : public whole_step_as_one_part<sharded_device_reducer<Optim, Layout, Policy>> {
 public:
  using stored_type = typename Layout::value_type;  // the towers' gradients and replicas
  using T = master_type_t<stored_type>;              // master, state, average, weights
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using step_constants = typename Optim::template step_constants<T>;

  sharded_device_reducer(const variable_set& variables, const typename Optim::hyper_parameters& h, cuda_towers<Layout>& towers,
                         const pipeline_options& options)
      : whole_step_as_one_part<sharded_device_reducer>(variables.count()),
        slots_(Optim::state_slots(h)),
        host_mirror_(variables),
        master_mirror_(variables_if(mixed, variables)) {
    const std::size_t n = towers.towers();
    check_device_tower_count("reduce::sharded", n);
    const std::vector<tensor_chunk> table = make_chunk_table(variables, Policy::chunk_elements);
    const owner_keeps keeps{takes_checked_steps(options, mixed), mixed};
    std::vector<owner_slice> slices = cut_into_slices(table, n);
    for (std::size_t k = 0; k < n; ++k) {
      if (!slices[k].empty()) owners_.push_back(std::make_unique<owner>(variables, table, std::move(slices[k]), k, towers, slots_, keeps));
    }
    for (const auto& o : owners_) {
      for (std::size_t t = 0; t < n; ++t) reaches_every_tower_ = reaches_every_tower_ && !o->copies.copied(t);
    }
  }

  // Gradient buckets (reduce/overlapped_reduction.hpp): each owner's pass over the bucket's chunks in its
  // slice, on the owner's stream after the bucket's event on every tower, enqueued from the worker
  // thread while the towers go on; what the towers left waits for their whole gradients and finishes
  // the step. Off where an owner copies its slice of some tower's buffers (no peer access): the copies
  // are of the whole slice, after the towers.
  bool overlaps_buckets() const { return reaches_every_tower_; }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                              const step_constants& constants, stage_seconds& stages) {
    if constexpr (mixed) {
      fail("reduce::sharded: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    } else {
      const nvtx_range range("towerpipe reduce::sharded part");
      for (auto& o : owners_) {
        device_guard on(o->device());
        wait_for_part(*o, towers, part);
        if (!part.during_towers()) run_copies_async(o->copies.master_in(), o->stream());
        for (const chunk_group& run : o->chunk_runs.runs(part.variables))
          launch_fused_apply<Policy, Optim, T>(o->chunks(), o->stream(), static_cast<int>(towers.towers()), o->gradients.const_view(),
                                               weights, apply_for(*o, towers, constants), run);
        if (!part.during_towers()) run_copies_async(o->copies.replicas_out(), o->stream());
      }
      if (part.during_towers()) return;
      order_towers_after_owners(towers);
      stages.reduce = wait_for_owners(towers, "sharded average + apply + broadcast");
    }
  }
  // After a failed step: the bucket passes enqueued on the owners' streams done, and the towers' next
  // work after them.
  void join_parts(cuda_towers<Layout>& towers) {
    order_towers_after_owners(towers);
    for (auto& o : owners_) o->end().synchronize();
  }
  screen_partials begin_screen() {
    for (auto& o : owners_) {
      device_guard on(o->device());
      o->screen().reset(o->stream());
    }
    return {};
  }
  // A checked step's part: each owner's slice of the bucket's average and its screen.
  // With mixed precision the screen widens the 16-bit gradients into the fp32 average.
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights, const accumulation<T>& step,
                   screen_partials& partials, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded screen part");
    for (auto& o : owners_) {
      device_guard on(o->device());
      wait_for_part(*o, towers, part);
      for (const chunk_group& tiles : o->tile_runs.runs(part.variables))
        launch_tower_screen(o->screen(), o->stream(), static_cast<int>(towers.towers()), o->gradients.const_view(), weights,
                            o->average().view(), step, tiles);
      if (part.during_towers()) continue;
      o->screen().read_key(o->stream());  // also when no tile was launched
      o->end().record(o->stream());
    }
    if (part.during_towers()) return;
    // The towers may write their gradients again once every owner has read them.
    stages.reduce = wait_for_owners(towers, "sharded average + screen");
    partials = {};
    for (auto& o : owners_) {
      const screen_partials mine = o->screen().results();
      partials.tile_sums.insert(partials.tile_sums.end(), mine.tile_sums.begin(), mine.tile_sums.end());
      partials.first_nonfinite = std::min(partials.first_nonfinite, mine.first_nonfinite);
    }
  }

  // Pass 2: the optimizer on scale * each owner's slice of the average, the new slices into every replica
  // (with mixed precision: into the owner's master slice, and rounded into every replica).
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const step_constants& constants, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded apply");
    for (auto& o : owners_) {
      device_guard on(o->device());
      o->start().record(o->stream());
      if (!mixed) run_copies_async(o->copies.master_in(), o->stream());  // mixed: the owner's master slice is its own
      launch_fused_apply_for<Policy, 1>(o->chunks(), o->stream(), 1, o->average().const_view(), std::vector<T>{scale},
                                        apply_for(*o, towers, constants));
      run_copies_async(o->copies.replicas_out(), o->stream());
    }
    order_towers_after_owners(towers);
    stages.reduce += wait_for_owners(towers, "sharded apply + broadcast");
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }

  // Bytes of optimizer state on each tower's device: the owner's slice of every slot.
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    std::vector<std::size_t> bytes(towers, 0);
    for (const auto& o : owners_) bytes[o->tower] = o->state_bytes();
    return bytes;
  }

  // Between steps: the slot's values of one variable, gathered from the owners that hold parts of it.
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    const tensor_view<T> target = host_mirror_.view(index);
    for (const auto& o : owners_) o->state_to_host(slot, index, target.data());
    return target;
  }

  void set_state(std::size_t slot, std::size_t index, const T* values) {
    for (auto& o : owners_) o->set_state(slot, index, values);
  }

  // Mixed precision: every owner's part of the fp32 master (without, the master is tower 0's replica,
  // which the towers set). Between steps.
  void parameter_set(std::size_t index, const T* values) {
    if constexpr (mixed) {
      for (auto& o : owners_) o->set_master(index, values);
    }
  }
  // Mixed precision: the fp32 master of one variable, gathered from the owners' parts (between steps).
  tensor_view<const T> master_on_host(std::size_t index) {
    if (!mixed) fail("reduce::sharded: the master copy is tower 0's replica (no mixed precision)");
    const tensor_view<T> target = master_mirror_.view(index);
    for (const auto& o : owners_) o->master_to_host(index, target.data());
    return target;
  }

 private:
  // One owner: tower `tower`'s device (gpu_owner: its slice, its slice of the state), and every tower's
  // buffers as its pass uses them (programs/owner_wiring.hpp slice_copies: in place where its device
  // reaches the tower, else compact copies of the slice, copied in and out around the pass).
  struct owner : gpu_owner<T, Policy> {
    owner(const variable_set& variables, const std::vector<tensor_chunk>& table, owner_slice owned, std::size_t k,
          cuda_towers<Layout>& towers, int slots, owner_keeps keeps)
        : gpu_owner<T, Policy>(variables, std::move(owned), table, slots, keeps, towers.device(k)),
          tower(k),
          copies(this->slice(), towers, k, cuda_device_memory{towers.device(k)}),
          gradients(this->upload(copies.gradients(), variables, "reduce::sharded: the gradients an owner reads")),
          replicas(this->upload(copies.replicas(), variables, "reduce::sharded: the replicas an owner writes")),
          chunk_runs(this->chunk_list(), variables.count()),
          tile_runs(keeps.average ? this->screen().tiles() : std::vector<tensor_chunk>{}, variables.count()) {
      for (std::size_t t = 0; t < copies.towers(); ++t) {
        if (copies.copied(t))
          log_warning(make_message("reduce::sharded: owner ", k, " (device ", this->device(), ") does not reach tower ", t, " (device ",
                                   towers.device(t), ") directly; its slice of that tower's buffers is copied"));
      }
    }

    std::size_t tower;
    slice_copies<stored_type, cuda_device_memory> copies;
    device_pointer_table<stored_type> gradients;  // role = tower
    device_pointer_table<stored_type> replicas;   // role = tower; without mixed precision replica 0 is the master every owner reads
    chunks_by_variable chunk_runs, tile_runs;     // where a part's variables lie in its chunks and its screen's tiles
  };

  // The owner's optimizer: its slice of the state; the master replica 0 (read, and written with every
  // replica), or with mixed precision its own master slice (read and written; every replica gets it rounded).
  optimizer_apply<Optim, T, stored_type> apply_for(owner& o, cuda_towers<Layout>& towers, const step_constants& constants) {
    return {o.replicas.view(), o.state(), static_cast<int>(towers.towers()), slots_, constants, mixed ? o.master() : pointer_table<T>{}};
  }

  // Every tower's next work waits for every owner's writes (and reads of its gradients).
  void order_towers_after_owners(cuda_towers<Layout>& towers) {
    for (auto& o : owners_) o->end().record(o->stream());
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      for (auto& o : owners_) o->end().make_wait(towers.stream(t));
    }
  }

  // On the owner's stream: a bucket's pass after the bucket's event on every tower; what the towers left
  // after their whole gradients (its timing starts there), copied in where the owner does not reach them.
  static void wait_for_part(owner& o, cuda_towers<Layout>& towers, const step_part& part) {
    if (part.during_towers()) {
      for (std::size_t t = 0; t < towers.towers(); ++t) towers.bucket_done(t, part.bucket).make_wait(o.stream());
      return;
    }
    o.wait_for_gradients(towers);
    run_copies_async(o.copies.gradients_in(), o.stream());
  }

  // The host waits for every owner's end event; each owner's span goes on the timeline. Returns the
  // slowest owner's seconds.
  double wait_for_owners(cuda_towers<Layout>& towers, const char* span_name) {
    double slowest = 0.0;
    for (auto& o : owners_) {
      o->end().synchronize();
      slowest = std::max(slowest, seconds_between(o->start(), o->end()));
      towers.device_span(o->tower, o->start(), o->end(), span_name, "reduce (GPU) owner ", o->tower);
    }
    return slowest;
  }

  int slots_;
  typename Layout::template buffer<host_memory, T> host_mirror_, master_mirror_;  // master_mirror_: mixed precision
  std::vector<std::unique_ptr<owner>> owners_;  // one per tower with a non-empty slice
  bool reaches_every_tower_ = true;             // no owner copies a tower's slice (overlaps_buckets)
};

// reduce::sharded for GPU towers: over the towers' devices in this process, or, given a process group
// (even of one process), across its processes. The choice is made at run time, so that a pipeline's
// type does not depend on how it is launched.
template <class Optim, class Layout>
class sharded_gpu_reducer {
 public:
  using stored_type = typename Layout::value_type;
  using T = master_type_t<stored_type>;
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
  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<T>& weights,
                                 const accumulation<T>& step, stage_seconds& stages) {
    return either([&](auto& r) { return r.screen_average(towers, weights, step, stages); });
  }
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const constants_type& constants, stage_seconds& stages) {
    either([&](auto& r) { r.apply_averaged(towers, scale, constants, stages); });
  }
  // Gradient buckets: the form chosen's (each says what goes during the towers).
  bool overlaps_buckets() const { return within_ ? within_->overlaps_buckets() : across_->overlaps_buckets(); }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                              const constants_type& constants, stage_seconds& stages) {
    either([&](auto& r) { r.average_and_apply_part(towers, part, weights, constants, stages); });
  }
  screen_partials begin_screen() {
    return either([&](auto& r) { return r.begin_screen(); });
  }
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                   const accumulation<T>& step, screen_partials& partials, stage_seconds& stages) {
    either([&](auto& r) { r.screen_part(towers, part, weights, step, partials, stages); });
  }
  void join_parts(cuda_towers<Layout>& towers) {
    either([&](auto& r) { r.join_parts(towers); });
  }
  // Within one process without mixed precision nothing: the owners read tower 0's replica.
  void parameter_set(std::size_t index, const T* values) {
    either([&](auto& r) { r.parameter_set(index, values); });
  }
  tensor_view<const T> master_on_host(std::size_t index) {
    return either([&](auto& r) { return r.master_on_host(index); });
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
  using type = detail::sharded_gpu_reducer<Optim, Layout>;
};

}  // namespace towerpipe
