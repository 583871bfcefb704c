#pragma once
// cuda_executor — the executor (docs/architecture.md, "The executor") on CUDA GPUs: a thin shell over streams, events,
// kernel launches (cuda/multi_tensor_dispatch.cuh, cuda/screen_kernel.cuh) and cudaMemcpy*Async. Every
// call is checked (TOWERPIPE_CUDA_CHECK names the call, file and line). The declarations the simulation
// checks (host_reads, host_writes, stream_host_access) cost nothing here.

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <chrono>
#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/find_first.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

class cuda_executor {
 public:
  static constexpr const char* name = "cuda";
  static constexpr const char* device_kind = "CUDA";
  using stream = cuda_stream;
  using event = cuda_event;
  using chunk_table = device_chunk_table;
  template <class T>
  using pointer_table = device_pointer_table<T>;
  using screen = device_screen;
  using find_scratch = first_equal_scratch;
  class device_guard : public detail::device_guard {
   public:
    device_guard(const cuda_executor&, int device) : detail::device_guard(device) {}
  };
  // An NVTX range around a pipeline stage, so that Nsight Systems shows it beside the kernels (NVTX 3 is header-only
  // and costs next to nothing when no tool is attached).
  class range {
   public:
    range(const cuda_executor&, const char* name) { nvtxRangePushA(name); }
    ~range() { nvtxRangePop(); }
    range(const range&) = delete;
    range& operator=(const range&) = delete;
  };
  // Device event times on the host clock: an event that a device completed at a known host time is the origin; any
  // later timing event recorded on that device converts to host time through the elapsed time between the two (towers
  // on different devices share no device clock).
  class clock {
   public:
    // Records the origin on `stream` and waits for it: call once, before the work to be timed.
    clock(const cuda_executor& exec, int device, const cuda_stream& stream) : origin_(device, true) {
      exec.record(origin_, stream);
      exec.synchronize(origin_);
      origin_host_ = timeline::clock::now();
    }

    // The host time at which `event` (a completed timing event of this device) happened.
    timeline::clock::time_point host_time(const cuda_event& event) const {
      return origin_host_ + std::chrono::duration_cast<timeline::clock::duration>(
                                std::chrono::duration<double>(seconds_between(origin_, event)));
    }

   private:
    cuda_event origin_;
    timeline::clock::time_point origin_host_;
  };

  cuda_executor() = default;
  // As the device towers make it, from their pipeline_options (nothing to take from them).
  template <class Options>
  explicit cuda_executor(const Options&) {}

  cuda_device_memory device_memory(int device) const { return {device}; }
  cuda_pinned_memory pinned_memory() const { return {}; }

  int device_count() const { return cuda_device_count(); }
  // Enables peer access between every pair of distinct devices that allows it; returns the pairs (a, b) where a can
  // read and write b's memory directly.
  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) const {
    std::set<std::pair<int, int>> peers;
    const std::set<int> distinct(devices.begin(), devices.end());
    for (int a : distinct) {
      for (int b : distinct) {
        if (a == b) continue;
        int can = 0;
        TOWERPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
        if (!can) continue;
        const detail::device_guard on(a);
        const cudaError_t status = cudaDeviceEnablePeerAccess(b, 0);
        if (status == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else TOWERPIPE_CUDA_CHECK(status);
        peers.insert({a, b});
      }
    }
    return peers;
  }
  bool native_peer_atomics(int a, int b) const {
    int atomics = 0;
    TOWERPIPE_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, a, b));
    return atomics != 0;
  }

  void record(const event& e, const stream& s) const { TOWERPIPE_CUDA_CHECK(cudaEventRecord(e.get(), s.get())); }
  void wait(const stream& s, const event& e) const { TOWERPIPE_CUDA_CHECK(cudaStreamWaitEvent(s.get(), e.get(), 0)); }
  void synchronize(const event& e) const { TOWERPIPE_CUDA_CHECK(cudaEventSynchronize(e.get())); }
  void synchronize(const stream& s) const { TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(s.get())); }
  void synchronize_device(int device) const {
    const detail::device_guard on(device);
    TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Milliseconds between two timing events recorded on one device, converted to seconds.
  static double seconds_between(const event& start, const event& end) {
    float milliseconds = 0;
    TOWERPIPE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.get(), end.get()));
    return milliseconds * 1e-3;
  }

  void copy_async(void* dst, const void* src, std::size_t bytes, const stream& s) const {
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.get()));
  }
  void copy_peer_async(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes, const stream& s) const {
    TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, s.get()));
  }
  // In stream order (srcAccessOrder = stream), one call for several ranges.
  void copy_batch_async(void* const* dsts, const void* const* srcs, const std::size_t* bytes, std::size_t count, const stream& s) const {
    cudaMemcpyAttributes in_stream_order{};
    in_stream_order.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t first_copy = 0;
    TOWERPIPE_CUDA_CHECK(cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs), const_cast<std::size_t*>(bytes), count,
                                              &in_stream_order, &first_copy, 1, s.get()));
  }
  void memset_async(void* dst, int byte, std::size_t bytes, const stream& s) const {
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, s.get()));
  }
  template <class U>
  void fill_async(U* dst, std::size_t count, U value, const stream& s) const {
    if (count == 0) return;
    fill_kernel<<<grid_for(count), fill_threads, 0, s.get()>>>(dst, count, value);
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  }
  // Waits for the stream: the index of the first element equal to `value`, or count.
  template <class U>
  std::size_t find_first(const U* data, std::size_t count, U value, const stream& s, const find_scratch& scratch) const {
    if (count == 0) return 0;
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(scratch.device(), 0xFF, sizeof(unsigned long long), s.get()));
    first_equal_kernel<<<grid_for(count), fill_threads, 0, s.get()>>>(data, count, value, scratch.device());
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
    TOWERPIPE_CUDA_CHECK(
        cudaMemcpyAsync(scratch.host(), scratch.device(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, s.get()));
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    const unsigned long long first = *scratch.host();
    return first == ~0ull ? count : static_cast<std::size_t>(first);
  }

  void copy_to_device_now(void* dst, const void* src, std::size_t bytes) const { detail::copy_to_device_now(dst, src, bytes); }
  void copy_to_host_now(void* dst, const void* src, std::size_t bytes) const {
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }

  void host_reads(const void*, std::size_t) const {}
  void host_writes(void*, std::size_t) const {}
  void stream_host_access(const stream&, const void*, std::size_t, operand_access) const {}
  // A launch the tower function made with bad arguments.
  void check_user_launches() const { TOWERPIPE_CUDA_CHECK(cudaGetLastError()); }
};

}  // namespace detail
}  // namespace towerpipe
