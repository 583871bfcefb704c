#pragma once
// Kernel launches on the simulated devices: the checks every launch makes (its chunks, its stream's
// device, the calling thread's current device), the operands its agent declares
// (executor/simulated/operand_ranges.hpp), and the kernel itself, run on the host as one op with every
// access checked against the declaration. A launcher is made by the engine
// (executor/simulated/engine.hpp) for one launch, under its lock.

#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/access_history.hpp"
#include "towerpipe/executor/simulated/machine_config.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/op_queue.hpp"
#include "towerpipe/executor/simulated/operand_ranges.hpp"
#include "towerpipe/executor/simulated/ordering.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/plan/chunk_table.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

inline access_kind plain_kind(operand_access access) {
  return access == operand_access::read ? access_kind::read : access_kind::write;
}

class launcher {
 public:
  launcher(ordering& core, const memory_registry& memory, const std::set<std::pair<int, int>>& peers_enabled, int current_device,
           sim::op_counts& counts)
      : core_(core), memory_(memory), peers_enabled_(peers_enabled), current_device_(current_device), counts_(counts) {}

  // The multi-tensor kernel: for each chunk of the run, Policy::threads_per_block threads, thread k
  // calling process_chunk (kernels/agents.hpp) as the kernel does, with every access checked against
  // the agent's declared operands.
  template <class Policy, class Agent>
  void multi_tensor(const Agent& agent, const std::vector<tensor_chunk>& chunks, int table_device, std::size_t stream, chunk_group run) {
    const std::string name = make_message("launch of ", type_name<Agent>());
    const std::vector<tensor_chunk> launched = launch_run(name, chunks, run, table_device, stream, "chunk table");
    if (launched.empty()) return;
    const int device = core_.queues().stream(stream).device;
    operand_collector collect(memory_, peers_enabled_, device, launched.data(), launched.size(), Policy::vector_elements, name);
    agent.operands(collect);
    ++counts_.launches;
    enqueue_launch(stream, name, std::move(collect).finish(), [agent, launched] {
      for (const tensor_chunk& chunk : launched) {
        for (unsigned thread = 0; thread < unsigned(Policy::threads_per_block); ++thread)
          process_chunk<Policy::vector_elements>(agent, chunk, thread, unsigned(Policy::threads_per_block));
      }
    });
  }
  // The screen kernel (cuda/screen_kernel.cuh): per tile of the run, screen_lane for lanes 0..31 and
  // pairwise_lane_sum, as one warp does it; the tile's sum into tile_sums, the least non-finite key
  // lowered into *key. An empty run launches nothing.
  template <class Source, class T>
  void screen(const Source& source, const pointer_table<T>& averaged, const std::vector<tensor_chunk>& tiles, int screen_device,
              double* tile_sums, nonfinite_key* key, std::size_t stream, chunk_group run) {
    const std::string name = make_message("screen launch of ", type_name<Source>());
    const std::vector<tensor_chunk> launched = launch_run(name, tiles, run, screen_device, stream, "screen");
    if (launched.empty()) return;
    const int device = core_.queues().stream(stream).device;
    double* const sums = tile_sums + run.first;
    operand_collector collect(memory_, peers_enabled_, device, launched.data(), launched.size(), screen_group, name);
    source.operands(collect);
    collect(averaged, 0, 1, operand_access::write);
    collect(sums, launched.size() * sizeof(double), operand_access::write);
    collect(key, sizeof(nonfinite_key), operand_access::read_write);
    ++counts_.launches;
    enqueue_launch(stream, name, std::move(collect).finish(), [source, averaged, launched, sums, key] {
      for (std::size_t t = 0; t < launched.size(); ++t) {
        const screen_lane_result warp = screen_tile_as_a_warp(source, averaged, launched[t]);
        sums[t] = warp.sum_of_squares;
        if (warp.first_nonfinite != no_nonfinite) record_nonfinite(key, warp.first_nonfinite);
      }
    });
  }

 private:
  // The chunks [run.first, run.last) of a launch, after the checks every launch makes.
  std::vector<tensor_chunk> launch_run(const std::string& name, const std::vector<tensor_chunk>& chunks, chunk_group run,
                                       int table_device, std::size_t stream, const char* table) const {
    if (run.last == every_chunk.last) run.last = chunks.size();
    if (run.first > run.last || run.last > chunks.size())
      fail(name, ": chunks [", run.first, ", ", run.last, ") launched from a ", table, " of ", chunks.size());
    const stream_state& s = core_.queues().stream(stream);
    if (s.device != table_device) fail(name, ": a ", table, " of device ", table_device, " launched on ", stream_text(s));
    if (current_device_ != s.device)
      fail(name, ": launched on ", stream_text(s), " while device ", current_device_,
           " is current on the calling thread (a device_guard for the stream's device is missing)");
    return {chunks.begin() + static_cast<std::ptrdiff_t>(run.first), chunks.begin() + static_cast<std::ptrdiff_t>(run.last)};
  }

  template <class Body>
  void enqueue_launch(std::size_t stream, const std::string& name, launch_operands declared, Body body) {
    std::vector<op_access> accesses;
    double seconds = op_latency_seconds;
    for (const declared_range& r : declared.ranges) {
      accesses.push_back({r.holder, r.lo, r.hi, r.atomic ? access_kind::atomic : plain_kind(r.access)});
      seconds += static_cast<double>(r.hi - r.lo) / device_bytes_per_second;
    }
    const auto operands = std::make_shared<const launch_operands>(std::move(declared));
    const memory_registry* const memory = &memory_;  // the engine's: it outlives the ops it runs
    core_.enqueue(stream, name, std::move(accesses), [memory, operands, name, body] {
      operand_checker checker(*operands, *memory, name);
      {
        const scoped_access_recorder on(checker);
        body();
      }
      const std::string violation = checker.violation();
      if (!violation.empty()) fail(violation);
    }, seconds);
  }

  ordering& core_;
  const memory_registry& memory_;
  const std::set<std::pair<int, int>>& peers_enabled_;
  const int current_device_;  // the calling thread's
  sim::op_counts& counts_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
