#pragma once
// A device tower's input staging: each batch's shard is packed into pinned host memory and copied to the
// tower's device on a copy stream of its own, into one of two slots, so that staging the next batch
// overlaps this step's compute. Events order the slots: a slot is refilled only after the tower's last
// read of it, and the tower reads it only after its copy landed.

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "towerpipe/data/batch.hpp"

namespace towerpipe {
namespace detail {

template <class Executor>
class shard_stager {
 public:
  static constexpr int slots = 2;
  using stream = typename Executor::stream;
  using event = typename Executor::event;

  // `timed`: record each copy's start and end (for a timeline).
  shard_stager(const Executor& exec, int device, bool timed)
      : exec_(exec),
        device_(device),
        copy_stream_(exec, device, "tower copy"),
        staged_{event(exec, device), event(exec, device)},
        slot_free_{event(exec, device), event(exec, device)} {
    for (int s = 0; timed && s < slots; ++s) {
      copy_start_.emplace_back(exec, device, true);
      copy_end_.emplace_back(exec, device, true);
    }
  }

  // Copies `part` into staging slot `slot` and returns the batch that views it on the device. Row-major
  // inputs stay row-major; column-major ones become column-major with the shard's example count as
  // leading dimension. `tower_stream` is the stream that reads the slot (waited for before a buffer grows).
  towerpipe::batch stage(int slot, const towerpipe::batch& part, const stream& tower_stream) {
    const typename Executor::device_guard on(exec_, device_);
    const typename Executor::range range(exec_, "towerpipe stage shard");
    // The last copy out of this slot's pinned memory must be done before the host overwrites it, and
    // the tower that last read this slot's device memory must be done before the copy lands.
    exec_.synchronize(staged_[slot]);
    std::vector<buffer>& buffers = buffers_[slot];
    buffers.resize(part.inputs().size());
    for (std::size_t i = 0; i < part.inputs().size(); ++i) {
      const batch_input& input = part.inputs()[i];
      buffer& b = buffers[i];
      if (input.bytes() > b.capacity) {
        exec_.synchronize(copy_stream_);
        exec_.synchronize(tower_stream);
        b.host = exec_.pinned_memory().template allocate<char>(input.bytes());
        b.device = exec_.device_memory(device_).template allocate<char>(input.bytes(), 256);
        b.capacity = input.bytes();
      }
      exec_.host_writes(b.host.get(), input.bytes());
      input.pack_into(b.host.get());
    }
    // The copies, back to back once everything is packed.
    exec_.wait(copy_stream_, slot_free_[slot]);
    if (!copy_start_.empty()) exec_.record(copy_start_[slot], copy_stream_);
    towerpipe::batch on_device;
    for (std::size_t i = 0; i < part.inputs().size(); ++i) {
      const batch_input& input = part.inputs()[i];
      exec_.copy_async(buffers[i].device.get(), buffers[i].host.get(), input.bytes(), copy_stream_);
      on_device.add(input.packed_at(buffers[i].device.get()));
    }
    if (!copy_end_.empty()) exec_.record(copy_end_[slot], copy_stream_);
    exec_.record(staged_[slot], copy_stream_);
    return on_device;
  }

  // Work on `s` after this reads slot `slot`'s copy.
  void wait_for_copy(int slot, const stream& s) const { exec_.wait(s, staged_[slot]); }
  // The slot may be refilled once `s`'s work so far is done.
  void release(int slot, const stream& s) const { exec_.record(slot_free_[slot], s); }

  const stream& copy_stream() const { return copy_stream_; }
  // Timing events of slot `slot`'s last copy; only when constructed `timed`.
  const event& copy_start(int slot) const { return copy_start_[static_cast<std::size_t>(slot)]; }
  const event& copy_end(int slot) const { return copy_end_[static_cast<std::size_t>(slot)]; }

 private:
  // One input's staging area in one slot: pinned host bytes and device bytes, grown on demand.
  struct buffer {
    typename decltype(std::declval<const Executor&>().pinned_memory())::template owner<char> host;
    typename decltype(std::declval<const Executor&>().device_memory(0))::template owner<char> device;
    std::size_t capacity = 0;
  };

  const Executor& exec_;
  int device_;
  stream copy_stream_;
  std::array<event, slots> staged_, slot_free_;
  std::vector<event> copy_start_, copy_end_;
  std::array<std::vector<buffer>, slots> buffers_;
};

}  // namespace detail
}  // namespace towerpipe
