#pragma once
// choose_backend(tower_topology) — which reduction backend reduce::automatic runs, and why, from a described
// topology: plain C++, so that every rule is tested with topologies no machine here has.
//
// Every backend gives the same bits (invariant 2), so the choice is about time only. The rules, first
// match wins, with the figures behind them:
//   1. Several processes: reduce::sharded, the only backend that spans them.
//   2. Host towers: reduce::host. In one process there is nothing to spread the optimizer over, and
//      sharding costs its slices' copies: `towerpipe_host_benchmark` timed reduce::sharded at 1.5-5.1x
//      reduce::host's step with 1 and 2 towers (2-core machine, 2026-12-02:
//      benchmarks/results/2026-12-02-dev-backend-choice).
//   3. GPU towers on one device: reduce::device0. It reads each gradient once and writes each replica
//      once (8N + 20 bytes a parameter, Adam), where p2p_tree moves 20N - 4R (1.76x at 8 towers); on one
//      H200 (2026-11-30, ResNet-50, Adam) p2p_tree took 1.03x / 1.42x / 1.70x device0's time at 2 / 4 / 8
//      towers (benchmarks/results/2026-11-30-h200).
//   4. GPU towers on several devices: a model, not a measurement (one GPU was all that could be run).
//      Between devices the links are the narrow part (PCIe 55 GB/s each way against 4.2 TB/s of device
//      memory on the H200 machine), so each candidate is costed by the gradient and parameter elements
//      its busiest device's link carries each way per parameter (bytes_each_way_on_busiest_link below):
//      both the exchange and the broadcast go over it. Without peer access the device backends' copies
//      go through host memory, crossing both devices' links with the same per-link bytes. The host
//      parameter server (reduce::host with GPU towers) moves each tower's gradient down and parameters
//      up over its own device's link, then runs a pass over host memory; it is costed in seconds with
//      the machine's link and host-memory bandwidths (tower_topology::link_bytes_per_second,
//      host_bytes_per_second: the H200 machine's by default), and the device backends likewise, their
//      links taken as no faster than PCIe (which favours the host). Ties go to the backend measured
//      fastest on one device: device0, then p2p_tree, sharded, host.
// pipeline_options::time_backends replaces the model by the user's own machine.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"

namespace towerpipe {

enum class backend_kind { device0, p2p_tree, sharded, host };  // in the order ties are broken

inline const char* backend_name(backend_kind backend) {
  switch (backend) {
    case backend_kind::device0: return "device0";
    case backend_kind::p2p_tree: return "p2p_tree";
    case backend_kind::sharded: return "sharded";
    case backend_kind::host: return "host";
  }
  return "?";
}

// What connects two GPUs, as the runtime tells (cudaDeviceCanAccessPeer; cudaDeviceGetP2PAttribute's
// native atomics mark NVLink). A pair missing from tower_topology::links has none.
enum class peer_link { none, pcie, nvlink };

constexpr int host_device = -1;  // tower_topology::tower_devices: a tower that runs on a CPU thread

struct tower_topology {
  std::vector<int> tower_devices;              // this process's towers: a GPU id each, or host_device
  std::map<std::pair<int, int>, peer_link> links;  // (a, b): a can read and write b's memory
  std::size_t parameters = 0;                  // elements over every variable
  std::size_t element_bytes = 4;               // a gradient element as the towers hold it (2: bf16/fp16)
  int processes = 1;                           // processes the towers span (pipeline_options::processes)
  std::vector<backend_kind> candidates;        // what the execution space and the layout allow
  double link_bytes_per_second = 55.1e9;       // pinned PCIe, H200 machine, 2026-11-30
  double host_bytes_per_second = 111.6e9;      // CPU triad, 16 threads, the same machine

  peer_link link(int a, int b) const {
    const auto found = links.find({a, b});
    return found == links.end() ? peer_link::none : found->second;
  }
};

struct backend_choice {
  backend_kind backend;
  std::string reason;
};

namespace detail {

inline std::map<int, std::size_t> towers_per_device(const std::vector<int>& devices) {
  std::map<int, std::size_t> count;
  for (int d : devices) ++count[d];
  return count;
}

// Gradient or parameter elements the busiest device's link carries each way, per parameter, for one
// step of `backend` over GPU towers on the devices `devices` (one per tower):
//   device0   tower 0's device takes every other device's gradients and sends back their replicas:
//             N - n_0 on its link, n_d on device d's
//   p2p_tree  one element each way per edge of the canonical tree between towers on different devices
//             (the partial up, the parameters pulled down)
//   sharded   each tower owns 1/N: device d receives the contributions to its n_d/N and gathers the
//             others' slices into its n_d replicas, 2 n_d (N - n_d) / N each way
//   host      every tower's gradient down and parameters up: n_d on device d's link
inline double elements_each_way_on_busiest_link(backend_kind backend, const std::vector<int>& devices) {
  const std::map<int, std::size_t> count = towers_per_device(devices);
  const double n = static_cast<double>(devices.size());
  std::map<int, double> each_way;
  switch (backend) {
    case backend_kind::device0:
      for (const auto& [device, towers] : count)
        each_way[device] = device == devices[0] ? n - static_cast<double>(towers) : static_cast<double>(towers);
      break;
    case backend_kind::p2p_tree: {
      const int towers = static_cast<int>(devices.size());
      for (int stride = 1; stride < towers; stride *= 2) {
        for (int i = 0; i + stride < towers; i += 2 * stride) {
          const int a = devices[static_cast<std::size_t>(i)], b = devices[static_cast<std::size_t>(i + stride)];
          if (a == b) continue;
          each_way[a] += 1;
          each_way[b] += 1;
        }
      }
      break;
    }
    case backend_kind::sharded:
      for (const auto& [device, towers] : count) {
        const double own = static_cast<double>(towers);
        each_way[device] = 2 * own * (n - own) / n;
      }
      break;
    case backend_kind::host:
      for (const auto& [device, towers] : count) each_way[device] = static_cast<double>(towers);
      break;
  }
  double busiest = 0;
  for (const auto& entry : each_way) busiest = std::max(busiest, entry.second);
  return busiest;
}

// Modelled seconds of one step's exchange and broadcast (rule 4 at the top), per parameter.
inline double modelled_seconds_per_parameter(backend_kind backend, const tower_topology& t) {
  const double e = static_cast<double>(t.element_bytes);
  const double links = 2 * elements_each_way_on_busiest_link(backend, t.tower_devices) * e / t.link_bytes_per_second;
  if (backend != backend_kind::host) return links;
  // The host pass: reads the N gradients, reads and writes the fp32 master and two state slots (Adam),
  // writes the parameters to upload.
  const double host_pass = (e * static_cast<double>(t.tower_devices.size()) + 24 + e) / t.host_bytes_per_second;
  return links + host_pass;
}

inline bool allowed(const tower_topology& t, backend_kind backend) {
  return std::find(t.candidates.begin(), t.candidates.end(), backend) != t.candidates.end();
}

// The first of `preferred` that the topology's candidates include.
inline backend_kind first_allowed(const tower_topology& t, std::initializer_list<backend_kind> preferred) {
  for (backend_kind b : preferred)
    if (allowed(t, b)) return b;
  return t.candidates.front();
}

inline std::string not_allowed_note(const tower_topology& t, backend_kind wanted) {
  if (allowed(t, wanted)) return "";
  return make_message(" (reduce::", backend_name(wanted), " would be the choice, but it does not take these towers: ",
                      t.element_bytes, "-byte elements)");
}

inline std::string describe_devices(const tower_topology& t) {
  const std::map<int, std::size_t> count = towers_per_device(t.tower_devices);
  std::string text;
  for (const auto& [device, towers] : count)
    text += make_message(text.empty() ? "" : ", ", towers, " on GPU ", device);
  return make_message(t.tower_devices.size(), " GPU tower(s) (", text, ")");
}

}  // namespace detail

// The backend reduce::automatic runs for `t`, and a sentence that says why (the rules at the top).
inline backend_choice choose_backend(const tower_topology& t) {
  using detail::allowed;
  if (t.tower_devices.empty()) detail::fail("choose_backend: the topology has no towers");
  if (t.candidates.empty()) detail::fail("choose_backend: the topology lists no candidate backend");
  if (t.processes < 1) detail::fail("choose_backend: ", t.processes, " processes given; at least 1");
  const bool host_towers = t.tower_devices.front() == host_device;
  for (int d : t.tower_devices)
    if ((d == host_device) != host_towers) detail::fail("choose_backend: towers on the host and on GPUs mixed in one topology");

  if (t.processes > 1) {
    if (!allowed(t, backend_kind::sharded))
      detail::fail("choose_backend: the towers span ", t.processes, " processes, and only reduce::sharded spans processes, ",
                   "which these towers do not take");
    return {backend_kind::sharded, detail::make_message(t.processes, " processes: reduce::sharded is the only backend that spans processes")};
  }
  if (host_towers) {
    const backend_kind b = detail::first_allowed(t, {backend_kind::host, backend_kind::sharded});
    return {b, detail::make_message(t.tower_devices.size(), " host tower(s) in one process: reduce::", backend_name(b),
                                    b == backend_kind::host
                                        ? ", one pass over host memory (reduce::sharded took 1.5-5.1x its time in one process)"
                                        : "", detail::not_allowed_note(t, backend_kind::host))};
  }

  const std::set<int> devices(t.tower_devices.begin(), t.tower_devices.end());
  if (devices.size() == 1) {
    const backend_kind b = detail::first_allowed(t, {backend_kind::device0, backend_kind::p2p_tree, backend_kind::sharded, backend_kind::host});
    return {b, detail::make_message(
                   detail::describe_devices(t), ", one device: reduce::", backend_name(b),
                   b == backend_kind::device0
                       ? " moves the fewest bytes (each gradient read once, each replica written once; p2p_tree took "
                         "1.03x/1.42x/1.70x its time at 2/4/8 towers on one H200)"
                       : "",
                   detail::not_allowed_note(t, backend_kind::device0))};
  }

  bool every_pair_peers = true;
  for (int a : devices)
    for (int b : devices)
      if (a != b && t.link(a, b) == peer_link::none) every_pair_peers = false;
  backend_kind best = t.candidates.front();
  double best_seconds = 0;
  bool first = true;
  for (backend_kind b : {backend_kind::device0, backend_kind::p2p_tree, backend_kind::sharded, backend_kind::host}) {
    if (!allowed(t, b)) continue;
    const double seconds = detail::modelled_seconds_per_parameter(b, t);
    if (first || seconds < best_seconds * (1 - 1e-9)) {
      best = b;
      best_seconds = seconds;
      first = false;
    }
  }
  const double each_way = detail::elements_each_way_on_busiest_link(best, t.tower_devices);
  return {best, detail::make_message(
                    detail::describe_devices(t), every_pair_peers ? ", peer access between every pair" : ", some pairs without peer access",
                    ": reduce::", backend_name(best), " has the least modelled time (", each_way,
                    " gradient element(s) each way a parameter on the busiest device link, ",
                    static_cast<double>(t.parameters) * static_cast<double>(t.element_bytes) * each_way / 1e6,
                    " MB a step; ", best == backend_kind::host ? "plus the pass over host memory; " : "",
                    "a model, not measured on several GPUs: pipeline_options::time_backends measures)")};
}

}  // namespace towerpipe
