#pragma once
// An owner of reduce::sharded with device towers (a tower's device, or a process): its slice of the chunk table and, in
// compact storage from `Memory`, its slices of the optimizer state, average and (where needed) master. T: master type.
// Why: docs/design-notes.md#wiring-owner_wiring

#include <cstddef>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/copy_list.hpp"
#include "towerpipe/plan/owner_slices.hpp"

namespace towerpipe {
namespace detail {

// What an owner keeps besides its slice of the state.
struct owner_keeps {
  bool average = false;  // checked steps: its slice of the average
  bool master = false;   // across processes, or mixed precision: its own master copy of its slice
};

template <class T, class Memory>
class slice_owner {
 public:
  using storage = typename Memory::template owner<T>;

  slice_owner(owner_slice slice, const std::vector<tensor_chunk>& table, std::size_t variables, int slots, owner_keeps keeps,
              const Memory& memory)
      : slice_(std::move(slice)),
        chunks_(slice_.chunk_list(table)),
        slots_(slots),
        state_(allocate(memory, static_cast<std::size_t>(slots) * slice_.stored_elements)),  // zeros
        state_pointers_(slice_row_pointers(slice_, state_.get(), static_cast<std::size_t>(slots), variables)) {
    if (keeps.average) {
      average_ = allocate(memory, slice_.stored_elements);
      average_pointers_ = slice_pointers(slice_, average_.get(), variables);
    }
    if (keeps.master) {
      master_ = allocate(memory, slice_.stored_elements);
      master_pointers_ = slice_pointers(slice_, master_.get(), variables);
    }
  }

  const owner_slice& slice() const { return slice_; }
  // The slice's chunks, for the owner's launches.
  const std::vector<tensor_chunk>& chunks() const { return chunks_; }
  int slots() const { return slots_; }
  std::size_t state_elements() const { return static_cast<std::size_t>(slots_) * slice_.stored_elements; }

  // Pointer-table entries. The state: role = slot, indexed as whole variables.
  const std::vector<T*>& state() const { return state_pointers_; }
  // Checked steps: role 0, the slice of the average.
  const std::vector<T*>& average() const {
    if (!average_) fail("reduce::sharded: a checked step on a pipeline built for unchecked steps");
    return average_pointers_;
  }
  // Across processes or with mixed precision: role 0, the owner's master copy of its slice (across
  // processes the gather then sends it).
  const std::vector<T*>& master() const { return master_pointers_; }
  T* master_storage() const { return master_.get(); }
  T* slot_storage(std::size_t slot) const {
    if (slot >= static_cast<std::size_t>(slots_)) fail("reduce::sharded: state slot ", slot, " of ", slots_);
    return state_.get() + slot * slice_.stored_elements;
  }

 private:
  static storage allocate(const Memory& memory, std::size_t elements) { return memory.template allocate<T>(elements, 256); }

  owner_slice slice_;
  std::vector<tensor_chunk> chunks_;
  int slots_;
  storage state_, average_, master_;
  std::vector<T*> state_pointers_, average_pointers_, master_pointers_;
};

// One owner in one process (tower `owner`'s device): every tower's buffers as its pass uses them (role = tower).
template <class T, class Memory>
class slice_copies {
 public:
  template <class Towers>
  slice_copies(const owner_slice& slice, Towers& towers, std::size_t owner, const Memory& memory)
      : copied_(towers.access().copied_by(owner)), gradient_copies_(copied_.size()), replica_copies_(copied_.size()) {
    const int device = towers.device(owner);
    const std::size_t variables = towers.gradients(0).variables().count();
    for (std::size_t t = 0; t < copied_.size(); ++t) {
      if (!copied_[t]) {
        append_role(gradients_, towers.gradients(t));
        append_role(replicas_, towers.replica(t));
        continue;
      }
      gradient_copies_[t] = memory.template allocate<T>(slice.stored_elements, 256);
      replica_copies_[t] = memory.template allocate<T>(slice.stored_elements, 256);
      T* const gradients = gradient_copies_[t].get();
      T* const replica = replica_copies_[t].get();
      const std::vector<T*> gradient_role = slice_pointers(slice, gradients, variables);
      const std::vector<T*> replica_role = slice_pointers(slice, replica, variables);
      gradients_.insert(gradients_.end(), gradient_role.begin(), gradient_role.end());
      replicas_.insert(replicas_.end(), replica_role.begin(), replica_role.end());
      add_slice_copy(gradients_in_, slice, slice_copy::into_compact, towers.gradients(t), towers.device(t), gradients, device);
      if (t == 0)
        add_slice_copy(master_in_, slice, slice_copy::into_compact, towers.replica(0), towers.device(0), replica, device);
      add_slice_copy(replicas_out_, slice, slice_copy::out_of_compact, towers.replica(t), towers.device(t), replica, device);
    }
  }

  bool copied(std::size_t t) const { return copied_[t] != 0; }
  std::size_t towers() const { return copied_.size(); }
  const std::vector<T*>& gradients() const { return gradients_; }
  // Role 0 is the master the optimizer reads; every role is written with the new slice.
  const std::vector<T*>& replicas() const { return replicas_; }
  const copy_list<T>& gradients_in() const { return gradients_in_; }
  const copy_list<T>& master_in() const { return master_in_; }
  const copy_list<T>& replicas_out() const { return replicas_out_; }

 private:
  std::vector<char> copied_;
  std::vector<typename Memory::template owner<T>> gradient_copies_, replica_copies_;  // per tower; empty: used in place
  std::vector<T*> gradients_, replicas_;
  copy_list<T> gradients_in_, master_in_, replicas_out_;
};

}  // namespace detail
}  // namespace towerpipe
