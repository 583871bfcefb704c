#pragma once
// The sides of the simulated devices' copies, memsets and fills, checked as CUDA would meet them: where
// each side may lie (device memory, pinned host memory, pageable host memory only for a copy), the
// accesses the op makes, and for an asynchronous copy, its staging and its cost on the simulated clock.
// Plain functions of the memory registry; the engine (executor/simulated/engine.hpp) enqueues the ops.
// Why: docs/design-notes.md#executor-simulated-copies

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/access_history.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/op_queue.hpp"
#include "towerpipe/executor/simulated/operand_ranges.hpp"
#include "towerpipe/executor/simulated/ordering.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

// One range of a copy; expected owners (copy_peer_async) or any_owner.
constexpr int any_owner = -2;
struct copy_range {
  void* dst;
  const void* src;
  std::size_t bytes;
  int dst_owner = any_owner, src_owner = any_owner;
};

// One side of an asynchronous copy or memset: device memory or pinned host memory; null for pageable
// host memory, which only a copy takes (planned_copy says how).
inline const allocation* async_side(const memory_registry& memory, std::uintptr_t lo, std::size_t bytes, int owner, const char* what,
                                    const char* side) {
  const placement place = memory.place(lo, lo + bytes, [&] { return make_message(what, ": the ", side); });
  if (place.holder == nullptr) {
    if (owner != any_owner) fail(what, ": the ", side, " at ", address_text(lo), " is pageable host memory, not memory of device ", owner);
    return nullptr;
  }
  if (owner != any_owner && place.holder->owner != owner)
    fail(what, ": the ", side, " is ", describe(*place.holder), ", not memory of device ", owner);
  return place.holder;
}
// The same where pageable memory cannot take part (a memset: CUDA would not run it in stream order).
inline const allocation& async_device_or_pinned(const memory_registry& memory, std::uintptr_t lo, std::size_t bytes, const char* what,
                                                const char* side) {
  const allocation* holder = async_side(memory, lo, bytes, any_owner, what, side);
  if (holder == nullptr)
    fail(what, ": the ", side, " at ", address_text(lo), memory.after_text(lo),
         " is pageable host memory; asynchronous work needs device or pinned memory (CUDA would not run it in stream order)");
  return *holder;
}
// Bytes [lo, hi) that a kernel on stream `s` touches (a fill, a find): its device must reach them.
inline allocation reached_by_kernel(const memory_registry& memory, const std::set<std::pair<int, int>>& peers, const stream_state& s,
                                    std::uintptr_t lo, std::uintptr_t hi, const char* what) {
  const placement place = memory.place(lo, hi, [&] { return std::string(what); });
  check_device_reaches(memory, s.device, place, peers, lo, [&] { return make_message(what, " on ", stream_text(s)); });
  return *place.holder;
}

// An asynchronous copy of some ranges, as one op; pageable host sides behave as in CUDA (staged source, synchronous sink).
struct planned_copy {
  std::vector<op_access> accesses;
  std::vector<copy_range> work;  // the ranges to copy, a staged source in place of a pageable one
  std::shared_ptr<std::vector<std::vector<char>>> staged = std::make_shared<std::vector<std::vector<char>>>();
  bool lands_in_pageable = false;  // the host waits for the stream
  double seconds = op_latency_seconds;
};
inline planned_copy plan_copy(const memory_registry& memory, const std::vector<copy_range>& ranges, const char* what) {
  planned_copy plan;
  for (const copy_range& r : ranges) {
    if (r.bytes == 0) continue;
    const auto dst = reinterpret_cast<std::uintptr_t>(r.dst), src = reinterpret_cast<std::uintptr_t>(r.src);
    const allocation* to = async_side(memory, dst, r.bytes, r.dst_owner, what, "destination");
    const allocation* from = async_side(memory, src, r.bytes, r.src_owner, what, "source");
    if (to == nullptr && from == nullptr) fail(what, ": both sides are pageable host memory");
    if (dst < src + r.bytes && src < dst + r.bytes)
      fail(what, ": source and destination overlap (", describe_bytes(to != nullptr ? *to : *from, dst, dst + r.bytes), ")");
    copy_range piece = r;
    if (from != nullptr) {
      plan.accesses.push_back({*from, src, src + r.bytes, access_kind::read});
    } else {
      plan.staged->emplace_back(static_cast<const char*>(r.src), static_cast<const char*>(r.src) + r.bytes);
      piece.src = plan.staged->back().data();
    }
    if (to != nullptr) plan.accesses.push_back({*to, dst, dst + r.bytes, access_kind::write});
    else plan.lands_in_pageable = true;
    const bool local = to != nullptr && from != nullptr && to->owner == from->owner && to->owner != pinned_host;
    plan.seconds += static_cast<double>(r.bytes) / (local ? device_bytes_per_second : link_bytes_per_second);
    plan.work.push_back(piece);
  }
  return plan;
}

// The accesses of a synchronous copy between host memory (pageable or pinned) and device memory.
inline std::vector<op_access> copy_now_accesses(const memory_registry& memory, void* dst, const void* src, std::size_t bytes,
                                                bool to_device, const char* what) {
  const auto device_side = reinterpret_cast<std::uintptr_t>(to_device ? dst : src);
  const auto host_side = reinterpret_cast<std::uintptr_t>(to_device ? src : dst);
  const placement device = memory.place(device_side, device_side + bytes, [&] { return make_message(what, ": the device side"); });
  if (device.holder == nullptr || device.holder->owner == pinned_host)
    fail(what, ": the device side at ", address_text(device_side), " is not device memory (",
         device.holder == nullptr ? "pageable host memory" + memory.after_text(device_side) : describe(*device.holder), ")");
  const placement host = memory.place(host_side, host_side + bytes, [&] { return make_message(what, ": the host side"); });
  if (host.holder != nullptr && host.holder->owner != pinned_host)
    fail(what, ": the host side is ", describe(*host.holder), ", not host memory");
  const auto kind = [](bool writes) { return writes ? access_kind::write : access_kind::read; };
  std::vector<op_access> accesses{{*device.holder, device_side, device_side + bytes, kind(to_device)}};
  if (host.holder != nullptr) accesses.push_back({*host.holder, host_side, host_side + bytes, kind(!to_device)});
  return accesses;
}

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
