#pragma once
// What reduce::automatic (reduce/choice/automatic.hpp) needs of device towers (exec::cuda,
// exec::simulated): the towers' devices and the links between them as the executor reports them, and the
// copy of the towers' gradients that pipeline_options::time_backends restores before each trial
// (reduce/choice/tuner.hpp). The choice itself is choose_backend's (reduce/choice/chooser.hpp).

#include <cstddef>
#include <memory>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/reduce/choice/chooser.hpp"
#include "towerpipe/reduce/choice/tuner.hpp"

namespace towerpipe {
namespace detail {

template <class Layout, class Executor>
struct automatic_space<device_towers<Layout, Executor>> {
  using towers_type = device_towers<Layout, Executor>;

  // A pair of towers' devices is linked where the reductions may reach one from the other in place
  // (peer access enabled, and pipeline_options::direct_device_access); NVLink where the executor reports
  // native peer atomics, which PCIe peers lack.
  static tower_topology describe(towers_type& towers) {
    tower_topology t;
    for (std::size_t i = 0; i < towers.towers(); ++i) t.tower_devices.push_back(towers.device(i));
    for (std::size_t a = 0; a < towers.towers(); ++a) {
      for (std::size_t b = 0; b < towers.towers(); ++b) {
        const int from = towers.device(a), to = towers.device(b);
        if (from == to || !towers.access().reaches(a, b) || t.links.count({from, to}) != 0) continue;
        t.links[{from, to}] = towers.executor().native_peer_atomics(from, to) ? peer_link::nvlink : peer_link::pcie;
      }
    }
    return t;
  }

  // Each tower's gradients copied on its own device, on its stream (after its backward pass), and back.
  class gradient_copy {
   public:
    gradient_copy(const variable_set& variables, towers_type& towers) : variables_(variables) {
      for (std::size_t t = 0; t < towers.towers(); ++t)
        saved_.push_back(
            std::make_unique<typename towers_type::device_buffer>(variables, towers.executor().device_memory(towers.device(t))));
    }
    void save(towers_type& towers) { copy(towers, true); }
    void restore(towers_type& towers) { copy(towers, false); }

   private:
    void copy(towers_type& towers, bool saving) {
      towers.synchronize_all();  // the last trial's reduction may still read or write the gradients
      const Executor& exec = towers.executor();
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        const typename Executor::device_guard on(exec, towers.device(t));
        for (std::size_t v = 0; v < variables_.count(); ++v) {
          auto* own = towers.gradients(t).data(v);
          auto* kept = saved_[t]->data(v);
          exec.copy_async(saving ? kept : own, saving ? own : kept, variables_[v].size * sizeof(*own), towers.stream(t));
        }
      }
      towers.synchronize_all();
    }

    const variable_set& variables_;
    std::vector<std::unique_ptr<typename towers_type::device_buffer>> saved_;
  };
};

}  // namespace detail
}  // namespace towerpipe
