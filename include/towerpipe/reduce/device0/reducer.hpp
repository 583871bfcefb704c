#pragma once
// reduce::device0 — the parameter server on the first tower's device: one fused multi-tensor kernel a step reads every
// tower's gradient once, averages in the canonical order, applies the optimizer and writes every replica once.
// Why: docs/design-notes.md#reduce-device0-reducer

#include <cstddef>
#include <map>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/device_state.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Executor, class Policy>
class device0_reducer : public device_optimizer_state<Optim, Layout, Executor> {
 public:
  using towers_type = device_towers<Layout, Executor>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' gradients and replicas
  using master_type = typename precision<Layout>::master_type;           // master, state, average
  static constexpr bool mixed = precision<Layout>::mixed;
  using device_buffer = typename towers_type::device_buffer;
  static constexpr reducer_capabilities capabilities{};

  explicit device0_reducer(const reducer_setup<towers_type, Optim>& setup) : device0_reducer(setup, setup.towers.executor()) {}

  backend_choice choice() const { return named_by_type("device0"); }
  bool buckets_during_towers() const { return reaches_every_tower_; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (!work_.checked) return;
    const typename Executor::device_guard on(exec_, root_);
    average_.screen.reset(stream_);
  }
  // On the root's stream after the part's gradients: a checked step's screen of the part's tiles, or the
  // fused pass over its chunks.
  void reduce_part(towers_type& towers, const step_part& part) {
    const typename Executor::range range(exec_, "towerpipe reduce::device0 part");
    const typename Executor::device_guard on(exec_, root_);
    wait_for_part(towers, part);
    if (work_.checked) {
      for (const chunk_group& run : tile_runs_.runs(part.variables))
        launch_tower_screen(average_.screen, stream_, static_cast<int>(towers.towers()), gradients_.const_view(), work_.weights,
                            average_.table.view(), work_.window, run);
    } else if constexpr (!mixed) {
      for (const chunk_group& run : chunk_runs_.runs(part.variables))
        launch_fused_apply<Policy, Optim, master_type>(chunks_, stream_, static_cast<int>(towers.towers()), gradients_.const_view(), work_.weights,
                                             apply_for(towers), run);
    }
  }
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    const typename Executor::device_guard on(exec_, root_);
    if (!work_.checked) {
      stages.reduce = broadcast_and_wait(towers, "device0 fused average + apply + broadcast");
      return {};
    }
    average_.screen.read_key(stream_);  // also when no tile was launched
    exec_.record(end_, stream_);
    exec_.synchronize(end_);  // the towers may write their gradients again once this returns
    stages.reduce = exec_.seconds_between(start_, end_);
    towers.device_span(0, start_, end_, "device0 average + screen", "reduce (GPU)");
    return average_.screen.results();
  }
  // Pass 2: the optimizer on scale * average, the new parameters into every replica.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::device0 apply");
    const typename Executor::device_guard on(exec_, root_);
    exec_.record(start_, stream_);
    launch_fused_apply_for<Policy, 1>(chunks_, stream_, 1, average_.table.const_view(), std::vector<master_type>{scale}, apply_for(towers));
    stages.reduce += broadcast_and_wait(towers, "device0 apply + broadcast");
  }
  // After a failed step, and after every pass that wrote the replicas: the work enqueued on the root's stream
  // done, and the towers' next work after it.
  void abandon(towers_type& towers) {
    const typename Executor::device_guard on(exec_, root_);
    exec_.record(end_, stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) exec_.wait(towers.stream(t), end_);
    exec_.synchronize(end_);
  }

 private:
  device0_reducer(const reducer_setup<towers_type, Optim>& setup, const Executor& exec)
      : device_optimizer_state<Optim, Layout, Executor>(setup.variables, setup.hyper, setup.towers),
        exec_(exec),
        root_(setup.towers.device(0)),
        stream_(exec, root_, "device0 root"),
        start_(exec, root_, true),
        end_(exec, root_, true),
        chunk_list_(make_chunk_table(setup.variables, Policy::chunk_elements)),
        chunks_(exec, chunk_list_, root_),
        copies_(setup.towers, 0, exec.device_memory(root_), true),
        gradients_(vector_pointer_table<Policy>(exec, copies_.gradients(), count(setup), chunk_list_, root_,
                                                "reduce::device0: the gradients it reads")),
        replicas_(vector_pointer_table<Policy>(exec, copies_.replicas(), count(setup), chunk_list_, root_,
                                               "reduce::device0: the replicas it writes")),
        average_(exec, setup.variables, root_),
        chunk_runs_(chunk_list_, setup.variables.count()),
        tile_runs_(average_.screen.tiles(), setup.variables.count()) {
    check_device_tower_count("reduce::device0", setup.towers.towers());
    for (std::size_t t = 0; t < setup.towers.towers(); ++t) {
      if (!copies_.copied(t)) continue;
      log_warning(make_message("reduce::device0: device ", root_, " does not reach device ", setup.towers.device(t), " (tower ", t,
                               ") directly; its gradients and parameters are copied"));
      reaches_every_tower_ = false;
    }
  }
  static int count(const reducer_setup<towers_type, Optim>& setup) { return static_cast<int>(setup.variables.count()); }

  // On the root's stream: a bucket's work after the bucket's event on every tower; what the towers left
  // after their whole gradients, then start_, then the copies of towers without peer access.
  void wait_for_part(towers_type& towers, const step_part& part) {
    for (std::size_t t = 0; t < towers.towers(); ++t)
      exec_.wait(stream_, part.during_towers() ? towers.bucket_done(t, part.bucket) : towers.gradients_ready(t));
    if (part.during_towers()) return;
    exec_.record(start_, stream_);  // the last tower's gradients are ready
    run_copies_async(exec_, copies_.gradients_in(), stream_);
  }

  optimizer_apply<Optim, master_type, stored_type> apply_for(towers_type& towers) const {
    return {replicas_.view(), this->state_table(), static_cast<int>(towers.towers()), this->state_slot_count(), work_.constants,
            this->master_table()};
  }

  // After the pass that wrote the replicas: copies to towers without peer access; the towers' next work
  // waits for their new parameters and the host for the last write. Returns start_ to the end.
  double broadcast_and_wait(towers_type& towers, const char* span_name) {
    run_copies_async(exec_, copies_.replicas_out(), stream_);
    abandon(towers);
    towers.device_span(0, start_, end_, span_name, "reduce (GPU)");
    return exec_.seconds_between(start_, end_);
  }

  const Executor& exec_;
  int root_;
  typename Executor::stream stream_;
  typename Executor::event start_, end_;  // timing: stages.reduce
  std::vector<tensor_chunk> chunk_list_;
  typename Executor::chunk_table chunks_;
  tower_copies<device_buffer> copies_;  // the towers the root does not reach (wiring/copy_wiring.hpp)
  typename Executor::template pointer_table<stored_type> gradients_, replicas_;  // role = tower: in place, or the root's copy
  device_average<Layout, Executor> average_;   // checked steps
  chunks_by_variable chunk_runs_, tile_runs_;  // where a bucket's variables lie in chunks_ and in the screen's tiles
  bool reaches_every_tower_ = true;            // no tower's gradients copied
  step_work<master_type, Optim> work_;
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
  // Every tower's gradients read and every replica written once by tower 0's device.
  static double one_device_bytes(std::size_t towers, std::size_t element_bytes) { return detail::fused_pass_bytes(towers, element_bytes); }
  // Tower 0's device takes every other device's gradients and sends back their replicas: N - n_0 on its
  // link, n_d on device d's.
  static double busiest_link_elements(const std::vector<int>& devices) {
    std::map<int, double> load;
    for (const auto& [device, towers] : detail::towers_per_device(devices))
      load[device] = device == devices[0] ? static_cast<double>(devices.size() - towers) : static_cast<double>(towers);
    return detail::busiest(load);
  }
  static constexpr backend_traits traits{
      name, false, true, false, 0.0, &one_device_bytes, &busiest_link_elements, false,
      "each gradient read once, each replica written once; p2p_tree took 1.03x/1.42x/1.70x its time at 2/4/8 towers on one H200"};
};
using device0 = device0_with<>;

}  // namespace reduce

template <class Optim, class Layout, class Executor, class LaunchPolicy>
struct reducer_for<exec::on_devices<Executor>, reduce::device0_with<LaunchPolicy>, Optim, Layout> {
  using type = detail::device0_reducer<Optim, Layout, Executor, LaunchPolicy>;
};

}  // namespace towerpipe
