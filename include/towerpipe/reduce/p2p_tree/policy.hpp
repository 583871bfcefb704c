#pragma once
// reduce::p2p_tree — the canonical tree run by the towers themselves (reduce/p2p_tree/reducer.hpp): the
// policy type, its launch shape, and what reduce::automatic knows of it.

#include <cstddef>
#include <map>
#include <vector>

#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"

namespace towerpipe {

namespace reduce {

// The canonical tree run by the towers themselves (reduce/p2p_tree/reducer.hpp); LaunchPolicy as for
// reduce::device0_with.
template <class LaunchPolicy = multi_tensor_policy>
struct p2p_tree_with {
  using policy_kind = detail::reduce_policy_kind;
  using launch_policy = LaunchPolicy;
  static constexpr const char* name = "p2p_tree";
  // 20N - 4R, as the top of reduce/p2p_tree/reducer.hpp counts it (Adam, full precision); one tower is device0's pass.
  static double one_device_bytes(std::size_t towers, std::size_t element_bytes) {
    if (towers < 2) return detail::fused_pass_bytes(towers, element_bytes);
    std::size_t replicas = 0;
    for (std::size_t stride = 1; stride < towers; stride *= 2) ++replicas;
    const double e = static_cast<double>(element_bytes);
    return (20 * static_cast<double>(towers) - 4 * static_cast<double>(replicas)) * e / 4 + 20 * (1 - e / 4);
  }
  // One element each way per edge of the canonical tree between towers on different devices (the partial
  // up, the parameters pulled down).
  static double busiest_link_elements(const std::vector<int>& devices) {
    std::map<int, double> load;
    const std::size_t towers = devices.size();
    for (std::size_t stride = 1; stride < towers; stride *= 2) {
      for (std::size_t i = 0; i + stride < towers; i += 2 * stride) {
        const int a = devices[i], b = devices[i + stride];
        if (a == b) continue;
        load[a] += 1;
        load[b] += 1;
      }
    }
    return detail::busiest(load);
  }
  static constexpr backend_traits traits{name, false, true, false, 0.0, &one_device_bytes, &busiest_link_elements, false,
                                         "the canonical tree run by the towers: it spreads the traffic over the links"};
};
using p2p_tree = p2p_tree_with<>;

}  // namespace reduce

}  // namespace towerpipe
