#pragma once
// Peer access between the towers' distinct devices (the CUDA executor's enable_peer_access).

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
