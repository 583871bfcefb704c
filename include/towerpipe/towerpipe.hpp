#pragma once
// towerpipe — synchronous data-parallel training across towers. This umbrella header is the host-only
// library: it compiles with any C++17 compiler and pulls in no CUDA header.

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/config.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/shape.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/io/checkpoint.hpp"
#include "towerpipe/layout/batch.hpp"
#include "towerpipe/layout/flat.hpp"
#include "towerpipe/layout/per_variable.hpp"
#include "towerpipe/optim/adam.hpp"
#include "towerpipe/optim/adamw.hpp"
#include "towerpipe/optim/sgd.hpp"
#include "towerpipe/pipeline.hpp"
#include "towerpipe/reduce/canonical_order.hpp"
#include "towerpipe/reduce/host.hpp"
#include "towerpipe/split.hpp"
#include "towerpipe/stats.hpp"
#include "towerpipe/trace/timeline.hpp"
