#pragma once
// exec::cuda — towers on CUDA devices: the device towers (exec/device_towers.hpp) driven by the CUDA
// executor (cuda/executor.cuh). Tower i runs on pipeline_options::devices[i % size] (several towers
// may share a device) with its own stream, parameter replica and gradient buffers; the tower function
// enqueues its work on tower_context::stream(), a cudaStream_t.

#include "towerpipe/cuda/executor.cuh"
#include "towerpipe/exec/device_towers.hpp"

namespace towerpipe {
namespace exec {

using cuda = on_devices<detail::cuda_executor>;

}  // namespace exec
}  // namespace towerpipe
