#pragma once
// One owner of reduce::sharded with GPU towers on its device, the same for both forms: a tower's device
// in one process (reduce/sharded/gpu_towers.cuh, an owner per tower) and a process
// (reduce/sharded/gpu_towers_across_processes.cuh, an owner per process). Its plain-C++ part —
// its slice, its slice of the state, for checked steps its slice of the average, across processes and
// with mixed precision its master slice — is programs/owner_wiring.hpp's slice_owner in device memory;
// here, its stream and timing events, the tables uploaded (their vector alignment checked on the host
// first, for the element type of each table: the master type for the owner's own storage, the towers'
// stored type for tables over their buffers), the screen of its tiles, and the state's and the
// master's values to and from the host between steps.

#include <cuda_runtime.h>

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/programs/owner_wiring.hpp"
#include "towerpipe/programs/screen.hpp"

namespace towerpipe {
namespace detail {

// What reduce::sharded for GPU towers takes, in one process or several (any stored type: 16-bit towers
// are mixed precision, with the owners' storage in the master type).
template <class Policy>
constexpr bool check_sharded_gpu_policy() {
  static_assert(Policy::chunk_elements % screen_tile_elements == 0,
                "towerpipe: reduce::sharded needs chunks of whole screen tiles, so that each tile has one owner");
  return true;
}

// T: the master type (float for 16-bit towers), of the owner's state, average and master slice.
template <class T, class Policy>
class gpu_owner {
  static_assert(check_sharded_gpu_policy<Policy>());  // for both forms, which hold owners

 public:
  gpu_owner(const variable_set& variables, owner_slice slice, const std::vector<tensor_chunk>& table, int slots, owner_keeps keeps,
            int device)
      : device_(device),
        stream_(device),
        start_(device, true),
        end_(device, true),
        parts_(std::move(slice), table, variables.count(), slots, keeps, cuda_device_memory{device}),
        chunks_(parts_.chunks(), device),
        state_(upload(parts_.state(), variables, "reduce::sharded: an owner's slice of the optimizer state")) {
    if (keeps.master) master_ = std::make_unique<device_pointer_table<T>>(
        upload(parts_.master(), variables, "reduce::sharded: an owner's master slice"));
    if (keeps.average) {
      average_ = std::make_unique<device_pointer_table<T>>(
          upload(parts_.average(), variables, "reduce::sharded: a slice of the checked average"));
      screen_ = std::make_unique<device_screen>(make_chunk_table(parts_.slice().ranges, screen_tile_elements), device);
    }
  }

  int device() const { return device_; }
  const owner_slice& slice() const { return parts_.slice(); }
  const std::vector<tensor_chunk>& chunk_list() const { return parts_.chunks(); }
  const device_chunk_table& chunks() const { return chunks_; }
  const cuda_stream& stream() const { return stream_; }
  const cuda_event& start() const { return start_; }
  const cuda_event& end() const { return end_; }
  int slots() const { return parts_.slots(); }
  std::size_t state_bytes() const { return parts_.state_elements() * sizeof(T); }

  pointer_table<T> state() const { return state_.view(); }
  pointer_table<T> master() const { return master_->view(); }
  T* master_storage() const { return parts_.master_storage(); }
  // A checked step's slice of the average (role 0) and its screen.
  const device_pointer_table<T>& average() const {
    parts_.average();  // fails on a pipeline built for unchecked steps
    return *average_;
  }
  const device_screen& screen() const {
    parts_.average();
    return *screen_;
  }

  // A table over the owner's chunks, its vector alignment for elements of type U checked first (U: the
  // master type, or the towers' stored type for tables over their buffers).
  template <class U>
  device_pointer_table<U> upload(const std::vector<U*>& pointers, const variable_set& variables, const char* what) const {
    return vector_pointer_table<Policy>(pointers, static_cast<int>(variables.count()), parts_.chunks(), device_, what);
  }

  // The owner's stream waits for every tower's gradients; its timing starts there.
  template <class Towers>
  void wait_for_gradients(Towers& towers) const {
    for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(stream_);
    start_.record(stream_);
  }

  // Between steps, once the owner's stream is idle: variable `index`'s values (whole, on the host) into
  // the owner's parts of a slot of the state or of its master slice, and those parts back.
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    set_parts(parts_.slot_storage(slot), index, values);
  }
  void set_master(std::size_t index, const T* values) { set_parts(parts_.master_storage(), index, values); }
  void state_to_host(std::size_t slot, std::size_t index, T* values) const { parts_to_host(parts_.slot_storage(slot), index, values); }
  void master_to_host(std::size_t index, T* values) const { parts_to_host(parts_.master_storage(), index, values); }
  // A slot's whole compact storage (the all-gather across processes sends it as it is).
  void slot_to_host(std::size_t slot, T* values) const {
    const T* storage = parts_.slot_storage(slot);
    device_guard on(device_);
    synchronize();
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(values, storage, slice().stored_elements * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  void synchronize() const { TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get())); }
  void parts_to_host(const T* storage, std::size_t index, T* values) const {
    device_guard on(device_);
    synchronize();
    parts_.slice().for_each_stored_range_of(index, [&](const element_range& r, std::size_t offset) {
      TOWERPIPE_CUDA_CHECK(cudaMemcpy(values + r.begin, storage + offset, (r.end - r.begin) * sizeof(T), cudaMemcpyDeviceToHost));
    });
  }
  void set_parts(T* storage, std::size_t index, const T* values) {
    device_guard on(device_);
    synchronize();
    parts_.slice().for_each_stored_range_of(index, [&](const element_range& r, std::size_t offset) {
      copy_to_device_now(storage + offset, values + r.begin, (r.end - r.begin) * sizeof(T));
    });
  }

  int device_;
  cuda_stream stream_;
  cuda_event start_, end_;  // timing: from the last tower's gradients to the owner's last write
  slice_owner<T, cuda_device_memory> parts_;
  device_chunk_table chunks_;
  device_pointer_table<T> state_;                  // role = slot, indexed as whole variables
  std::unique_ptr<device_pointer_table<T>> master_;   // across processes, and with mixed precision
  std::unique_ptr<device_pointer_table<T>> average_;  // checked steps
  std::unique_ptr<device_screen> screen_;                       // checked steps: the slice's tiles
};

}  // namespace detail
}  // namespace towerpipe
