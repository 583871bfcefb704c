#pragma once
// One owner of reduce::sharded with device towers on its device (a tower's device, or a process): owner_wiring's slice
// in device memory, with its stream, events, uploaded tables, tile screen and the state's and master's host copies.
// Why: docs/design-notes.md#reduce-sharded-device_owner

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/wiring/owner_wiring.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/reduce/common/device_state.hpp"

namespace towerpipe {
namespace detail {

// M: the master type, of the owner's state, average and master slice (any stored type: 16-bit towers are
// mixed precision, with the owners' storage in the master type).
template <class M, class Policy, class Executor>
class device_owner {
  // What reduce::sharded for device towers takes, in one process or several (both forms hold owners).
  static_assert(Policy::chunk_elements % screen_tile_elements == 0,
                "towerpipe: reduce::sharded needs chunks of whole screen tiles, so that each tile has one owner");

 public:
  using stream = typename Executor::stream;
  using event = typename Executor::event;

  device_owner(const Executor& exec, const variable_set& variables, owner_slice slice, const std::vector<tensor_chunk>& table, int slots,
               owner_keeps keeps, int device)
      : exec_(exec),
        device_(device),
        stream_(exec, device, "sharded owner"),
        start_(exec, device, true),
        end_(exec, device, true),
        parts_(std::move(slice), table, variables.count(), slots, keeps, exec.device_memory(device)),
        chunks_(exec, parts_.chunks(), device),
        state_(upload(parts_.state(), variables, "reduce::sharded: an owner's slice of the optimizer state")) {
    if (keeps.master)
      master_ = std::make_unique<typename Executor::template pointer_table<M>>(upload(parts_.master(), variables, "reduce::sharded: an owner's master slice"));
    if (keeps.average) {
      average_ = std::make_unique<typename Executor::template pointer_table<M>>(
          upload(parts_.average(), variables, "reduce::sharded: a slice of the checked average"));
      screen_ = std::make_unique<typename Executor::screen>(exec, make_chunk_table(parts_.slice().ranges, screen_tile_elements), device);
    }
  }

  int device() const { return device_; }
  // The slice, its chunks, the slot count and the master's storage.
  const slice_owner<M, device_memory_of<Executor>>& parts() const { return parts_; }
  const typename Executor::chunk_table& chunks() const { return chunks_; }
  const stream& owner_stream() const { return stream_; }
  const event& start() const { return start_; }
  const event& end() const { return end_; }
  std::size_t state_bytes() const { return parts_.state_elements() * sizeof(M); }

  pointer_table<M> state() const { return state_.view(); }
  pointer_table<M> master() const { return master_->view(); }
  // A checked step's slice of the average (role 0) and its screen.
  const typename Executor::template pointer_table<M>& average() const {
    parts_.average();  // fails on a pipeline built for unchecked steps
    return *average_;
  }
  const typename Executor::screen& screen() const {
    parts_.average();
    return *screen_;
  }

  // A table over the owner's chunks, its vector alignment for elements of type U checked first (U: the
  // master type, or the towers' stored type for tables over their buffers).
  template <class U>
  typename Executor::template pointer_table<U> upload(const std::vector<U*>& pointers, const variable_set& variables, const char* what) const {
    return vector_pointer_table<Policy>(exec_, pointers, static_cast<int>(variables.count()), parts_.chunks(), device_, what);
  }

  // On the owner's stream: a bucket's pass after the bucket's event on every (local) tower; what the towers
  // left after their whole gradients (its timing starts there), then `gradients_in`, the copies of the
  // towers' gradients the owner's device does not reach.
  template <class Towers, class Copies>
  void wait_for_part(Towers& towers, const step_part& part, const Copies& gradients_in) const {
    for (std::size_t t = 0; t < towers.towers(); ++t)
      exec_.wait(stream_, part.during_towers() ? towers.bucket_done(t, part.bucket) : towers.gradients_ready(t));
    if (part.during_towers()) return;
    exec_.record(start_, stream_);
    run_copies_async(exec_, gradients_in, stream_);
  }

  // Between steps, once the owner's stream is idle: variable `index`'s values (whole, on the host) into
  // the owner's parts of a slot of the state or of its master slice, and those parts back.
  void set_state(std::size_t slot, std::size_t index, const M* values) { copy(parts_.slot_storage(slot), index, values); }
  void set_master(std::size_t index, const M* values) { copy(parts_.master_storage(), index, values); }
  void state_to_host(std::size_t slot, std::size_t index, M* values) const { copy(parts_.slot_storage(slot), index, values); }
  void master_to_host(std::size_t index, M* values) const { copy(parts_.master_storage(), index, values); }
  // A slot's whole compact storage (the all-gather across processes sends it as it is).
  void slot_to_host(std::size_t slot, M* values) const {
    const M* storage = parts_.slot_storage(slot);
    const typename Executor::device_guard on(exec_, device_);
    exec_.synchronize(stream_);
    exec_.copy_to_host_now(values, storage, parts_.slice().stored_elements * sizeof(M));
  }

 private:
  // Variable `index`'s parts of `storage` from the host's whole `values`, or (`values` not const) to them.
  template <class Values>
  void copy(M* storage, std::size_t index, Values* values) const {
    const typename Executor::device_guard on(exec_, device_);
    exec_.synchronize(stream_);
    parts_.slice().for_each_stored_range_of(index, [&](const element_range& r, std::size_t offset) {
      const std::size_t bytes = (r.end - r.begin) * sizeof(M);
      if constexpr (std::is_const_v<Values>) exec_.copy_to_device_now(storage + offset, values + r.begin, bytes);
      else exec_.copy_to_host_now(values + r.begin, storage + offset, bytes);
    });
  }

  const Executor& exec_;
  int device_;
  stream stream_;
  event start_, end_;  // timing: from the last tower's gradients to the owner's last write
  slice_owner<M, device_memory_of<Executor>> parts_;
  typename Executor::chunk_table chunks_;
  typename Executor::template pointer_table<M> state_;                       // role = slot, indexed as whole variables
  std::unique_ptr<typename Executor::template pointer_table<M>> master_;    // across processes, and with mixed precision
  std::unique_ptr<typename Executor::template pointer_table<M>> average_;   // checked steps
  std::unique_ptr<typename Executor::screen> screen_;                      // checked steps: the slice's tiles
};

}  // namespace detail
}  // namespace towerpipe
