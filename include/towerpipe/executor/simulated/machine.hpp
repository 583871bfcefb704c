#pragma once
// towerpipe::sim::machine — a simulated multi-GPU machine in plain C++: its devices, peer-access
// matrix and interleaving seed (machine_config), the work it was given (op_counts) and the violations
// it keeps. The executor that runs the library's device reducers on it is
// detail::simulated_executor (executor/simulated/executor.hpp); share one machine between executors with
// a shared_ptr.

#include "towerpipe/executor/simulated/engine.hpp"
#include "towerpipe/executor/simulated/machine_config.hpp"

namespace towerpipe {
namespace detail {
class simulated_executor;
}  // namespace detail

namespace sim {

class machine {
 public:
  explicit machine(machine_config config = {}) : engine_(config) {}
  machine(const machine&) = delete;
  machine& operator=(const machine&) = delete;

  const machine_config& config() const { return engine_.config(); }
  // Throws the first violation found and not thrown yet (one found while freeing memory), if any.
  void check() const { engine_.check(); }
  // Since construction or reset_counts().
  op_counts counts() const { return engine_.counts(); }
  void reset_counts() { engine_.reset_counts(); }

 private:
  friend class detail::simulated_executor;
  mutable detail::simulation::engine engine_;  // thread-safe: one lock inside
};

}  // namespace sim
}  // namespace towerpipe
