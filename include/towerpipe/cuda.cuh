#pragma once
// towerpipe with CUDA (compile with nvcc): everything of <towerpipe/towerpipe.hpp> — whose reductions
// reduce::device0, reduce::p2p_tree, reduce::sharded, reduce::host and reduce::automatic all take device
// towers — plus exec::cuda, towers on GPUs.

#include "towerpipe/towerpipe.hpp"

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/exec/cuda.cuh"
