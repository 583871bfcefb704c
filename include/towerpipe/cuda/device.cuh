#pragma once
// Owning wrappers of the CUDA objects the towers use — streams, events — and the current-device guard.
// Each remembers its device, so that destroying it from any thread is correct.

#include <cuda_runtime.h>

#include <new>
#include <utility>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"

namespace towerpipe {
namespace detail {

inline int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return 0;
  }
  TOWERPIPE_CUDA_CHECK(status);
  return count;
}

// Whether `device`'s primary context is active, from the driver (cuDevicePrimaryCtxGetState, found
// through the runtime, so that nothing links libcuda); true where the driver cannot say.
inline bool primary_context_active(int device) noexcept {
  using get_state = int (*)(int, unsigned int*, int*);  // CUresult (CUdevice, unsigned*, int*)
  static const get_state query = [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &found, 12000, cudaEnableDefault, &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return get_state{};
    }
    return reinterpret_cast<get_state>(found);
  }();
  unsigned int flags = 0;
  int active = 1;
  return query == nullptr || query(device, &flags, &active) != 0 || active != 0;
}

// Makes `device` current for the guard's lifetime, then the device current before — only where that
// device's context is active: since CUDA 12 cudaSetDevice creates the context, and restoring device 0
// on a fresh thread would give every process a context on GPU 0. The std::nothrow form, for
// destructors, reports a failure through the log sink instead of throwing.
class device_guard {
 public:
  explicit device_guard(int device) {
    TOWERPIPE_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device == previous_) return;
    restore_ = primary_context_active(previous_);
    TOWERPIPE_CUDA_CHECK(cudaSetDevice(device));
  }
  device_guard(int device, std::nothrow_t) noexcept {
    if (!TOWERPIPE_CUDA_RELEASE(cudaGetDevice(&previous_)) || device == previous_) return;
    restore_ = primary_context_active(previous_);
    if (!TOWERPIPE_CUDA_RELEASE(cudaSetDevice(device))) restore_ = false;
  }
  ~device_guard() {
    if (restore_) TOWERPIPE_CUDA_RELEASE(cudaSetDevice(previous_));
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

class cuda_stream {
 public:
  explicit cuda_stream(int device) : device_(device) {
    device_guard on(device);
    TOWERPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // As the executor makes them (cuda/executor.cuh); the label is for the simulation's messages.
  template <class Executor>
  cuda_stream(const Executor&, int device, const char* = "") : cuda_stream(device) {}
  ~cuda_stream() {
    if (stream_ == nullptr) return;
    const device_guard on(device_, std::nothrow);
    TOWERPIPE_CUDA_RELEASE(cudaStreamDestroy(stream_));
  }
  cuda_stream(cuda_stream&& other) noexcept
      : device_(other.device_), stream_(std::exchange(other.stream_, nullptr)) {}
  cuda_stream& operator=(cuda_stream&&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

class cuda_event {
 public:
  // Timing events cost a little more; ordering-only events are created without timing.
  explicit cuda_event(int device, bool timing = false) : device_(device) {
    device_guard on(device);
    TOWERPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  template <class Executor>
  cuda_event(const Executor&, int device, bool timing = false) : cuda_event(device, timing) {}
  ~cuda_event() {
    if (event_ == nullptr) return;
    const device_guard on(device_, std::nothrow);
    TOWERPIPE_CUDA_RELEASE(cudaEventDestroy(event_));
  }
  cuda_event(cuda_event&& other) noexcept : device_(other.device_), event_(std::exchange(other.event_, nullptr)) {}
  cuda_event& operator=(cuda_event&&) = delete;

  cudaEvent_t get() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace detail
}  // namespace towerpipe
