#pragma once
// The reduction backends reduce::automatic chooses from, in the order ties are broken: device0 first (the
// fastest measured on one GPU), then p2p_tree, host, sharded. A new backend is its own header — its
// policy type with `traits` (reduce/common/backend_traits.hpp) and its reducer_for — and one line here.

#include <vector>

#include "towerpipe/reduce/common/backend_traits.hpp"
#include "towerpipe/reduce/device0/reducer.hpp"
#include "towerpipe/reduce/host/host_towers.hpp"
#include "towerpipe/reduce/host/device_towers.hpp"
#include "towerpipe/reduce/p2p_tree/reducer.hpp"
#include "towerpipe/reduce/sharded/device_towers.hpp"
#include "towerpipe/reduce/sharded/host_towers.hpp"

namespace towerpipe {
namespace detail {

template <class... Backends>
struct backend_list {
  static std::vector<backend_traits> traits() { return {Backends::traits...}; }
  template <class F>
  static void for_each(F&& f) {
    (f(Backends{}), ...);
  }
};

}  // namespace detail

using backends = detail::backend_list<reduce::device0, reduce::p2p_tree, reduce::host, reduce::sharded>;

inline std::vector<backend_traits> registered_backends() { return backends::traits(); }

// f(backend) for each backend of the list whose towers Exec's are (backend: its policy type, e.g.
// reduce::host{}), in the list's order: what a program offers as a --backend choice, say.
template <class Exec, class F>
void for_each_backend(F&& f) {
  backends::for_each([&](auto backend) {
    if constexpr (Exec::device_towers ? decltype(backend)::traits.device_towers : decltype(backend)::traits.host_towers) f(backend);
  });
}

}  // namespace towerpipe
