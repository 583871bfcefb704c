#pragma once
// exec::simulated — towers on simulated devices: the device towers (exec/device_towers.hpp) driven by the
// simulated executor (executor/simulated/executor.hpp), in host memory, with plain C++. The library's
// device reducers run on it as they run on GPUs, and the executor checks what a GPU would expose:
// memory owned by devices and the peer access between them, streams and events as happens-before
// edges with work run in a seeded random legal order, conflicting accesses not ordered by them (a race
// detector across streams), host reads without a synchronisation, vector alignment, bounds.
//
// pipeline_options::simulation is the machine (sim::machine: devices, peer pairs, interleaving seed);
// unset, one device. A tower function runs on the host "as" its stream (exec/device_tower_context.hpp):
// it writes its gradients through the context (gradient(v) on the host, or write_gradient) and returns
// its loss.

#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/executor/simulated/executor.hpp"

namespace towerpipe {
namespace exec {

using simulated = on_devices<detail::simulated_executor>;

}  // namespace exec
}  // namespace towerpipe
