#pragma once
// What reduce::automatic (reduce/choice/automatic.hpp) needs of exec::host's towers: their topology (every
// tower on the host) and a copy of their gradients that pipeline_options::time_backends restores before
// each trial (reduce/choice/tuner.hpp).

#include <algorithm>
#include <cstddef>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/reduce/choice/chooser.hpp"
#include "towerpipe/reduce/choice/tuner.hpp"

namespace towerpipe {
namespace detail {

template <class Layout>
struct automatic_space<host_towers<Layout>> {
  static tower_topology describe(host_towers<Layout>& towers) {
    tower_topology t;
    t.tower_devices.assign(towers.towers(), host_device);
    return t;
  }
  class gradient_copy {
   public:
    gradient_copy(const variable_set& variables, host_towers<Layout>& towers)
        : variables_(variables), saved_(towers.towers(), std::vector<std::vector<typename Layout::value_type>>(variables.count())) {}
    void save(host_towers<Layout>& towers) {
      for (std::size_t t = 0; t < saved_.size(); ++t)
        for (std::size_t v = 0; v < variables_.count(); ++v) {
          const auto* data = towers.gradients(t).data(v);
          saved_[t][v].assign(data, data + variables_[v].size);
        }
    }
    void restore(host_towers<Layout>& towers) {
      for (std::size_t t = 0; t < saved_.size(); ++t)
        for (std::size_t v = 0; v < variables_.count(); ++v) std::copy(saved_[t][v].begin(), saved_[t][v].end(), towers.gradients(t).data(v));
    }

   private:
    const variable_set& variables_;
    std::vector<std::vector<std::vector<typename Layout::value_type>>> saved_;  // [tower][variable]
  };
};

}  // namespace detail
}  // namespace towerpipe
