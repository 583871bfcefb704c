#pragma once
// The simulated machine's shape (executor/simulated/machine.hpp) and what it counts. Plain C++.

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>

namespace towerpipe {
namespace sim {

struct machine_config {
  int devices = 1;
  std::set<std::pair<int, int>> peers;           // ordered (reader, owner) pairs that may have peer access
  std::set<std::pair<int, int>> native_atomics;  // pairs linked like NVLink (either order)
  std::uint64_t seed = 1;                        // the interleaving
};

// Work the executor was given, for the launch/copy budget of a step. launches: multi-tensor and
// screen launches that run something (an empty run launches nothing), find_first's scan; copies: every
// copy call that moves bytes (a batch counts once, as one cudaMemcpyBatchAsync; synchronous copies,
// pointer-table uploads and the screen's key read included); memsets: memset_async and fill_async
// that set bytes (the screen's reset included); records; waits (on an event never recorded too);
// host_syncs: synchronize(event|stream), synchronize_device, find_first.
struct op_counts {
  std::size_t launches = 0, copies = 0, memsets = 0, records = 0, waits = 0, host_syncs = 0;
};

}  // namespace sim
}  // namespace towerpipe
