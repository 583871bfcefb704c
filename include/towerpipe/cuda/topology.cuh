#pragma once
// Where towers run: each tower's device, and peer access between the distinct devices.

#include <cuda_runtime.h>

#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"

namespace towerpipe {
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
}  // namespace towerpipe
