#pragma once
// detail::simulated_executor — the executor interface of the device reducers (as the CUDA executor) on a simulated
// machine in plain C++, failing where a GPU would misbehave. Handles may outlive the executor and die on any thread.
// Why: docs/design-notes.md#executor-simulated-executor

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/executor/simulated/engine.hpp"
#include "towerpipe/executor/simulated/machine.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

class simulated_executor {
 public:
  static constexpr const char* name = "simulated";
  static constexpr const char* device_kind = "simulated";

  explicit simulated_executor(std::shared_ptr<sim::machine> m) : machine_(std::move(m)) {
    if (machine_ == nullptr) fail("simulated_executor: no machine");
  }
  // As the device towers make it, from their pipeline_options: its simulation, or a machine of one device.
  template <class Options, class = decltype(std::declval<const Options&>().simulation)>
  explicit simulated_executor(const Options& options)
      : simulated_executor(options.simulation ? options.simulation : std::make_shared<sim::machine>()) {}
  sim::machine& machine() const { return *machine_; }

  // ---- handles ----
  class stream {
   public:
    stream(const simulated_executor& exec, int device, const char* label = "")
        : machine_(exec.machine_), device_(device), id_(engine_of(*machine_).create_stream(device, label)) {}
    stream(stream&&) noexcept = default;
    stream& operator=(stream&&) = delete;
    int device() const { return device_; }
    // What a tower function is handed as its stream (a cudaStream_t on CUDA): this handle.
    const stream* get() const { return this; }

   private:
    friend class simulated_executor;
    std::shared_ptr<sim::machine> machine_;
    int device_;
    std::size_t id_;
  };

  class event {
   public:
    event(const simulated_executor& exec, int device, bool timing = false)
        : machine_(exec.machine_), device_(device), id_(engine_of(*machine_).create_event(device, timing)) {}
    event(event&&) noexcept = default;
    event& operator=(event&&) = delete;
    int device() const { return device_; }

   private:
    friend class simulated_executor;
    std::shared_ptr<sim::machine> machine_;
    int device_;
    std::size_t id_;
  };

  class device_guard {
   public:
    device_guard(const simulated_executor& exec, int device)
        : machine_(exec.machine_), previous_(engine_of(*machine_).set_current_device(device)) {}
    ~device_guard() { engine_of(*machine_).restore_current_device(previous_); }
    device_guard(const device_guard&) = delete;
    device_guard& operator=(const device_guard&) = delete;

   private:
    std::shared_ptr<sim::machine> machine_;
    int previous_;
  };

  // An NVTX range on CUDA; nothing to show here.
  class range {
   public:
    range(const simulated_executor&, const char*) {}
  };

  // ---- memory spaces (core/host_memory.hpp has the interface) ----
  struct free_simulated {
    std::shared_ptr<sim::machine> machine;
    void operator()(void* pointer) const noexcept { engine_of(*machine).free(pointer); }
  };

  struct device_memory_space {
    const simulated_executor* exec = nullptr;
    int device = 0;
    template <class T>
    using owner = std::unique_ptr<T[], free_simulated>;
    template <class T>
    owner<T> allocate(std::size_t count, std::size_t alignment) const {
      return executor_of(exec, "device_memory").template allocate_owned<T>(count, alignment, device);
    }
  };

  struct pinned_memory_space {
    const simulated_executor* exec = nullptr;
    template <class T>
    using owner = std::unique_ptr<T[], free_simulated>;
    template <class T>
    owner<T> allocate(std::size_t count, std::size_t alignment = 0) const {
      return executor_of(exec, "pinned_memory").template allocate_owned<T>(count, alignment, simulation::pinned_host);
    }
  };

  device_memory_space device_memory(int device) const { return {this, device}; }
  pinned_memory_space pinned_memory() const { return {this}; }

  // ---- the machine ----
  int device_count() const { return machine_->config().devices; }
  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) const {
    return engine().enable_peer_access(devices);
  }
  bool native_peer_atomics(int a, int b) const { return engine().native_peer_atomics(a, b); }

  // ---- ordering ----
  void record(const event& e, const stream& s) const { engine().record(event_id(*machine_, e), stream_id(*machine_, s)); }
  void wait(const stream& s, const event& e) const { engine().wait(stream_id(*machine_, s), event_id(*machine_, e)); }
  void synchronize(const event& e) const { engine().synchronize_event(event_id(*machine_, e)); }
  void synchronize(const stream& s) const { engine().synchronize_stream(stream_id(*machine_, s)); }
  void synchronize_device(int device) const { engine().synchronize_device(device); }
  double seconds_between(const event& start, const event& end) const {
    return engine().seconds_between(event_id(*machine_, start), event_id(*machine_, end));
  }

  // ---- copies and fills, in stream order ----
  void copy_async(void* dst, const void* src, std::size_t bytes, const stream& s) const {
    engine().copy({{dst, src, bytes}}, stream_id(*machine_, s), "copy_async");
  }
  void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, const stream& s) const {
    engine().check_device(dst_device, "copy_peer_async");
    engine().check_device(src_device, "copy_peer_async");
    engine().copy({{dst, src, bytes, dst_device, src_device}}, stream_id(*machine_, s), "copy_peer_async");
  }
  void copy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* bytes, std::size_t count,
                        const stream& s) const {
    // cudaMemcpyBatchAsync refuses an empty batch and a zero-byte range (cudaErrorInvalidValue).
    if (count == 0) fail("copy_batch_async: an empty batch (CUDA refuses it: cudaErrorInvalidValue)");
    std::vector<simulation::copy_range> ranges;
    for (std::size_t i = 0; i < count; ++i) {
      if (bytes[i] == 0) fail("copy_batch_async: range ", i, " of ", count, " has no bytes (CUDA refuses it: cudaErrorInvalidValue)");
      ranges.push_back({dsts[i], srcs[i], bytes[i]});
    }
    engine().copy(ranges, stream_id(*machine_, s), "copy_batch_async");
  }
  void memset_async(void* dst, int byte, std::size_t bytes, const stream& s) const {
    engine().memset(dst, byte, bytes, stream_id(*machine_, s));
  }
  template <class U>
  void fill_async(U* dst, std::size_t count, U value, const stream& s) const {
    engine().fill(dst, count, value, stream_id(*machine_, s));
  }
  // The CUDA executor keeps its result word per tower; here there is nothing to keep.
  struct find_scratch {
    find_scratch(const simulated_executor&, int) {}
  };
  template <class U>
  std::size_t find_first(const U* data, std::size_t count, U value, const stream& s, const find_scratch&) const {
    return engine().find_first(data, count, value, stream_id(*machine_, s));
  }

  // ---- the host ----
  void copy_to_device_now(void* dst, const void* src, std::size_t bytes) const { engine().copy_now(dst, src, bytes, true); }
  void copy_to_host_now(void* dst, const void* src, std::size_t bytes) const { engine().copy_now(dst, src, bytes, false); }
  void host_reads(const void* p, std::size_t bytes) const { engine().host_access(p, bytes, operand_access::read, "host_reads"); }
  void host_writes(void* p, std::size_t bytes) const { engine().host_access(p, bytes, operand_access::write, "host_writes"); }
  void stream_host_access(const stream& s, const void* p, std::size_t bytes, operand_access access) const {
    engine().stream_host_access(stream_id(*machine_, s), p, bytes, access);
  }
  void check_user_launches() const { engine().check_user_launches(); }

  // ---- tables on a device and launches over them ----
  class chunk_table {
   public:
    chunk_table(const simulated_executor& exec, const std::vector<tensor_chunk>& chunks, int device)
        : machine_(exec.machine_), device_(device), chunks_(chunks) {
      exec.engine().check_device(device, "chunk_table");
    }
    std::size_t size() const { return chunks_.size(); }

    template <class Policy, class Agent>
    void launch(const Agent& agent, const stream& s, chunk_group run = every_chunk) const {
      static_assert(check_multi_tensor_policy<Policy, typename Agent::value_type>());
      engine_of(*machine_).template launch<Policy>(agent, chunks_, device_, stream_id(*machine_, s), run);
    }

   private:
    std::shared_ptr<sim::machine> machine_;
    int device_;
    std::vector<tensor_chunk> chunks_;  // the device copy a kernel would read: the launch takes its run
  };

  // A pointer table in device memory: the agents index its device copy (view()), as kernels do.
  template <class T>
  class pointer_table {
   public:
    pointer_table(const simulated_executor& exec, const std::vector<T*>& pointers, int variables, int device)
        : variables_(variables),
          pointers_(device_memory_space{&exec, device}.template allocate<T*>(std::max<std::size_t>(pointers.size(), 1), 256)) {
      if (!pointers.empty()) exec.copy_to_device_now(pointers_.get(), pointers.data(), pointers.size() * sizeof(T*));
    }
    detail::pointer_table<T> view() const { return {pointers_.get(), variables_}; }
    detail::pointer_table<const T> const_view() const { return {pointers_.get(), variables_}; }

   private:
    int variables_;
    device_memory_space::owner<T*> pointers_;
  };

  // The gradient screen's tiles and outputs on one device (cuda/screen_kernel.cuh on a GPU).
  class screen {
   public:
    screen(const simulated_executor& exec, std::vector<tensor_chunk> tiles, int device)
        : machine_(exec.machine_),
          device_(device),
          tiles_(std::move(tiles)),
          tile_sums_(device_memory_space{&exec, device}.allocate<double>(std::max<std::size_t>(tiles_.size(), 1), 256)),
          first_nonfinite_(device_memory_space{&exec, device}.allocate<nonfinite_key>(1, 256)),
          host_first_(pinned_memory_space{&exec}.allocate<nonfinite_key>(1)) {}
    screen(const simulated_executor& exec, const variable_set& variables, int device)
        : screen(exec, make_chunk_table(variables, screen_tile_elements), device) {}

    const std::vector<tensor_chunk>& tiles() const { return tiles_; }
    nonfinite_key* first_nonfinite() const { return first_nonfinite_.get(); }
    void reset(const stream& s) const { executor().memset_async(first_nonfinite_.get(), 0xFF, sizeof(nonfinite_key), s); }

    template <class Source, class T>
    void launch(const Source& source, const detail::pointer_table<T>& averaged, const stream& s, chunk_group run = every_chunk) const {
      engine_of(*machine_).screen_launch(source, averaged, tiles_, device_, tile_sums_.get(), first_nonfinite_.get(),
                                         stream_id(*machine_, s), run);
      read_key(s);
    }
    void read_key(const stream& s) const {
      executor().copy_async(host_first_.get(), first_nonfinite_.get(), sizeof(nonfinite_key), s);
    }
    // Host: the tile sums and the key; the caller synchronised with the screen's stream first.
    screen_partials results() const {
      const simulated_executor exec = executor();
      screen_partials partials;
      partials.tile_sums.resize(tiles_.size());
      exec.copy_to_host_now(partials.tile_sums.data(), tile_sums_.get(), tiles_.size() * sizeof(double));
      exec.host_reads(host_first_.get(), sizeof(nonfinite_key));
      partials.first_nonfinite = *host_first_.get();
      return partials;
    }

   private:
    simulated_executor executor() const { return simulated_executor(machine_); }

    std::shared_ptr<sim::machine> machine_;
    int device_;
    std::vector<tensor_chunk> tiles_;
    device_memory_space::owner<double> tile_sums_;
    device_memory_space::owner<nonfinite_key> first_nonfinite_;
    pinned_memory_space::owner<nonfinite_key> host_first_;
  };

  // Device event times on the host clock, for the timeline: the origin is a record the host waited for.
  class clock {
   public:
    clock(const simulated_executor& exec, int device, const stream& s) : machine_(exec.machine_), origin_(exec, device, true) {
      exec.record(origin_, s);
      exec.synchronize(origin_);
      origin_host_ = timeline::clock::now();
    }
    timeline::clock::time_point host_time(const event& timing_event) const {
      const double seconds = simulated_executor(machine_).seconds_between(origin_, timing_event);
      return origin_host_ + std::chrono::duration_cast<timeline::clock::duration>(std::chrono::duration<double>(seconds));
    }

   private:
    std::shared_ptr<sim::machine> machine_;
    event origin_;
    timeline::clock::time_point origin_host_;
  };

 private:
  static simulation::engine& engine_of(const sim::machine& m) { return m.engine_; }
  simulation::engine& engine() const { return engine_of(*machine_); }

  static const simulated_executor& executor_of(const simulated_executor* exec, const char* space) {
    if (exec == nullptr) fail(space, ": no simulated executor to allocate from");
    return *exec;
  }
  // Zero-filled; count == 0 allocates one element (a valid, distinct pointer), as on CUDA.
  template <class T>
  std::unique_ptr<T[], free_simulated> allocate_owned(std::size_t count, std::size_t alignment, int owner) const {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                  "towerpipe: device memory holds trivially copyable values");
    void* raw = engine().allocate(std::max<std::size_t>(count, 1) * sizeof(T), alignment, owner);
    return std::unique_ptr<T[], free_simulated>(static_cast<T*>(raw), free_simulated{machine_});
  }

  static std::size_t stream_id(const sim::machine& m, const stream& s) {
    if (s.machine_.get() != &m) fail("a stream of another simulated machine (or one moved from)");
    return s.id_;
  }
  static std::size_t event_id(const sim::machine& m, const event& e) {
    if (e.machine_.get() != &m) fail("an event of another simulated machine (or one moved from)");
    return e.id_;
  }

  std::shared_ptr<sim::machine> machine_;
};

}  // namespace detail
}  // namespace towerpipe
