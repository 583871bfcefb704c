#pragma once
// The simulated devices' engine: devices, memory, streams, events, copies, host accesses and launches
// behind one lock, with the checks a GPU would make (or fail on) at every call. The executor façade
// (executor/simulated/executor.hpp) is a thin layer over it. The devices are kept in
// executor/simulated/devices.hpp, the sides of copies checked in executor/simulated/copies.hpp, and
// kernels run in executor/simulated/launches.hpp.
// Work runs lazily, when the host synchronises with it (executor/simulated/ordering.hpp); errors are thrown by the call
// that found them, or, found while freeing, by the next call or machine::check(). One call runs at a time.
// Why: docs/design-notes.md#executor-simulated-engine

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/copies.hpp"
#include "towerpipe/executor/simulated/devices.hpp"
#include "towerpipe/executor/simulated/launches.hpp"
#include "towerpipe/executor/simulated/machine_config.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/operand_ranges.hpp"
#include "towerpipe/executor/simulated/ordering.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/plan/chunk_table.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

class engine {
 public:
  explicit engine(const sim::machine_config& config) : devices_(config), core_(config.seed) {}
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // ---- the machine ----
  const sim::machine_config& config() const { return devices_.config(); }
  void check() {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_kept();
  }
  sim::op_counts counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }
  void reset_counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    counts_ = {};
  }

  // ---- devices ----
  void check_device(int device, const char* what) const { devices_.check(device, what); }
  int set_current_device(int device) {
    return call([&] {
      check_device(device, "device_guard");
      return devices_.set_current(device);
    });
  }
  void restore_current_device(int device) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    devices_.set_current(device);
  }
  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) {
    return call([&] { return devices_.enable_peer_access(devices); });
  }
  bool native_peer_atomics(int a, int b) const { return devices_.native_peer_atomics(a, b); }

  // ---- memory ----
  void* allocate(std::size_t bytes, std::size_t alignment, int owner) {
    return call([&] {
      if (owner != pinned_host) check_device(owner, "device_memory");
      if (alignment > 256) fail("simulated memory aligns to 256 bytes, ", alignment, " requested");
      // cudaMalloc aligns to 256 bytes, cudaMallocHost to a page.
      const allocation& made = memory_.allocate(bytes, owner == pinned_host ? 4096 : 256, owner);
      return reinterpret_cast<void*>(made.base);
    });
  }

  // Like cudaFree (cudaFreeHost): ordering::free says what it waits for and what races with it.
  void free(void* pointer) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      const auto base = reinterpret_cast<std::uintptr_t>(pointer);
      const allocation* found = memory_.at_base(base);
      if (found == nullptr) fail("free of ", address_text(base), ", which the simulated executor did not allocate");
      core_.free(*found, memory_);
    } catch (...) {
      core_.report(current_exception_text());
    }
    for (const std::string& violation : core_.found()) kept_.push_back("while freeing memory: " + violation);
    core_.forget_found();
  }

  // ---- streams and events ----
  std::size_t create_stream(int device, const char* label) {
    return call([&] {
      check_device(device, "stream");
      return core_.queues().add_stream(device, label == nullptr ? "" : label);
    });
  }
  std::size_t create_event(int device, bool timing) {
    return call([&] {
      check_device(device, "event");
      return core_.queues().add_event(device, timing);
    });
  }
  void record(std::size_t event, std::size_t stream) {
    call([&] {
      event_state& e = core_.queues().event(event);
      const stream_state& s = core_.queues().stream(stream);
      if (e.device != s.device)
        fail("record: event #", event, " of device ", e.device, " recorded on ", stream_text(s), " (the same device required)");
      ++counts_.records;
      e.last_record = core_.enqueue(stream, make_message("record of event #", event), {}, nullptr, 0);
    });
  }
  // Work enqueued on `stream` from now on runs after the event's last record made before this call.
  void wait(std::size_t stream, std::size_t event) {
    call([&] {
      ++counts_.waits;
      const std::shared_ptr<const op> record = core_.queues().event(event).last_record;
      if (record != nullptr) core_.enqueue(stream, make_message("wait for event #", event), {}, nullptr, 0, record);
    });
  }
  void synchronize_event(std::size_t event) {
    call([&] {
      ++counts_.host_syncs;
      const std::shared_ptr<const op> record = core_.queues().event(event).last_record;
      if (record == nullptr) return;  // cudaEventSynchronize on an event never recorded returns at once
      core_.wait_for(record);
    });
  }
  void synchronize_stream(std::size_t stream) {
    call([&] {
      ++counts_.host_syncs;
      core_.drain_and_join(stream);
    });
  }
  void synchronize_device(int device) {
    call([&] {
      check_device(device, "synchronize_device");
      ++counts_.host_syncs;
      core_.drain_device_and_join(device);
    });
  }
  // Between two timing events' last records, both of which the host has synchronised with: the host
  // cannot know that a record it did not wait for is done (cudaEventElapsedTime: cudaErrorNotReady).
  double seconds_between(std::size_t start, std::size_t end) {
    return call([&] {
      const auto finished = [&](std::size_t id) {
        const event_state& e = core_.queues().event(id);
        if (!e.timing) fail("seconds_between: event #", id, " was created without timing");
        if (e.last_record == nullptr) fail("seconds_between: event #", id, " has never been recorded");
        if (!ordered_before(e.last_record->at, core_.host_clock()))
          fail("seconds_between: the last record of event #", id,
               " is not complete as far as the host knows (synchronize with it first; CUDA: cudaErrorNotReady)");
        return e.last_record;
      };
      const std::shared_ptr<const op> first = finished(start), second = finished(end);
      if (core_.queues().event(start).device != core_.queues().event(end).device)
        fail("seconds_between: event #", start, " is of device ", core_.queues().event(start).device, ", event #", end, " of device ",
             core_.queues().event(end).device);
      return second->finished_at - first->finished_at;
    });
  }

  // ---- copies and fills ----
  // copies.hpp: plan_copy says what CUDA makes of a pageable host side.
  void copy(const std::vector<copy_range>& ranges, std::size_t stream, const char* what) {
    call([&] {
      planned_copy plan = plan_copy(memory_, ranges, what);
      if (plan.work.empty()) return;
      ++counts_.copies;
      core_.enqueue(stream, what, std::move(plan.accesses), [work = plan.work, staged = plan.staged] {
        for (const copy_range& r : work) std::memcpy(r.dst, r.src, r.bytes);
      }, plan.seconds);
      if (plan.lands_in_pageable) core_.drain_and_join(stream);
    });
  }
  void memset(void* dst, int byte, std::size_t bytes, std::size_t stream) {
    call([&] {
      if (bytes == 0) return;
      const auto lo = reinterpret_cast<std::uintptr_t>(dst);
      const allocation& to = async_device_or_pinned(memory_, lo, bytes, "memset_async", "destination");
      ++counts_.memsets;
      core_.enqueue(stream, "memset_async", {{to, lo, lo + bytes, access_kind::write}},
                    [dst, byte, bytes] { std::memset(dst, byte, bytes); },
                    op_latency_seconds + static_cast<double>(bytes) / device_bytes_per_second);
    });
  }
  // A kernel (thrust::fill_n on CUDA): the stream's device must reach the values.
  template <class U>
  void fill(U* dst, std::size_t count, U value, std::size_t stream) {
    call([&] {
      if (count == 0) return;
      const auto lo = reinterpret_cast<std::uintptr_t>(dst), hi = lo + count * sizeof(U);
      const allocation to = reached_by_kernel(memory_, devices_.peers_enabled(), core_.queues().stream(stream), lo, hi, "fill_async");
      ++counts_.memsets;
      core_.enqueue(stream, "fill_async", {{to, lo, hi, access_kind::write}}, [dst, count, value] { std::fill_n(dst, count, value); },
                    op_latency_seconds + static_cast<double>(hi - lo) / device_bytes_per_second);
    });
  }
  // A scan on the stream (thrust::find on CUDA), then the host waits for the stream.
  template <class U>
  std::size_t find_first(const U* data, std::size_t count, U value, std::size_t stream) {
    return call([&] {
      ++counts_.host_syncs;
      const auto found = std::make_shared<std::size_t>(count);
      if (count != 0) {
        ++counts_.launches;
        const auto lo = reinterpret_cast<std::uintptr_t>(data), hi = lo + count * sizeof(U);
        const allocation from = reached_by_kernel(memory_, devices_.peers_enabled(), core_.queues().stream(stream), lo, hi, "find_first");
        core_.enqueue(stream, "find_first", {{from, lo, hi, access_kind::read}},
                      [data, count, value, found] { *found = static_cast<std::size_t>(std::find(data, data + count, value) - data); },
                      op_latency_seconds + static_cast<double>(hi - lo) / device_bytes_per_second);
      }
      core_.drain_and_join(stream);
      return *found;
    });
  }

  // ---- the host ----
  // Synchronous copies between host memory and device memory, landed on return. Not ordered after any
  // stream's work: the caller must have synchronised with what touches either side.
  void copy_now(void* dst, const void* src, std::size_t bytes, bool to_device) {
    call([&] {
      const char* what = to_device ? "copy_to_device_now" : "copy_to_host_now";
      if (bytes == 0) return;
      ++counts_.copies;
      const std::vector<op_access> accesses = copy_now_accesses(memory_, dst, src, bytes, to_device, what);
      core_.host_op(what, accesses);
      std::memcpy(dst, src, bytes);
    });
  }
  // Host code touching pinned memory (pageable memory is the host's own: nothing to check).
  void host_access(const void* pointer, std::size_t bytes, operand_access access, const char* what) {
    call([&] {
      if (bytes == 0) return;
      const auto lo = reinterpret_cast<std::uintptr_t>(pointer);
      const placement place = memory_.place(lo, lo + bytes, [&] { return std::string(what); });
      if (place.holder == nullptr) return;
      if (place.holder->owner != pinned_host)
        fail(what, ": the host cannot touch ", describe_bytes(*place.holder, lo, lo + bytes), " (device memory)");
      core_.host_op(what, {{*place.holder, lo, lo + bytes, plain_kind(access)}});
    });
  }
  // Host code acting as `stream`'s own work: what is pending on the stream runs first, then the access
  // is an op of the stream made now (ordered after the stream's work and the host's past; the host
  // clock is not joined).
  void stream_host_access(std::size_t stream, const void* pointer, std::size_t bytes, operand_access access) {
    call([&] {
      core_.drain(stream);
      if (bytes == 0) return;
      const stream_state& s = core_.queues().stream(stream);
      const auto lo = reinterpret_cast<std::uintptr_t>(pointer);
      const placement place = memory_.place(lo, lo + bytes, [] { return std::string("stream_host_access"); });
      if (place.holder == nullptr) return;
      if (place.holder->owner != pinned_host)
        check_device_reaches(memory_, s.device, place, devices_.peers_enabled(), lo,
                             [&] { return make_message("stream_host_access as ", stream_text(s)); });
      core_.stream_op(stream, {*place.holder, lo, lo + bytes, plain_kind(access)});
    });
  }
  // What the CUDA executor learns from cudaGetLastError: here, only violations kept from frees.
  void check_user_launches() {
    call([] {});
  }

  // ---- launches ----
  // The multi-tensor kernel and the screen kernel, as launcher (executor/simulated/launches.hpp) runs
  // them; the calling thread's current device must be the stream's.
  template <class Policy, class Agent>
  void launch(const Agent& agent, const std::vector<tensor_chunk>& chunks, int table_device, std::size_t stream, chunk_group run) {
    call([&] { launching().template multi_tensor<Policy>(agent, chunks, table_device, stream, run); });
  }
  template <class Source, class T>
  void screen_launch(const Source& source, const pointer_table<T>& averaged, const std::vector<tensor_chunk>& tiles, int screen_device,
                     double* tile_sums, nonfinite_key* key, std::size_t stream, chunk_group run) {
    call([&] { launching().screen(source, averaged, tiles, screen_device, tile_sums, key, stream, run); });
  }

 private:
  // Runs `body` as one call: under the lock, after throwing what frees kept, and throwing at the end
  // the first violation it found.
  template <class Body>
  auto call(const Body& body) -> decltype(body()) {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_kept();
    try {
      if constexpr (std::is_void_v<decltype(body())>) {
        body();
        core_.throw_found();
      } else {
        auto result = body();
        core_.throw_found();
        return result;
      }
    } catch (...) {
      core_.forget_found();
      throw;
    }
  }
  void throw_kept() { throw_first(kept_); }

  // For one launch by the calling thread.
  launcher launching() { return {core_, memory_, devices_.peers_enabled(), devices_.current(), counts_}; }

  device_state devices_;
  std::mutex mutex_;
  memory_registry memory_;
  ordering core_;
  std::vector<std::string> kept_;  // by frees, for the next call
  sim::op_counts counts_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
