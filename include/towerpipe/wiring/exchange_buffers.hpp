#pragma once
// The buffers of reduce::sharded across processes with GPU towers, laid out by plan/exchange_plan.hpp, in the master
// type, with their pointer tables; and the broadcast of the gathered parameters into the replicas (gathered_broadcast).
// Why: docs/design-notes.md#wiring-exchange_buffers

#include <cstddef>
#include <type_traits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/plan/copy_list.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/kernels/process_agents.hpp"

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

// After the gather, on tower 0's device: the gathered parameters (T) into every local tower's replica (Stored).
template <class Stored, class T, class Memory>
class gathered_broadcast {
 public:
  static constexpr bool mixed = !std::is_same<T, Stored>::value;

  template <class Towers, class CopyBuffer>
  gathered_broadcast(Towers& towers, const tower_copies<CopyBuffer>& copies, const T* gathered, const variable_set& variables,
                     const Memory& memory)
      : targets_(copies.replicas()), target_count_(copies.reached()) {
    const std::vector<std::size_t> starts = padded_flat_starts(variables);
    const Stored* source = nullptr;
    if constexpr (!mixed) {
      source = gathered;
    } else if (copies.reached() < static_cast<int>(copies.towers())) {
      narrowed_ = memory.template allocate<Stored>(starts.back(), 256);
      const std::vector<Stored*> whole = padded_flat_pointers(narrowed_.get(), variables);
      targets_.insert(targets_.end(), whole.begin(), whole.end());
      ++target_count_;
      source = narrowed_.get();
    }
    if (targets_.size() != static_cast<std::size_t>(target_count_) * variables.count())
      fail("gathered_broadcast: ", targets_.size(), " pointer-table entries for ", target_count_, " roles of ", variables.count(),
           " variables");
    for (std::size_t t = 0; t < copies.towers(); ++t) {  // one copy per variable into each copied tower's replica
      if (!copies.copied(t)) continue;
      for (std::size_t v = 0; v < variables.count(); ++v)
        copies_.push_back({towers.replica(t).data(v), towers.device(t), source + starts[v], towers.device(0), variables[v].size});
    }
  }

  // Pointer-table entries of the agent's targets, role after role.
  const std::vector<Stored*>& targets() const { return targets_; }
  int target_count() const { return target_count_; }
  // After the agent: into the copied towers' replicas.
  const copy_list<Stored>& copies() const { return copies_; }

 private:
  std::vector<Stored*> targets_;
  int target_count_;
  typename Memory::template owner<Stored> narrowed_;  // mixed precision with a copied tower
  copy_list<Stored> copies_;
};

}  // namespace detail
}  // namespace towerpipe
