#pragma once
// cuda_executor — the executor (docs/architecture.md, "The executor") on CUDA GPUs: a thin shell over streams, events,
// kernel launches (cuda/multi_tensor_dispatch.cuh, cuda/screen_kernel.cuh) and cudaMemcpy*Async. Every
// call is checked (TOWERPIPE_CUDA_CHECK names the call, file and line). The declarations the simulation
// checks (host_reads, host_writes, stream_host_access) cost nothing here.

#include <cuda_runtime.h>

#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/device_clock.cuh"
#include "towerpipe/cuda/find_first.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/cuda/topology.cuh"
#include "towerpipe/kernels/operands.hpp"

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
  using clock = device_clock;
  using find_scratch = first_equal_scratch;
  class device_guard : public detail::device_guard {
   public:
    device_guard(const cuda_executor&, int device) : detail::device_guard(device) {}
  };
  class range : public nvtx_range {
   public:
    range(const cuda_executor&, const char* name) : nvtx_range(name) {}
  };

  cuda_executor() = default;
  // As the device towers make it, from their pipeline_options (nothing to take from them).
  template <class Options>
  explicit cuda_executor(const Options&) {}

  cuda_device_memory device_memory(int device) const { return {device}; }
  cuda_pinned_memory pinned_memory() const { return {}; }

  int device_count() const { return cuda_device_count(); }
  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) const { return detail::enable_peer_access(devices); }
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
  double seconds_between(const event& start, const event& end) const { return detail::seconds_between(start, end); }

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
    launch_fill(dst, count, value, s);
  }
  template <class U>
  std::size_t find_first(const U* data, std::size_t count, U value, const stream& s, const find_scratch& scratch) const {
    return launch_find_first(data, count, value, s, scratch);
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
