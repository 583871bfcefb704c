#pragma once
// reduce::sharded — the optimizer sharded over the processes of a pipeline (pipeline_options::processes), or over
// the devices of one process's device towers; bitwise one process with the same total towers (docs/guide.md, invariant 2).
// Why: docs/design-notes.md#reduce-sharded-policy


#include <cstddef>
#include <map>
#include <vector>

#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"

namespace towerpipe {

namespace reduce {

// The optimizer sharded over processes or over the towers' devices (see the top of this header).
struct sharded {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "sharded";
  // Each tower owns 1/N: device d receives the contributions to its n_d/N and gathers the others'
  // slices into its n_d replicas, 2 n_d (N - n_d) / N each way.
  static double busiest_link_elements(const std::vector<int>& devices) {
    const double n = static_cast<double>(devices.size());
    std::map<int, double> load;
    for (const auto& [device, towers] : detail::towers_per_device(devices)) {
      const double own = static_cast<double>(towers);
      load[device] = 2 * own * (n - own) / n;
    }
    return detail::busiest(load);
  }
  // On one device the owners together make device0's pass (fused_pass_bytes).
  static constexpr backend_traits traits{
      name, true, true, true, 1.5, &detail::fused_pass_bytes, &busiest_link_elements, false,
      "its slices copied in one process (1.5-5.1x reduce::host's time; across processes the only backend)"};
};

}  // namespace reduce

}  // namespace towerpipe
