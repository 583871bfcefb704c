#pragma once
// A GPU tower's input staging: each batch's shard is packed into pinned host memory and copied to the
// tower's device on a copy stream of its own, into one of two slots, so that staging the next batch
// overlaps this step's compute. Events order the slots: a slot is refilled only after the tower's last
// read of it, and the tower reads it only after its copy landed.

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <vector>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/layout/batch.hpp"

namespace towerpipe {
namespace detail {

class shard_stager {
 public:
  static constexpr int slots = 2;

  // `timed`: record each copy's start and end (for a timeline).
  shard_stager(int device, bool timed)
      : device_(device),
        copy_stream_(device),
        staged_{cuda_event(device), cuda_event(device)},
        slot_free_{cuda_event(device), cuda_event(device)},
        timed_(timed) {
    for (int s = 0; timed && s < slots; ++s) {
      copy_start_.emplace_back(device, true);
      copy_end_.emplace_back(device, true);
    }
  }

  // Copies `part` into staging slot `slot` and returns the batch that views it on the device. Row-major
  // inputs stay row-major; column-major ones become column-major with the shard's example count as
  // leading dimension. `tower_stream` is the stream that reads the slot (waited for before a buffer grows).
  towerpipe::batch stage(int slot, const towerpipe::batch& part, const cuda_stream& tower_stream) {
    device_guard on(device_);
    const nvtx_range range("towerpipe stage shard");
    // The last copy out of this slot's pinned memory must be done before the host overwrites it, and
    // the tower that last read this slot's device memory must be done before the copy lands.
    staged_[slot].synchronize();
    std::vector<buffer>& buffers = buffers_[slot];
    buffers.resize(part.inputs().size());
    for (std::size_t i = 0; i < part.inputs().size(); ++i) {
      const batch_input& input = part.inputs()[i];
      buffer& b = buffers[i];
      if (input.bytes() > b.capacity) {
        TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(copy_stream_.get()));
        TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower_stream.get()));
        b.host = cuda_pinned_memory{}.allocate<char>(input.bytes());
        b.device = cuda_device_memory{device_}.allocate<char>(input.bytes(), 256);
        b.capacity = input.bytes();
      }
      input.pack_into(b.host.get());
    }
    // The copies, back to back once everything is packed.
    slot_free_[slot].make_wait(copy_stream_);
    if (timed_) copy_start_[slot].record(copy_stream_);
    towerpipe::batch on_device;
    for (std::size_t i = 0; i < part.inputs().size(); ++i) {
      const batch_input& input = part.inputs()[i];
      TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(buffers[i].device.get(), buffers[i].host.get(), input.bytes(),
                                           cudaMemcpyHostToDevice, copy_stream_.get()));
      on_device.add(input.packed_at(buffers[i].device.get()));
    }
    if (timed_) copy_end_[slot].record(copy_stream_);
    staged_[slot].record(copy_stream_);
    return on_device;
  }

  // Work on `stream` after this reads slot `slot`'s copy.
  void wait_for_copy(int slot, const cuda_stream& stream) const { staged_[slot].make_wait(stream); }
  // The slot may be refilled once `stream`'s work so far is done.
  void release(int slot, const cuda_stream& stream) const { slot_free_[slot].record(stream); }

  const cuda_stream& copy_stream() const { return copy_stream_; }
  // Timing events of slot `slot`'s last copy; only when constructed `timed`.
  const cuda_event& copy_start(int slot) const { return copy_start_[static_cast<std::size_t>(slot)]; }
  const cuda_event& copy_end(int slot) const { return copy_end_[static_cast<std::size_t>(slot)]; }

 private:
  // One input's staging area in one slot: pinned host bytes and device bytes, grown on demand.
  struct buffer {
    cuda_pinned_memory::owner<char> host{nullptr, {}};
    cuda_device_memory::owner<char> device{nullptr, {0}};
    std::size_t capacity = 0;
  };

  int device_;
  cuda_stream copy_stream_;
  std::array<cuda_event, slots> staged_, slot_free_;
  std::vector<cuda_event> copy_start_, copy_end_;
  bool timed_;
  std::array<std::vector<buffer>, slots> buffers_;
};

}  // namespace detail
}  // namespace towerpipe
