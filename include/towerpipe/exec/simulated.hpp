#pragma once
// exec::simulated — device towers (exec/device_towers.hpp) on simulated devices in host memory: the device reducers run
// as on GPUs while the executor checks ownership, peer access, stream/event ordering (a race detector), alignment and bounds.
// Why: docs/design-notes.md#exec-simulated

#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/executor/simulated/executor.hpp"

namespace towerpipe {
namespace exec {

using simulated = on_devices<detail::simulated_executor>;

}  // namespace exec
}  // namespace towerpipe
