#pragma once
// The simulated devices' engine: memory, streams, events, the host clock and the race detector behind
// one lock, with the checks a GPU would make (or fail on) at every call. The executor façade
// (executor/simulated/executor.hpp) is a thin layer over it.
//
// Work is enqueued and runs lazily: when the host synchronises with it (or frees memory, which drains
// the owning device like cudaFree), in a seeded random order that keeps stream order and event waits
// and nothing else (executor/simulated/op_queue.hpp). Every op carries the accesses it makes and a vector
// clock: its stream's clock joined with the host clock at enqueue time and the records it waits for,
// then ticked. The host has one clock, shared by all host threads; a host synchronisation joins the
// awaited op's clock into it, and a host access ticks it. Conflicting accesses not ordered by
// happens-before are races (executor/simulated/access_history.hpp), reported naming both ops.
//
// Errors are towerpipe::error thrown by the call that found them (the first, with a count of the
// others it found); a violation found while freeing (in a destructor) is kept and thrown by the next
// call, or by machine::check(). Ops run under the lock, so one call runs at a time.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/access_history.hpp"
#include "towerpipe/executor/simulated/machine_config.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/op_queue.hpp"
#include "towerpipe/executor/simulated/operand_ranges.hpp"
#include "towerpipe/executor/simulated/vector_clock.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/kernels/operands.hpp"
#include "towerpipe/kernels/screen.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

// The simulated clock: an op takes a latency plus its bytes at a bandwidth, and starts when its stream
// and the record it waits for are done, so event times depend on the work and its dependencies only.
constexpr double op_latency_seconds = 2e-6;
constexpr double device_bytes_per_second = 2e12;  // a launch, a copy within one device
constexpr double link_bytes_per_second = 5e10;    // a copy between devices or with the host

// One range of a copy; expected owners (copy_peer_async) or any_owner.
constexpr int any_owner = -2;
struct copy_range {
  void* dst;
  const void* src;
  std::size_t bytes;
  int dst_owner = any_owner, src_owner = any_owner;
};

class engine {
 public:
  explicit engine(const sim::machine_config& config) : config_(config), queues_(config.seed) {
    if (config.devices < 0) fail("simulated machine: ", config.devices, " devices");
    const auto check_pairs = [&](const std::set<std::pair<int, int>>& pairs, const char* what) {
      for (const auto& [a, b] : pairs) {
        check_device(a, what);
        check_device(b, what);
      }
    };
    check_pairs(config.peers, "machine_config::peers");
    check_pairs(config.native_atomics, "machine_config::native_atomics");
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // ---- the machine ----
  const sim::machine_config& config() const { return config_; }
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
  void check_device(int device, const char* what) const {
    if (device < 0 || device >= config_.devices)
      fail(what, ": simulated device ", device, " does not exist (", config_.devices, " device(s))");
  }
  // The calling thread's current device (0 until a device_guard sets one), as CUDA keeps it per thread.
  int set_current_device(int device) {
    return call([&] {
      check_device(device, "device_guard");
      int& current = current_[std::this_thread::get_id()];
      return std::exchange(current, device);
    });
  }
  void restore_current_device(int device) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    current_[std::this_thread::get_id()] = device;
  }
  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) {
    return call([&] {
      for (int d : devices) check_device(d, "enable_peer_access");
      const std::set<int> distinct(devices.begin(), devices.end());
      std::set<std::pair<int, int>> enabled;
      for (int a : distinct) {
        for (int b : distinct) {
          if (a == b || config_.peers.count({a, b}) == 0) continue;
          peers_enabled_.insert({a, b});
          enabled.insert({a, b});
        }
      }
      return enabled;
    });
  }
  bool native_peer_atomics(int a, int b) const {
    check_device(a, "native_peer_atomics");
    check_device(b, "native_peer_atomics");
    return config_.native_atomics.count({a, b}) != 0 || config_.native_atomics.count({b, a}) != 0;
  }

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

  // Like cudaFree (cudaFreeHost): drains the owning device (every device, for pinned memory) and any
  // other work that uses the memory, and the host is then ordered after the drained streams. Work of
  // other devices that used the memory without the host being ordered after it races with the free.
  void free(void* pointer) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      const auto base = reinterpret_cast<std::uintptr_t>(pointer);
      const allocation* found = memory_.at_base(base);
      if (found == nullptr) fail("free of ", address_text(base), ", which the simulated executor did not allocate");
      const allocation freed = *found;
      const auto drained_here = [&](const stream_state& s) { return freed.owner == pinned_host || s.device == freed.owner; };
      std::vector<std::shared_ptr<const op>> users;  // pending work elsewhere that uses the memory
      for (const stream_state& s : queues_.streams()) {
        for (const std::shared_ptr<op>& o : s.pending) {
          if (std::any_of(o->accesses.begin(), o->accesses.end(), [&](const op_access& a) { return a.holder.id == freed.id; }))
            users.push_back(o);
        }
      }
      run_until([&] {
        return std::all_of(users.begin(), users.end(), [](const std::shared_ptr<const op>& o) { return o->executed; }) &&
               std::none_of(queues_.streams().begin(), queues_.streams().end(),
                            [&](const stream_state& s) { return drained_here(s) && !s.pending.empty(); });
      });
      for (const stream_state& s : queues_.streams()) {
        if (drained_here(s)) join(host_clock_, s.clock);
      }
      host_op(make_message("free of ", describe(freed)), {{freed, freed.base, freed.end(), access_kind::write}});
      history_.forget(freed.id);
      memory_.release(base);
    } catch (...) {
      found_.push_back(current_exception_text());
    }
    for (const std::string& violation : found_) kept_.push_back("while freeing memory: " + violation);
    found_.clear();
  }

  // ---- streams and events ----
  std::size_t create_stream(int device, const char* label) {
    return call([&] {
      check_device(device, "stream");
      return queues_.add_stream(device, label == nullptr ? "" : label);
    });
  }
  std::size_t create_event(int device, bool timing) {
    return call([&] {
      check_device(device, "event");
      return queues_.add_event(device, timing);
    });
  }
  void record(std::size_t event, std::size_t stream) {
    call([&] {
      event_state& e = queues_.event(event);
      const stream_state& s = queues_.stream(stream);
      if (e.device != s.device)
        fail("record: event #", event, " of device ", e.device, " recorded on ", stream_text(s), " (the same device required)");
      ++counts_.records;
      e.last_record = enqueue(stream, make_message("record of event #", event), {}, nullptr, 0);
    });
  }
  // Work enqueued on `stream` from now on runs after the event's last record made before this call.
  void wait(std::size_t stream, std::size_t event) {
    call([&] {
      ++counts_.waits;
      const std::shared_ptr<const op> record = queues_.event(event).last_record;
      if (record != nullptr) enqueue(stream, make_message("wait for event #", event), {}, nullptr, 0, record);
    });
  }
  void synchronize_event(std::size_t event) {
    call([&] {
      ++counts_.host_syncs;
      const std::shared_ptr<const op> record = queues_.event(event).last_record;
      if (record == nullptr) return;  // cudaEventSynchronize on an event never recorded returns at once
      run_until([&] { return record->executed; });
      join(host_clock_, record->clock);
    });
  }
  void synchronize_stream(std::size_t stream) {
    call([&] {
      ++counts_.host_syncs;
      drain_and_join(stream);
    });
  }
  void synchronize_device(int device) {
    call([&] {
      check_device(device, "synchronize_device");
      ++counts_.host_syncs;
      const auto on_device = [&](const stream_state& s) { return s.device == device; };
      run_until([&] {
        return std::none_of(queues_.streams().begin(), queues_.streams().end(),
                            [&](const stream_state& s) { return on_device(s) && !s.pending.empty(); });
      });
      for (const stream_state& s : queues_.streams()) {
        if (on_device(s)) join(host_clock_, s.clock);
      }
    });
  }
  // Between two timing events' last records, both of which the host has synchronised with: the host
  // cannot know that a record it did not wait for is done (cudaEventElapsedTime: cudaErrorNotReady).
  double seconds_between(std::size_t start, std::size_t end) {
    return call([&] {
      const auto finished = [&](std::size_t id) {
        const event_state& e = queues_.event(id);
        if (!e.timing) fail("seconds_between: event #", id, " was created without timing");
        if (e.last_record == nullptr) fail("seconds_between: event #", id, " has never been recorded");
        if (!ordered_before(e.last_record->at, host_clock_))
          fail("seconds_between: the last record of event #", id,
               " is not complete as far as the host knows (synchronize with it first; CUDA: cudaErrorNotReady)");
        return e.last_record;
      };
      const std::shared_ptr<const op> first = finished(start), second = finished(end);
      if (queues_.event(start).device != queues_.event(end).device)
        fail("seconds_between: event #", start, " is of device ", queues_.event(start).device, ", event #", end, " of device ",
             queues_.event(end).device);
      return second->finished_at - first->finished_at;
    });
  }

  // ---- copies and fills ----
  // A pageable host side is what CUDA makes of it: a pageable source is staged when the copy is issued
  // (the caller may reuse it once the call returns), and a copy into pageable memory returns only once it
  // has landed, in stream order (the host waits for the stream up to it).
  void copy(const std::vector<copy_range>& ranges, std::size_t stream, const char* what) {
    call([&] {
      std::vector<op_access> accesses;
      std::vector<copy_range> work;
      auto staged = std::make_shared<std::vector<std::vector<char>>>();
      bool lands_in_pageable = false;
      double seconds = op_latency_seconds;
      for (const copy_range& r : ranges) {
        if (r.bytes == 0) continue;
        const auto dst = reinterpret_cast<std::uintptr_t>(r.dst), src = reinterpret_cast<std::uintptr_t>(r.src);
        const allocation* to = async_side(dst, r.bytes, r.dst_owner, what, "destination");
        const allocation* from = async_side(src, r.bytes, r.src_owner, what, "source");
        if (to == nullptr && from == nullptr) fail(what, ": both sides are pageable host memory");
        if (dst < src + r.bytes && src < dst + r.bytes)
          fail(what, ": source and destination overlap (", describe_bytes(to != nullptr ? *to : *from, dst, dst + r.bytes), ")");
        copy_range piece = r;
        if (from != nullptr) {
          accesses.push_back({*from, src, src + r.bytes, access_kind::read});
        } else {
          staged->emplace_back(static_cast<const char*>(r.src), static_cast<const char*>(r.src) + r.bytes);
          piece.src = staged->back().data();
        }
        if (to != nullptr) accesses.push_back({*to, dst, dst + r.bytes, access_kind::write});
        else lands_in_pageable = true;
        const bool local = to != nullptr && from != nullptr && to->owner == from->owner && to->owner != pinned_host;
        seconds += static_cast<double>(r.bytes) / (local ? device_bytes_per_second : link_bytes_per_second);
        work.push_back(piece);
      }
      if (work.empty()) return;
      ++counts_.copies;
      enqueue(stream, what, std::move(accesses), [work, staged] {
        for (const copy_range& r : work) std::memcpy(r.dst, r.src, r.bytes);
      }, seconds);
      if (lands_in_pageable) drain_and_join(stream);
    });
  }
  void memset(void* dst, int byte, std::size_t bytes, std::size_t stream) {
    call([&] {
      if (bytes == 0) return;
      const auto lo = reinterpret_cast<std::uintptr_t>(dst);
      const allocation& to = async_device_or_pinned(lo, bytes, "memset_async", "destination");
      ++counts_.memsets;
      enqueue(stream, "memset_async", {{to, lo, lo + bytes, access_kind::write}}, [dst, byte, bytes] { std::memset(dst, byte, bytes); },
              op_latency_seconds + static_cast<double>(bytes) / device_bytes_per_second);
    });
  }
  // A kernel (thrust::fill_n on CUDA): the stream's device must reach the values.
  template <class U>
  void fill(U* dst, std::size_t count, U value, std::size_t stream) {
    call([&] {
      if (count == 0) return;
      const auto lo = reinterpret_cast<std::uintptr_t>(dst), hi = lo + count * sizeof(U);
      const allocation to = reached_by_kernel(lo, hi, stream, "fill_async");
      ++counts_.memsets;
      enqueue(stream, "fill_async", {{to, lo, hi, access_kind::write}}, [dst, count, value] { std::fill_n(dst, count, value); },
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
        const allocation from = reached_by_kernel(lo, hi, stream, "find_first");
        enqueue(stream, "find_first", {{from, lo, hi, access_kind::read}},
                [data, count, value, found] { *found = static_cast<std::size_t>(std::find(data, data + count, value) - data); },
                op_latency_seconds + static_cast<double>(hi - lo) / device_bytes_per_second);
      }
      drain_and_join(stream);
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
      const auto device_side = reinterpret_cast<std::uintptr_t>(to_device ? dst : src);
      const auto host_side = reinterpret_cast<std::uintptr_t>(to_device ? src : dst);
      const placement device =
          memory_.place(device_side, device_side + bytes, [&] { return make_message(what, ": the device side"); });
      if (device.holder == nullptr || device.holder->owner == pinned_host)
        fail(what, ": the device side at ", address_text(device_side), " is not device memory (",
             device.holder == nullptr ? "pageable host memory" + memory_.after_text(device_side) : describe(*device.holder), ")");
      const placement host = memory_.place(host_side, host_side + bytes, [&] { return make_message(what, ": the host side"); });
      if (host.holder != nullptr && host.holder->owner != pinned_host)
        fail(what, ": the host side is ", describe(*host.holder), ", not host memory");
      const auto kind = [](bool writes) { return writes ? access_kind::write : access_kind::read; };
      std::vector<op_access> accesses{{*device.holder, device_side, device_side + bytes, kind(to_device)}};
      if (host.holder != nullptr) accesses.push_back({*host.holder, host_side, host_side + bytes, kind(!to_device)});
      host_op(what, accesses);
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
      host_op(what, {{*place.holder, lo, lo + bytes, plain_kind(access)}});
    });
  }
  // Host code acting as `stream`'s own work: what is pending on the stream runs first, then the access
  // is an op of the stream made now (ordered after the stream's work and the host's past; the host
  // clock is not joined).
  void stream_host_access(std::size_t stream, const void* pointer, std::size_t bytes, operand_access access) {
    call([&] {
      run_until([&] { return queues_.stream(stream).pending.empty(); });
      if (bytes == 0) return;
      stream_state& s = queues_.stream(stream);
      const auto lo = reinterpret_cast<std::uintptr_t>(pointer);
      const placement place = memory_.place(lo, lo + bytes, [] { return std::string("stream_host_access"); });
      if (place.holder == nullptr) return;
      if (place.holder->owner != pinned_host)
        check_device_reaches(memory_, s.device, place, peers_enabled_, lo,
                             [&] { return make_message("stream_host_access as ", stream_text(s)); });
      join(s.clock, host_clock_);
      const epoch at{s.component, tick(s.clock, s.component)};
      const std::uint64_t sequence = ++op_sequence_;
      const auto name = std::make_shared<const std::string>(make_message("host access as ", stream_text(s), " (op #", sequence, ")"));
      check_and_record({{*place.holder, lo, lo + bytes, plain_kind(access)}}, s.clock, at, sequence, name);
    });
  }
  // What the CUDA executor learns from cudaGetLastError: here, only violations kept from frees.
  void check_user_launches() {
    call([] {});
  }

  // ---- launches ----
  // The multi-tensor kernel: for each chunk of the run, Policy::threads_per_block threads, thread k
  // calling process_chunk (kernels/agents.hpp) as the kernel does, with every access checked against
  // the agent's declared operands.
  template <class Policy, class Agent>
  void launch(const Agent& agent, const std::vector<tensor_chunk>& chunks, int table_device, std::size_t stream, chunk_group run) {
    call([&] {
      const std::string name = make_message("launch of ", type_name<Agent>());
      const std::vector<tensor_chunk> launched = launch_run(name, chunks, run, table_device, stream, "chunk table");
      if (launched.empty()) return;
      const int device = queues_.stream(stream).device;
      operand_collector collect(memory_, peers_enabled_, device, launched.data(), launched.size(), Policy::vector_elements, name);
      agent.operands(collect);
      ++counts_.launches;
      enqueue_launch(stream, name, std::move(collect).finish(), [agent, launched] {
        for (const tensor_chunk& chunk : launched) {
          for (unsigned thread = 0; thread < unsigned(Policy::threads_per_block); ++thread)
            process_chunk<Policy::vector_elements>(agent, chunk, thread, unsigned(Policy::threads_per_block));
        }
      });
    });
  }
  // The screen kernel (cuda/screen_kernel.cuh): per tile of the run, screen_lane for lanes 0..31 and
  // pairwise_lane_sum, as one warp does it; the tile's sum into tile_sums, the least non-finite key
  // lowered into *key. An empty run launches nothing.
  template <class Source, class T>
  void screen_launch(const Source& source, const pointer_table<T>& averaged, const std::vector<tensor_chunk>& tiles, int screen_device,
                     double* tile_sums, nonfinite_key* key, std::size_t stream, chunk_group run) {
    call([&] {
      const std::string name = make_message("screen launch of ", type_name<Source>());
      const std::vector<tensor_chunk> launched = launch_run(name, tiles, run, screen_device, stream, "screen");
      if (launched.empty()) return;
      const int device = queues_.stream(stream).device;
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
    });
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
        throw_found();
      } else {
        auto result = body();
        throw_found();
        return result;
      }
    } catch (...) {
      found_.clear();
      throw;
    }
  }
  static void throw_first(std::vector<std::string>& violations) {
    if (violations.empty()) return;
    const std::string first = violations.front();
    const std::size_t more = violations.size() - 1;
    violations.clear();
    if (more == 0) fail(first);
    fail(first, " (and ", more, " more violation(s) found with it)");
  }
  void throw_kept() { throw_first(kept_); }
  void throw_found() { throw_first(found_); }

  static access_kind plain_kind(operand_access access) {
    return access == operand_access::read ? access_kind::read : access_kind::write;
  }

  std::string stream_text(const stream_state& s) const {
    return make_message("stream '", s.label, "' (#", s.component, ", device ", s.device, ")");
  }

  // The chunks [run.first, run.last) of a launch, after the checks every launch makes.
  std::vector<tensor_chunk> launch_run(const std::string& name, const std::vector<tensor_chunk>& chunks, chunk_group run,
                                       int table_device, std::size_t stream, const char* table) {
    if (run.last == every_chunk.last) run.last = chunks.size();
    if (run.first > run.last || run.last > chunks.size())
      fail(name, ": chunks [", run.first, ", ", run.last, ") launched from a ", table, " of ", chunks.size());
    const stream_state& s = queues_.stream(stream);
    if (s.device != table_device) fail(name, ": a ", table, " of device ", table_device, " launched on ", stream_text(s));
    const auto current = current_.find(std::this_thread::get_id());
    const int current_device = current == current_.end() ? 0 : current->second;
    if (current_device != s.device)
      fail(name, ": launched on ", stream_text(s), " while device ", current_device,
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
    enqueue(stream, name, std::move(accesses), [this, operands, name, body] {
      operand_checker checker(*operands, memory_, name);
      {
        const scoped_access_recorder on(checker);
        body();
      }
      const std::string violation = checker.violation();
      if (!violation.empty()) fail(violation);
    }, seconds);
  }

  // One side of an asynchronous copy or memset: device memory or pinned host memory; null for pageable
  // host memory, which only a copy takes (copy() says how).
  const allocation* async_side(std::uintptr_t lo, std::size_t bytes, int owner, const char* what, const char* side) const {
    const placement place = memory_.place(lo, lo + bytes, [&] { return make_message(what, ": the ", side); });
    if (place.holder == nullptr) {
      if (owner != any_owner) fail(what, ": the ", side, " at ", address_text(lo), " is pageable host memory, not memory of device ", owner);
      return nullptr;
    }
    if (owner != any_owner && place.holder->owner != owner)
      fail(what, ": the ", side, " is ", describe(*place.holder), ", not memory of device ", owner);
    return place.holder;
  }
  // The same where pageable memory cannot take part (a memset: CUDA would not run it in stream order).
  const allocation& async_device_or_pinned(std::uintptr_t lo, std::size_t bytes, const char* what, const char* side) const {
    const allocation* holder = async_side(lo, bytes, any_owner, what, side);
    if (holder == nullptr)
      fail(what, ": the ", side, " at ", address_text(lo), memory_.after_text(lo),
           " is pageable host memory; asynchronous work needs device or pinned memory (CUDA would not run it in stream order)");
    return *holder;
  }
  allocation reached_by_kernel(std::uintptr_t lo, std::uintptr_t hi, std::size_t stream, const char* what) const {
    const stream_state& s = queues_.stream(stream);
    const placement place = memory_.place(lo, hi, [&] { return std::string(what); });
    check_device_reaches(memory_, s.device, place, peers_enabled_, lo, [&] { return make_message(what, " on ", stream_text(s)); });
    return *place.holder;
  }

  std::shared_ptr<op> enqueue(std::size_t stream, const std::string& what, std::vector<op_access> accesses, std::function<void()> work,
                              double seconds, std::shared_ptr<const op> awaited = nullptr) {
    stream_state& s = queues_.stream(stream);
    auto o = std::make_shared<op>();
    o->sequence = ++op_sequence_;
    o->name = std::make_shared<const std::string>(make_message(what, " (op #", o->sequence, ") on ", stream_text(s)));
    o->stream = stream;
    join(s.clock, host_clock_);
    if (awaited != nullptr) join(s.clock, awaited->clock);
    o->at = {s.component, tick(s.clock, s.component)};
    o->clock = s.clock;
    o->accesses = std::move(accesses);
    o->awaited = std::move(awaited);
    o->work = std::move(work);
    o->seconds = seconds;
    s.pending.push_back(o);
    return o;
  }

  template <class Done>
  void run_until(const Done& done) {
    while (!done()) {
      const std::shared_ptr<op> next = queues_.take_next();
      if (next == nullptr) fail("simulation: the awaited work cannot run (nothing is ready)");
      execute(*next);
    }
  }

  void execute(op& o) {
    for (const op_access& a : o.accesses) {
      history_.conflicts(a.holder.id, a.lo, a.hi, a.kind, o.clock, [&](const access_record& earlier) {
        report_race(earlier.op, o.sequence, race_text(a.holder, *earlier.by, earlier.kind, earlier.lo, earlier.hi, *o.name, a, ""));
      });
    }
    if (o.work) {
      try {
        o.work();
      } catch (...) {
        found_.push_back(current_exception_text());
      }
      o.work = nullptr;  // what it captured goes
    }
    for (const op_access& a : o.accesses) history_.record(a.holder.id, {a.lo, a.hi, a.kind, o.at, o.sequence, o.name}, o.clock);
    stream_state& s = queues_.stream(o.stream);
    const double start = std::max(s.ready_at, o.awaited != nullptr ? o.awaited->finished_at : 0.0);
    o.finished_at = s.ready_at = start + o.seconds;
    o.executed = true;
  }

  void drain_and_join(std::size_t stream) {
    run_until([&] { return queues_.stream(stream).pending.empty(); });
    join(host_clock_, queues_.stream(stream).clock);
  }

  // An access the host makes now, as one op of its own.
  void host_op(const std::string& what, const std::vector<op_access>& accesses) {
    const epoch at{host_component, tick(host_clock_, host_component)};
    const std::uint64_t sequence = ++op_sequence_;
    const auto name = std::make_shared<const std::string>(make_message("the host's ", what, " (op #", sequence, ")"));
    check_and_record(accesses, host_clock_, at, sequence, name);
  }

  // Accesses made now by the host or as a stream: checked against what ran and against what is still
  // pending (which nothing orders before them: a synchronisation would have run it), then recorded.
  void check_and_record(const std::vector<op_access>& accesses, const vector_clock& clock, const epoch& at, std::uint64_t sequence,
                        const std::shared_ptr<const std::string>& name) {
    for (const op_access& a : accesses) {
      history_.conflicts(a.holder.id, a.lo, a.hi, a.kind, clock, [&](const access_record& earlier) {
        report_race(earlier.op, sequence, race_text(a.holder, *earlier.by, earlier.kind, earlier.lo, earlier.hi, *name, a, ""));
      });
      for (const stream_state& s : queues_.streams()) {
        for (const std::shared_ptr<op>& pending : s.pending) {
          for (const op_access& p : pending->accesses) {
            if (p.holder.id == a.holder.id && p.lo < a.hi && a.lo < p.hi && conflicting(p.kind, a.kind))
              report_race(pending->sequence, sequence,
                          race_text(a.holder, *pending->name, p.kind, p.lo, p.hi, *name, a, ", still pending,"));
          }
        }
      }
    }
    for (const op_access& a : accesses) history_.record(a.holder.id, {a.lo, a.hi, a.kind, at, sequence, name}, clock);
  }

  // A race between two ops is reported once, however many of their accesses conflict and from whichever
  // side it is seen (a host access that raced with pending work meets it again when the work runs).
  void report_race(std::uint64_t one, std::uint64_t other, std::string text) {
    if (reported_.insert({std::min(one, other), std::max(one, other)}).second) found_.push_back(std::move(text));
  }

  static std::string race_text(const allocation& holder, const std::string& earlier, access_kind earlier_kind,
                               std::uintptr_t earlier_lo, std::uintptr_t earlier_hi, const std::string& later, const op_access& access,
                               const char* earlier_state) {
    const auto bytes = [&](std::uintptr_t lo, std::uintptr_t hi) {
      return make_message("bytes [", lo - holder.base, ", ", hi - holder.base, ")");
    };
    return make_message("race on ", describe(holder), ": ", earlier, earlier_state, " ", verb(earlier_kind), " ",
                        bytes(earlier_lo, earlier_hi), " and ", later, " ", verb(access.kind), " ", bytes(access.lo, access.hi),
                        ", and no event wait or host synchronisation orders them");
  }

  const sim::machine_config config_;
  std::mutex mutex_;
  memory_registry memory_;
  access_history history_;
  op_queues queues_;
  vector_clock host_clock_{0};
  std::set<std::pair<int, int>> peers_enabled_;
  std::map<std::thread::id, int> current_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> reported_;  // races, as pairs of op sequence numbers
  std::vector<std::string> found_;  // by the call under way
  std::vector<std::string> kept_;   // by frees, for the next call
  sim::op_counts counts_;
  std::uint64_t op_sequence_ = 0;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
