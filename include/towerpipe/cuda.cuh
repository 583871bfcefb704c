#pragma once
// towerpipe with CUDA (compile with nvcc): everything of <towerpipe/towerpipe.hpp> plus exec::cuda
// (towers on GPUs), the device reductions reduce::device0, reduce::p2p_tree and reduce::sharded, and
// reduce::automatic over them.

#include "towerpipe/towerpipe.hpp"

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/reduce/automatic_for_cuda.cuh"
#include "towerpipe/reduce/device0.cuh"
#include "towerpipe/reduce/host_for_cuda.cuh"
#include "towerpipe/reduce/p2p_tree.cuh"
#include "towerpipe/reduce/sharded/gpu_towers.cuh"
