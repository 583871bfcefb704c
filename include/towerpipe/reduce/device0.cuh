#pragma once
// reduce::device0 — the parameter server on the first tower's device. One fused multi-tensor kernel per
// step reads every tower's gradient once (directly from other devices where peer access allows),
// averages in the canonical order, applies the optimizer with the state held on that device, and writes
// the new parameters into every tower's replica once. Bytes moved per parameter: 4N read + state
// (read and written) + 4N written.
//
// Without peer access to a tower's device, that tower's gradients are first copied to a staging buffer
// on the root device and its replica is written back from one (cudaMemcpyPeerAsync), with a one-time
// warning through the log sink.
//
// A checked step (programs/screen.hpp) runs the screen kernel into an average on the root device, then the
// same fused kernel with that average as its one "tower" and the step's scale as its weight.

#include <cuda_runtime.h>

#include <type_traits>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/peer_copies.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/programs/copy_wiring.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/reduce/whole_step.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class device0_reducer : public device_optimizer_state<Optim, Layout>,
                        public whole_step_as_one_part<device0_reducer<Optim, Layout, Policy>> {
 public:
  using stored_type = typename Layout::value_type;  // the towers' gradients and replicas
  using master_type = master_type_t<stored_type>;    // master, state, average
  static constexpr bool mixed = !std::is_same<stored_type, master_type>::value;
  using device_buffer = typename Layout::template buffer<cuda_device_memory>;
  using hyper_parameters = typename Optim::hyper_parameters;

  device0_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers)
      : device_optimizer_state<Optim, Layout>(variables, h, towers.device(0)),
        whole_step_as_one_part<device0_reducer>(variables.count()),
        root_(towers.device(0)),
        stream_(root_),
        start_(root_, true),
        end_(root_, true),
        chunk_list_(make_chunk_table(variables, Policy::chunk_elements)),
        chunks_(chunk_list_, root_),
        copies_(towers, 0, cuda_device_memory{root_}, true),
        gradients_(vector_pointer_table<Policy>(copies_.gradients(), static_cast<int>(variables.count()), chunk_list_, root_,
                                                "reduce::device0: the gradients it reads")),
        replicas_(vector_pointer_table<Policy>(copies_.replicas(), static_cast<int>(variables.count()), chunk_list_, root_,
                                               "reduce::device0: the replicas it writes")),
        average_(variables, root_),
        chunk_runs_(chunk_list_, variables.count()),
        tile_runs_(average_.screen.tiles(), variables.count()) {
    check_device_tower_count("reduce::device0", towers.towers());
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (copies_.copied(t)) {
        log_warning(make_message("reduce::device0: device ", root_, " does not reach device ", towers.device(t), " (tower ", t,
                                 ") directly; its gradients and parameters are copied"));
        reaches_every_tower_ = false;
      }
    }
  }

  // Gradient buckets (reduce/overlapped_reduction.hpp). A bucket's pass waits for the bucket's event on
  // every tower's stream and runs over the bucket's chunks on stream_, enqueued from the worker thread
  // while the towers go on; what the towers left waits for their whole gradients and finishes the step
  // (the broadcast, the screen's results). The gradients of a tower the root reaches only through copies
  // are copied whole after the towers, so then every bucket waits for them.
  bool overlaps_buckets() const { return reaches_every_tower_; }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<master_type>& weights,
                              const typename Optim::template step_constants<master_type>& constants, stage_seconds& stages) {
    if constexpr (mixed) {
      fail("reduce::device0: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    } else {
      const nvtx_range range("towerpipe reduce::device0 part");
      device_guard on(root_);
      wait_for_part(towers, part);
      for (const chunk_group& run : chunk_runs_.runs(part.variables))
        launch_fused_apply<Policy, Optim, master_type>(chunks_, stream_, static_cast<int>(towers.towers()), gradients_.const_view(),
                                                       weights, apply_for(towers, constants), run);
      if (!part.during_towers()) stages.reduce = broadcast_and_wait(towers, "device0 fused average + apply + broadcast");
    }
  }
  // After a failed step: the bucket passes enqueued on stream_ done, and the towers' next work after them.
  void join_parts(cuda_towers<Layout>& towers) {
    device_guard on(root_);
    end_.record(stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) end_.make_wait(towers.stream(t));
    end_.synchronize();
  }
  screen_partials begin_screen() {
    device_guard on(root_);
    average_.screen.reset(stream_);
    return {};
  }
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<master_type>& weights,
                   const accumulation<master_type>& step, screen_partials& partials, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::device0 screen part");
    device_guard on(root_);
    wait_for_part(towers, part);
    for (const chunk_group& run : tile_runs_.runs(part.variables))
      launch_tower_screen(average_.screen, stream_, static_cast<int>(towers.towers()), gradients_.const_view(), weights,
                          average_.table.view(), step, run);
    if (part.during_towers()) return;
    average_.screen.read_key(stream_);  // also when no tile was launched
    end_.record(stream_);
    end_.synchronize();  // the towers may write their gradients again once this returns
    stages.reduce = seconds_between(start_, end_);
    towers.device_span(0, start_, end_, "device0 average + screen", "reduce (GPU)");
    partials = average_.screen.results();
  }

  // Pass 2: the optimizer on scale * average, the new parameters into every replica.
  void apply_averaged(cuda_towers<Layout>& towers, master_type scale,
                      const typename Optim::template step_constants<master_type>& constants,
                      stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::device0 apply");
    device_guard on(root_);
    start_.record(stream_);
    launch_fused_apply_for<Policy, 1>(chunks_, stream_, 1, average_.table.const_view(), std::vector<master_type>{scale},
                                      apply_for(towers, constants));
    stages.reduce += broadcast_and_wait(towers, "device0 apply + broadcast");
  }

 private:
  // On stream_: after every tower's gradients, start_, then the copies of towers without peer access.
  void gather_gradients(cuda_towers<Layout>& towers) {
    for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(stream_);
    start_.record(stream_);  // the last tower's gradients are ready
    run_copies_async(copies_.gradients_in(), stream_);
  }

  // On stream_: a bucket's work after the bucket's event on every tower; what the towers left after
  // their whole gradients (gather_gradients).
  void wait_for_part(cuda_towers<Layout>& towers, const step_part& part) {
    if (!part.during_towers()) return gather_gradients(towers);
    for (std::size_t t = 0; t < towers.towers(); ++t) towers.bucket_done(t, part.bucket).make_wait(stream_);
  }

  optimizer_apply<Optim, master_type, stored_type> apply_for(cuda_towers<Layout>& towers,
                                                             const typename Optim::template step_constants<master_type>& constants) {
    return {replicas_.view(),  this->state_table(),  static_cast<int>(towers.towers()), this->state_slot_count(),
            constants,          this->master_table()};
  }

  // After the pass that wrote the replicas: copies to towers without peer access; the towers' next work
  // waits for their new parameters and the host for the last write. Returns start_ to the end.
  double broadcast_and_wait(cuda_towers<Layout>& towers, const char* span_name) {
    run_copies_async(copies_.replicas_out(), stream_);
    end_.record(stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) end_.make_wait(towers.stream(t));
    end_.synchronize();
    towers.device_span(0, start_, end_, span_name, "reduce (GPU)");
    return seconds_between(start_, end_);
  }

  int root_;
  cuda_stream stream_;
  cuda_event start_, end_;  // timing: stages.reduce
  std::vector<tensor_chunk> chunk_list_;
  device_chunk_table chunks_;
  tower_copies<device_buffer> copies_;  // the towers the root does not reach (programs/copy_wiring.hpp)
  device_pointer_table<stored_type> gradients_, replicas_;  // role = tower: in place, or the root's copy
  device_average<Layout> average_;  // checked steps
  chunks_by_variable chunk_runs_, tile_runs_;  // where a bucket's variables lie in chunks_ and in the screen's tiles
  bool reaches_every_tower_ = true;  // no tower's gradients copied
};

}  // namespace detail

namespace reduce {

// Parameter server on the first tower's device, fused (see the top of this header). LaunchPolicy (a
// multi_tensor_policy) sets the kernel's launch shape and vector width: reduce::device0_with<P>.
template <class LaunchPolicy = multi_tensor_policy>
struct device0_with {
  using policy_kind = detail::reduce_policy_kind;
  using launch_policy = LaunchPolicy;
  static constexpr const char* name = "device0";
};
using device0 = device0_with<>;

}  // namespace reduce

template <class Optim, class Layout, class LaunchPolicy>
struct reducer_for<exec::cuda, reduce::device0_with<LaunchPolicy>, Optim, Layout> {
  using type = detail::device0_reducer<Optim, Layout, LaunchPolicy>;
};

}  // namespace towerpipe
