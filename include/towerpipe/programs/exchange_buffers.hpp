#pragma once
// The buffers of reduce::sharded across processes with GPU towers (reduce/sharded/gpu_towers_across_processes.cuh),
// laid out by exchange_plan (programs/exchange_plan.hpp), allocated from `Memory` (cuda_device_memory on
// tower 0's device, host memory in the tests), with the pointer tables over them: the rows this process
// sends each owner, the rows it receives as an owner, the gathered parameters. And, after the gather,
// the copies into the replicas of the local towers tower 0's device does not reach.

#include <cstddef>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/programs/copy_list.hpp"
#include "towerpipe/programs/copy_wiring.hpp"
#include "towerpipe/programs/exchange_plan.hpp"
#include "towerpipe/programs/process_agents.hpp"

namespace towerpipe {
namespace detail {

template <class T, class Memory>
struct exchange_buffers {
  exchange_buffers(const exchange_plan& plan, const variable_set& variables, const Memory& memory)
      : send(memory.template allocate<T>(plan.send_elements(), 256)),
        received(memory.template allocate<T>(plan.receive_elements(), 256)),
        gathered(memory.template allocate<T>(plan.total(), 256)),
        received_rows(plan.received_row_pointers(received.get())),
        gathered_flat(padded_flat_pointers(gathered.get(), variables)) {
    for (int owner = 0; owner < plan.processes(); ++owner) send_rows.push_back(plan.send_row_pointers(owner, send.get()));
  }

  typename Memory::template owner<T> send, received, gathered;
  std::vector<std::vector<T*>> send_rows;  // per owner: role = row
  std::vector<T*> received_rows;           // role = global row
  std::vector<T*> gathered_flat;           // role 0: every variable, end to end, padded
};

// After the gather, on `device` (tower 0's): the new parameters into each tower `copies` copies, one
// copy per variable from the gathered buffer (the towers it reaches get them from copy_agent over
// copies.replicas()).
template <class T, class Towers, class CopyBuffer>
copy_list<T> gathered_into_copied_replicas(Towers& towers, const tower_copies<CopyBuffer>& copies, const T* gathered, int device,
                                           const variable_set& variables) {
  const std::vector<std::size_t> starts = padded_flat_starts(variables);
  copy_list<T> list;
  for (std::size_t t = 0; t < copies.towers(); ++t) {
    if (!copies.copied(t)) continue;
    for (std::size_t v = 0; v < variables.count(); ++v)
      list.push_back({towers.replica(t).data(v), towers.device(t), gathered + starts[v], device, variables[v].size});
  }
  return list;
}

}  // namespace detail
}  // namespace towerpipe
