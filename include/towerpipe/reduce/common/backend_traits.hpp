#pragma once
// backend_traits — what the rest of the library knows of a reduction backend, as plain values: its name,
// the towers it takes, and the cost model reduce::automatic's chooser compares (reduce/choice/chooser.hpp).
// Each backend's policy type (reduce::host, ...) holds its own as `static constexpr backend_traits traits`;
// the list of backends is reduce/choice/backends.hpp.

#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

namespace towerpipe {

struct backend_traits {
  const char* name;      // reduce::<name>
  bool host_towers;      // takes exec::host's towers
  bool device_towers;    // takes GPU towers (exec::cuda, exec::simulated)
  bool spans_processes;  // takes pipeline_options::processes
  // Host towers in one process: the time of a step relative to the fastest measured (0: takes none).
  double host_tower_cost;
  // GPU towers on one device: bytes through that device's memory per parameter, for `towers` towers
  // of `element_bytes`-byte gradients (Adam).
  double (*one_device_bytes)(std::size_t towers, std::size_t element_bytes);
  // GPU towers on several devices: gradient or parameter elements the busiest device's link carries each
  // way per parameter, towers on `devices` (one entry per tower).
  double (*busiest_link_elements)(const std::vector<int>& devices);
  bool host_pass;    // a pass over host memory follows the transfers (the host parameter server)
  const char* note;  // what backs the model where this backend wins, for the chooser's reason
};

namespace detail {

// Per device: how many of the towers on `devices` (one entry per tower) it runs.
inline std::map<int, std::size_t> towers_per_device(const std::vector<int>& devices) {
  std::map<int, std::size_t> count;
  for (int d : devices) ++count[d];
  return count;
}

// Bytes through device memory per parameter of one fused pass over N towers' gradients (Adam): the
// gradients read, the replicas written (element_bytes each), the two state slots read and written, the
// master read (fp32: it is replica 0) or read and written (16-bit towers keep an fp32 master apart).
inline double fused_pass_bytes(std::size_t towers, std::size_t element_bytes) {
  return static_cast<double>(2 * towers * element_bytes) + 16 + (element_bytes >= 4 ? 4 : 8);
}

// The largest of a per-device load.
inline double busiest(const std::map<int, double>& load) {
  double most = 0;
  for (const auto& entry : load) most = std::max(most, entry.second);
  return most;
}

}  // namespace detail
}  // namespace towerpipe
