#pragma once
// The simulated devices themselves: which exist (machine_config), which peer accesses have been
// enabled, and each host thread's current device. Not thread-safe: the engine
// (executor/simulated/engine.hpp) calls it under its lock.

#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/machine_config.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

class device_state {
 public:
  explicit device_state(const sim::machine_config& config) : config_(config) {
    if (config.devices < 0) fail("simulated machine: ", config.devices, " devices");
    const auto check_pairs = [&](const std::set<std::pair<int, int>>& pairs, const char* what) {
      for (const auto& [a, b] : pairs) {
        check(a, what);
        check(b, what);
      }
    };
    check_pairs(config.peers, "machine_config::peers");
    check_pairs(config.native_atomics, "machine_config::native_atomics");
  }

  const sim::machine_config& config() const { return config_; }
  void check(int device, const char* what) const {
    if (device < 0 || device >= config_.devices)
      fail(what, ": simulated device ", device, " does not exist (", config_.devices, " device(s))");
  }

  // The calling thread's current device (0 until a device_guard sets one), as CUDA keeps it per thread.
  int current() const {
    const auto found = current_.find(std::this_thread::get_id());
    return found == current_.end() ? 0 : found->second;
  }
  // Returns the previous one.
  int set_current(int device) { return std::exchange(current_[std::this_thread::get_id()], device); }

  std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& devices) {
    for (int d : devices) check(d, "enable_peer_access");
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
  }
  const std::set<std::pair<int, int>>& peers_enabled() const { return peers_enabled_; }
  bool native_peer_atomics(int a, int b) const {
    check(a, "native_peer_atomics");
    check(b, "native_peer_atomics");
    return config_.native_atomics.count({a, b}) != 0 || config_.native_atomics.count({b, a}) != 0;
  }

 private:
  const sim::machine_config config_;
  std::set<std::pair<int, int>> peers_enabled_;
  std::map<std::thread::id, int> current_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
