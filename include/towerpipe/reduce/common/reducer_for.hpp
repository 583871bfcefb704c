#pragma once
// reducer_for<Exec, Reduce, Optim, Layout>::type — the class that averages the towers' gradients,
// applies the optimizer and hands the new parameters back to the towers, for one combination of
// execution space and reduction backend. Each backend header specialises it for the execution spaces
// it serves; any other combination stops compilation here with the list of those that exist.

#include "towerpipe/core/config.hpp"

namespace towerpipe {

template <class Exec, class Reduce, class Optim, class Layout>
struct reducer_for {
  static_assert(detail::dependent_false<Exec, Reduce>,
                "towerpipe: no reduction backend for this execution space. Valid pairs: "
                "(exec::host, reduce::host), (exec::host, reduce::sharded), (exec::host, reduce::automatic); with <towerpipe/cuda.cuh>: "
                "(exec::cuda, reduce::host), (exec::cuda, reduce::device0), (exec::cuda, reduce::p2p_tree), "
                "(exec::cuda, reduce::sharded), (exec::cuda, reduce::automatic)");
};

}  // namespace towerpipe
