#pragma once
// towerpipe with simulated devices: everything of <towerpipe/towerpipe.hpp> plus exec::simulated
// (exec/simulated.hpp), towers on devices simulated in host memory, for running and checking device
// trainers without a GPU. Plain C++.

#include "towerpipe/towerpipe.hpp"

#include "towerpipe/exec/simulated.hpp"
