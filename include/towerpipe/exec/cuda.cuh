#pragma once
// exec::cuda — towers on CUDA devices: the device towers (exec/device_towers.hpp, which says where each
// tower runs) driven by the CUDA executor (cuda/executor.cuh). The tower function enqueues its work on
// tower_context::stream(), a cudaStream_t.

#include "towerpipe/cuda/executor.cuh"
#include "towerpipe/exec/device_towers.hpp"

namespace towerpipe {
namespace exec {

using cuda = on_devices<detail::cuda_executor>;

}  // namespace exec
}  // namespace towerpipe
