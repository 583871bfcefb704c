#pragma once
// exec::cuda — towers on CUDA devices. Tower i runs on pipeline_options::devices[i % size] (several
// towers may share a device) with its own stream, parameter replica and gradient buffers.
//
// Per step and tower: the shard is packed into pinned memory on the host and copied on the tower's copy
// stream (two staging slots, so stage(next) overlaps this step's compute); the tower's stream waits for
// that copy and for the new parameters of the last step, then the tower function enqueues its forward
// and backward on tower_context::stream(). The library orders stages with events only — no device-wide
// synchronisation inside a step; a step ends by waiting on each tower's final event.
//
// Peer access is enabled between every pair of the towers' distinct devices where
// cudaDeviceCanAccessPeer allows; the reduction backends fall back to staged copies elsewhere and say so
// once through the log sink (core/log.hpp). With one GPU, towers share the device and peer access is
// never needed.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/exec/thread_pool.hpp"
#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/exec/tower_failures.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/layout/batch.hpp"
#include "towerpipe/pipeline_options.hpp"
#include "towerpipe/split.hpp"

namespace towerpipe {

template <class Layout>
class cuda_towers;

// A GPU tower's view of the step (exec/tower_context.hpp): the shard, parameters and gradients are in
// the tower's device memory; work goes on stream().
template <class Layout>
class cuda_tower_context
    : public tower_context_base<typename Layout::template buffer<cuda_device_memory>, typename Layout::value_type> {
  using base = tower_context_base<typename Layout::template buffer<cuda_device_memory>, typename Layout::value_type>;

 public:
  using value_type = typename Layout::value_type;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Copies a whole variable's gradient from device memory (any device with peer access, or this one),
  // asynchronously on stream().
  void write_gradient(std::size_t index, const value_type* device_values, std::size_t count) {
    value_type* target = this->gradient_destination(index, count);
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(target, device_values, count * sizeof(value_type), cudaMemcpyDefault, stream_));
  }
  void write_gradient(const std::string& name, const value_type* device_values, std::size_t count) {
    write_gradient(this->variables().index_of(name), device_values, count);
  }

  // A device float for tower functions that return nothing: they write their shard's mean loss here
  // (on stream()), and the step reads it back with the rest.
  float* device_loss() const { return device_loss_; }

 private:
  friend class cuda_towers<Layout>;
  template <class... BaseArguments>
  cuda_tower_context(int device, cudaStream_t stream, float* device_loss, BaseArguments&&... arguments)
      : base(std::forward<BaseArguments>(arguments)...), device_(device), stream_(stream), device_loss_(device_loss) {}

  int device_;
  cudaStream_t stream_;
  float* device_loss_;
};

namespace detail {

// Which device each tower runs on; checks the ids against the visible devices.
inline std::vector<int> assign_devices(std::size_t towers, const std::vector<int>& requested) {
  const int visible = cuda_device_count();
  if (visible == 0) fail("exec::cuda needs a CUDA device, and none is visible");
  std::vector<int> devices(towers);
  for (std::size_t t = 0; t < towers; ++t) {
    const int device = requested.empty() ? static_cast<int>(t % static_cast<std::size_t>(visible))
                                         : requested[t % requested.size()];
    if (device < 0 || device >= visible)
      fail("tower ", t, ": CUDA device ", device, " does not exist (", visible, " device(s) visible)");
    devices[t] = device;
  }
  return devices;
}

// Enables peer access between every pair of distinct devices that allows it; returns the pairs
// (a, b) where a can read and write b's memory directly.
inline std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) {
  std::set<std::pair<int, int>> peers;
  const std::set<int> distinct(devices.begin(), devices.end());
  for (int a : distinct) {
    for (int b : distinct) {
      if (a == b) continue;
      int can = 0;
      TOWERPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) continue;
      device_guard on(a);
      const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else TOWERPIPE_CUDA_CHECK(status);
      peers.insert({a, b});
    }
  }
  return peers;
}

}  // namespace detail

template <class Layout>
class cuda_towers {
 public:
  using value_type = typename Layout::value_type;
  using device_buffer = typename Layout::template buffer<cuda_device_memory>;
  using host_buffer = typename Layout::template buffer<host_memory>;
  using context = cuda_tower_context<Layout>;
  static constexpr int staging_slots = 2;

  cuda_towers(const variable_set& variables, std::size_t towers, const pipeline_options& options)
      : devices_(detail::assign_devices(towers, options.devices)),
        peers_(detail::enable_peer_access(devices_)),
        pool_(detail::host_thread_count(towers, options)),
        trace_(options.trace),
        host_mirror_(variables),
        written_(towers, std::vector<char>(variables.count(), 0)),
        losses_(cuda_pinned_memory{}.allocate<float>(towers)) {
    for (std::size_t t = 0; t < towers; ++t) {
      towers_.push_back(std::make_unique<tower>(variables, devices_[t]));
      if (trace_ == nullptr) continue;
      tower& own = *towers_.back();
      own.clock_origin.record(own.stream);
      own.clock_origin.synchronize();
      own.clock_origin_host = timeline::clock::now();
    }
  }

  timeline* trace() const { return trace_; }
  std::int64_t current_step() const { return current_step_; }  // the step run() last started

  // The host time at which `event`, recorded on tower t's device and complete, happened.
  timeline::clock::time_point host_time(std::size_t t, const detail::cuda_event& event) const {
    const tower& own = *towers_[t];
    const double seconds = detail::seconds_between(own.clock_origin, event);
    return own.clock_origin_host +
           std::chrono::duration_cast<timeline::clock::duration>(std::chrono::duration<double>(seconds));
  }

  // After a step has completed: each tower's compute as the device ran it, on rows "tower i (GPU)", and
  // the copy of its shard (made when the batch was staged, usually during the step before) on rows
  // "tower i (GPU copy)".
  void record_device_spans(std::int64_t step) const {
    if (trace_ == nullptr) return;
    for (std::size_t t = 0; t < towers_.size(); ++t) {
      const tower& own = *towers_[t];
      trace_->record(detail::make_message("tower ", t, " (GPU)"), "compute", host_time(t, own.compute_start),
                     host_time(t, own.compute_end), step);
      trace_->record(detail::make_message("tower ", t, " (GPU copy)"), "split copy (host to device)",
                     host_time(t, own.copy_start[last_slot_]), host_time(t, own.copy_end[last_slot_]), step);
    }
  }

  std::size_t towers() const { return towers_.size(); }
  int device(std::size_t t) const { return devices_[t]; }
  bool can_access(int reader, int owner) const { return reader == owner || peers_.count({reader, owner}) != 0; }
  detail::thread_pool& pool() { return pool_; }

  const detail::cuda_stream& stream(std::size_t t) const { return towers_[t]->stream; }
  device_buffer& replica(std::size_t t) { return towers_[t]->replica; }
  device_buffer& gradients(std::size_t t) { return towers_[t]->gradients; }
  // Recorded on the tower's stream when its gradients are complete. The reduction makes each tower's
  // stream wait for the tower's new parameters before the next step's work.
  const detail::cuda_event& gradients_ready(std::size_t t) const { return towers_[t]->gradients_ready; }

  // Reads variable `index` of tower 0's replica (all replicas are equal between steps).
  tensor_view<const value_type> parameter_on_host(std::size_t index) {
    synchronize_all();
    detail::device_guard on(devices_[0]);
    const tensor_view<value_type> target = host_mirror_.view(index);
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(target.data(), towers_[0]->replica.data(index), target.size() * sizeof(value_type),
                                    cudaMemcpyDeviceToHost));
    return target;
  }

  void set_parameter(std::size_t index, const value_type* values) {
    synchronize_all();
    for (auto& t : towers_) {
      detail::device_guard on(t->device);
      detail::copy_to_device_now(t->replica.data(index), values, t->replica.view(index).size() * sizeof(value_type));
    }
  }

  // Packs each tower's shard into pinned memory and starts its copy to the tower's device on the tower's
  // copy stream, in the staging slot after the last one used.
  void stage(const towerpipe::batch& whole, const std::vector<shard>& shards) {
    const int slot = next_slot_;
    std::vector<towerpipe::batch> device_shards(towers());
    for (std::size_t t = 0; t < towers(); ++t)
      device_shards[t] = towers_[t]->stage(slot, whole.slice(shards[t].first, shards[t].examples), trace_ != nullptr);
    staged_.push_back({slot, std::move(device_shards), shards});
    next_slot_ = (next_slot_ + 1) % staging_slots;
  }
  std::size_t staged() const { return staged_.size(); }
  const std::vector<shard>& next_shards() const { return staged_.front().shards; }

  // Runs fn(context&) for every tower, each on a pool thread with its device current, on the oldest
  // staged batch (consumed whatever the outcome). A function returning a number gives the loss; one
  // returning nothing writes it to context::device_loss(). Throws if a tower threw or left a gradient
  // unwritten, naming the tower; no reduction then follows, so the parameters stay as they were.
  template <class TowerFn>
  std::vector<double> run(TowerFn& fn, std::int64_t step) {
    current_step_ = step;
    const staged_batch current = std::move(staged_.front());
    staged_.pop_front();
    last_slot_ = current.slot;
    for (std::vector<char>& flags : written_) std::fill(flags.begin(), flags.end(), 0);
    std::vector<double> losses(towers(), 0.0);
    std::vector<std::exception_ptr> failures = pool_.run(towers(), [&](std::size_t t) {
      tower& own = *towers_[t];
      detail::device_guard on(own.device);
      const detail::nvtx_range range("towerpipe tower compute");
      own.staged[current.slot].make_wait(own.stream);
      if (trace_ != nullptr) own.compute_start.record(own.stream);
      TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(own.device_loss.get(), 0, sizeof(float), own.stream.get()));
      context ctx(own.device, own.stream.get(), own.device_loss.get(), t, towers(), current.device_shards[t],
                  current.shards[t].weight, &own.replica, &own.gradients, &written_[t]);
      // Recorded whatever the tower function does, so that later steps order after its work.
      const auto record_done = [&] {
        if (trace_ != nullptr) own.compute_end.record(own.stream);
        own.gradients_ready.record(own.stream);
        own.slot_free[current.slot].record(own.stream);
      };
      const auto start = timeline::clock::now();
      try {
        if constexpr (std::is_void_v<decltype(fn(ctx))>) {
          fn(ctx);
          TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(&losses_[t], own.device_loss.get(), sizeof(float),
                                               cudaMemcpyDeviceToHost, own.stream.get()));
        } else {
          losses[t] = static_cast<double>(fn(ctx));
        }
        TOWERPIPE_CUDA_CHECK(cudaGetLastError());  // a launch the tower function made with bad arguments
      } catch (...) {
        record_done();
        throw;
      }
      record_done();
      if (trace_ != nullptr)
        trace_->record(detail::make_message("tower ", t), "enqueue compute", start, timeline::clock::now(), step);
    });
    detail::throw_tower_failures(failures, written_, host_mirror_.variables());
    if constexpr (std::is_void_v<decltype(fn(std::declval<context&>()))>) {
      for (std::size_t t = 0; t < towers(); ++t) {
        towers_[t]->gradients_ready.synchronize();
        losses[t] = losses_[t];
      }
    }
    return losses;
  }

  // Waits for all of every tower's work (between steps, before host access to replicas).
  void synchronize_all() const {
    for (const auto& t : towers_) {
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(t->stream.get()));
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(t->copy_stream.get()));
    }
  }

 private:
  // One staging area for one input in one slot: pinned host bytes and device bytes, grown on demand.
  struct staging_buffer {
    cuda_pinned_memory::owner<char> host{nullptr, {}};
    cuda_device_memory::owner<char> device{nullptr, {0}};
    std::size_t capacity = 0;
  };

  struct tower {
    tower(const variable_set& variables, int device_id)
        : device(device_id),
          stream(device_id),
          copy_stream(device_id),
          replica(variables, cuda_device_memory{device_id}),
          gradients(variables, cuda_device_memory{device_id}),
          gradients_ready(device_id),
          compute_start(device_id, true),
          compute_end(device_id, true),
          clock_origin(device_id, true),
          staged{detail::cuda_event(device_id), detail::cuda_event(device_id)},
          slot_free{detail::cuda_event(device_id), detail::cuda_event(device_id)},
          copy_start{detail::cuda_event(device_id, true), detail::cuda_event(device_id, true)},
          copy_end{detail::cuda_event(device_id, true), detail::cuda_event(device_id, true)},
          device_loss(cuda_device_memory{device_id}.allocate<float>(1, 256)) {}

    // Copies one tower's shard into staging slot `slot` and returns the batch that views it on the
    // device. Row-major inputs stay row-major; column-major ones become column-major with the shard's
    // example count as leading dimension. `timed`: record the copy's start and end (for a timeline).
    towerpipe::batch stage(int slot, const towerpipe::batch& part, bool timed) {
      detail::device_guard on(device);
      const detail::nvtx_range range("towerpipe stage shard");
      // The last copy out of this slot's pinned memory must be done before the host overwrites it, and
      // the tower that last read this slot's device memory must be done before the copy lands.
      staged[slot].synchronize();
      std::vector<staging_buffer>& buffers = staging[slot];
      buffers.resize(part.inputs().size());
      for (std::size_t i = 0; i < part.inputs().size(); ++i) {
        const batch_input& input = part.inputs()[i];
        staging_buffer& buffer = buffers[i];
        if (input.bytes() > buffer.capacity) {
          TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(copy_stream.get()));
          TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
          buffer.host = cuda_pinned_memory{}.allocate<char>(input.bytes());
          buffer.device = cuda_device_memory{device}.allocate<char>(input.bytes(), 256);
          buffer.capacity = input.bytes();
        }
        input.pack_into(buffer.host.get());
      }
      // The copies, back to back once everything is packed.
      slot_free[slot].make_wait(copy_stream);
      if (timed) copy_start[slot].record(copy_stream);
      towerpipe::batch on_device;
      for (std::size_t i = 0; i < part.inputs().size(); ++i) {
        const batch_input& input = part.inputs()[i];
        TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(buffers[i].device.get(), buffers[i].host.get(), input.bytes(),
                                             cudaMemcpyHostToDevice, copy_stream.get()));
        on_device.add(input.packed_at(buffers[i].device.get()));
      }
      if (timed) copy_end[slot].record(copy_stream);
      staged[slot].record(copy_stream);
      return on_device;
    }

    int device;
    detail::cuda_stream stream, copy_stream;
    device_buffer replica, gradients;
    detail::cuda_event gradients_ready;
    detail::cuda_event compute_start, compute_end;  // timing, recorded only with a timeline
    // An event that completed at host time clock_origin_host: device event times convert to host time.
    detail::cuda_event clock_origin;
    timeline::clock::time_point clock_origin_host;
    std::array<detail::cuda_event, staging_slots> staged, slot_free;
    std::array<detail::cuda_event, staging_slots> copy_start, copy_end;  // timing, recorded only with a timeline
    std::array<std::vector<staging_buffer>, staging_slots> staging;
    cuda_device_memory::owner<float> device_loss;
  };

  struct staged_batch {
    int slot;
    std::vector<towerpipe::batch> device_shards;
    std::vector<shard> shards;
  };

  std::vector<int> devices_;
  std::set<std::pair<int, int>> peers_;
  detail::thread_pool pool_;
  timeline* trace_;
  host_buffer host_mirror_;
  std::vector<std::unique_ptr<tower>> towers_;
  std::vector<std::vector<char>> written_;
  cuda_pinned_memory::owner<float> losses_;
  std::deque<staged_batch> staged_;
  int next_slot_ = 0;
  int last_slot_ = 0;  // the staging slot of the batch run() last consumed
  std::int64_t current_step_ = 0;
};

namespace exec {

// Towers on CUDA devices (see the top of this header).
struct cuda {
  using policy_kind = detail::exec_policy_kind;
  static constexpr const char* name = "cuda";
  template <class Layout>
  using towers = cuda_towers<Layout>;
};

}  // namespace exec
}  // namespace towerpipe
