#pragma once
// choose_backend(tower_topology) — which reduction backend reduce::automatic runs, and why, from a described topology
// (plain C++, tested with topologies no machine here has), by rules numbered at the Why.
// Why: docs/design-notes.md#reduce-choice-chooser

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/reduce/choice/backends.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"
#include "towerpipe/reduce/common/contract.hpp"

namespace towerpipe {

// What connects two GPUs, as the runtime tells (peer access; native peer atomics mark NVLink). A pair
// missing from tower_topology::links has none.
enum class peer_link { none, pcie, nvlink };

constexpr int host_device = -1;  // tower_topology::tower_devices: a tower that runs on a CPU thread

struct tower_topology {
  std::vector<int> tower_devices;                  // this process's towers: a GPU id each, or host_device
  std::map<std::pair<int, int>, peer_link> links;  // (a, b): a can read and write b's memory
  std::size_t parameters = 0;                      // elements over every variable
  std::size_t element_bytes = 4;                   // a gradient element as the towers hold it (2: bf16/fp16)
  int processes = 1;                               // processes the towers span (pipeline_options::processes)
  std::vector<backend_traits> candidates;          // the backends that take these towers, in the list's order
  double link_bytes_per_second = 55.1e9;           // pinned PCIe, H200 machine, 2026-11-30
  double host_bytes_per_second = 111.6e9;          // CPU triad, 16 threads, the same machine

  peer_link link(int a, int b) const {
    const auto found = links.find({a, b});
    return found == links.end() ? peer_link::none : found->second;
  }
};

namespace detail {

// Modelled seconds of one step's exchange and broadcast (rule 4), per parameter.
inline double modelled_seconds_per_parameter(const backend_traits& b, const tower_topology& t) {
  const double e = static_cast<double>(t.element_bytes);
  const double links = 2 * b.busiest_link_elements(t.tower_devices) * e / t.link_bytes_per_second;
  if (!b.host_pass) return links;
  // The host pass: reads the N gradients, reads and writes the fp32 master and two state slots (Adam),
  // writes the parameters to upload.
  return links + (e * static_cast<double>(t.tower_devices.size()) + 24 + e) / t.host_bytes_per_second;
}

// The candidate with the least cost(candidate); ties to the earlier one.
template <class Cost>
const backend_traits& least(const std::vector<backend_traits>& candidates, Cost&& cost) {
  const backend_traits* best = &candidates.front();
  double best_cost = cost(*best);
  for (const backend_traits& b : candidates) {
    const double c = cost(b);
    if (c < best_cost * (1 - 1e-9)) {
      best = &b;
      best_cost = c;
    }
  }
  return *best;
}

inline std::string describe_devices(const tower_topology& t) {
  std::string text;
  for (const auto& [device, towers] : towers_per_device(t.tower_devices))
    text += make_message(text.empty() ? "" : ", ", towers, " on GPU ", device);
  return make_message(t.tower_devices.size(), " GPU tower(s) (", text, ")");
}

}  // namespace detail

// The backend reduce::automatic runs for `t`, and a sentence that says why (the rules).
inline backend_choice choose_backend(const tower_topology& t) {
  using detail::make_message;
  if (t.tower_devices.empty()) detail::fail("choose_backend: the topology has no towers");
  if (t.candidates.empty()) detail::fail("choose_backend: the topology lists no candidate backend");
  if (t.processes < 1) detail::fail("choose_backend: ", t.processes, " processes given; at least 1");
  const bool host_towers = t.tower_devices.front() == host_device;
  for (int d : t.tower_devices)
    if ((d == host_device) != host_towers) detail::fail("choose_backend: towers on the host and on GPUs mixed in one topology");

  if (t.processes > 1) {
    for (const backend_traits& b : t.candidates)
      if (b.spans_processes)
        return {b.name, make_message(t.processes, " processes: reduce::", b.name, " is the only backend that spans processes")};
    std::string spanning;  // the registered backends that do, by name
    for (const backend_traits& b : registered_backends())
      if (b.spans_processes) spanning += make_message(spanning.empty() ? "" : ", ", "reduce::", b.name);
    detail::fail("choose_backend: the towers span ", t.processes, " processes, and only ", spanning,
                 " spans processes, which these towers do not take");
  }
  if (host_towers) {
    const backend_traits& b = detail::least(t.candidates, [](const backend_traits& c) { return c.host_tower_cost; });
    return {b.name, make_message(t.tower_devices.size(), " host tower(s) in one process: reduce::", b.name, ", ", b.note)};
  }
  const std::set<int> devices(t.tower_devices.begin(), t.tower_devices.end());
  if (devices.size() == 1) {
    const backend_traits& b = detail::least(
        t.candidates, [&](const backend_traits& c) { return c.one_device_bytes(t.tower_devices.size(), t.element_bytes); });
    return {b.name, make_message(detail::describe_devices(t), ", one device: reduce::", b.name, " moves the fewest bytes (",
                                 b.one_device_bytes(t.tower_devices.size(), t.element_bytes), " a parameter; ", b.note, ")")};
  }
  bool every_pair_peers = true;
  for (int a : devices)
    for (int b : devices)
      if (a != b && t.link(a, b) == peer_link::none) every_pair_peers = false;
  const backend_traits& best =
      detail::least(t.candidates, [&](const backend_traits& c) { return detail::modelled_seconds_per_parameter(c, t); });
  const double each_way = best.busiest_link_elements(t.tower_devices);
  return {best.name, make_message(detail::describe_devices(t),
                                  every_pair_peers ? ", peer access between every pair" : ", some pairs without peer access",
                                  ": reduce::", best.name, " has the least modelled time (", each_way,
                                  " gradient element(s) each way a parameter on the busiest device link, ",
                                  static_cast<double>(t.parameters) * static_cast<double>(t.element_bytes) * each_way / 1e6,
                                  " MB a step; ", best.host_pass ? "plus the pass over host memory; " : "",
                                  "a model, not measured on several GPUs: pipeline_options::time_backends measures)")};
}

}  // namespace towerpipe
