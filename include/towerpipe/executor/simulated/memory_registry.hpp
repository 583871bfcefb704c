#pragma once
// The simulated machine's memory: every allocation made through the simulated executor, owned by a
// device or marked pinned host memory, with the byte ranges the checks resolve against it. Addresses
// outside every allocation are pageable host memory. Not thread-safe: the engine
// (executor/simulated/engine.hpp) calls it under its lock.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <new>
#include <string>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

constexpr int pinned_host = -1;  // the owner of pinned host memory

struct allocation {
  std::uint64_t id = 0;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  int owner = pinned_host;  // a device, or pinned_host
  std::size_t alignment = 0;  // what it was allocated (and must be freed) with
  std::uintptr_t end() const { return base + bytes; }
};

inline std::string describe(const allocation& a) {
  return make_message(a.owner == pinned_host ? std::string("pinned host") : make_message("device ", a.owner, "'s"),
                      " allocation #", a.id, " (", a.bytes, " bytes)");
}

// Bytes [lo, hi) as offsets into the allocation: what messages name.
inline std::string describe_bytes(const allocation& a, std::uintptr_t lo, std::uintptr_t hi) {
  return make_message("bytes [", lo - a.base, ", ", hi - a.base, ") of ", describe(a));
}

inline std::string address_text(std::uintptr_t address) {
  return make_message("0x", std::hex, address);
}

// Where a byte range lies: inside one allocation, or in pageable host memory (touching no allocation).
struct placement {
  const allocation* holder;  // null: pageable host memory
};

class memory_registry {
 public:
  memory_registry() = default;
  memory_registry(const memory_registry&) = delete;
  memory_registry& operator=(const memory_registry&) = delete;
  ~memory_registry() {
    for (const auto& entry : allocations_) release_memory(entry.second);
  }

  // Zero-filled, aligned to `alignment` (a power of two), followed by a gap that belongs to no
  // allocation: a range that runs a little past the end lands in pageable memory, whatever the host
  // allocator places next.
  const allocation& allocate(std::size_t bytes, std::size_t alignment, int owner) {
    void* raw = ::operator new(bytes + gap_bytes, std::align_val_t(alignment));
    std::memset(raw, 0, bytes + gap_bytes);
    const auto base = reinterpret_cast<std::uintptr_t>(raw);
    return allocations_[base] = allocation{next_id_++, base, bytes, owner, alignment};
  }

  // The allocation that starts at `base`, or null.
  const allocation* at_base(std::uintptr_t base) const {
    const auto found = allocations_.find(base);
    return found == allocations_.end() ? nullptr : &found->second;
  }

  void release(std::uintptr_t base) {
    const auto found = allocations_.find(base);
    release_memory(found->second);
    allocations_.erase(found);
  }

  // The allocation that holds `address`, or null.
  const allocation* holding(std::uintptr_t address) const {
    auto next = allocations_.upper_bound(address);
    if (next == allocations_.begin()) return nullptr;
    const allocation& before = std::prev(next)->second;
    return address < before.end() ? &before : nullptr;
  }

  // For messages about an address in pageable memory: how far past the allocation before it, if any
  // (a range just past an allocation's end is more likely an overrun than host memory).
  std::string after_text(std::uintptr_t address) const {
    const auto next = allocations_.upper_bound(address);
    if (next == allocations_.begin()) return "";
    const allocation& before = std::prev(next)->second;
    return make_message(" (", address - before.end(), " bytes past the end of ", describe(before), ")");
  }

  // Bytes [lo, hi) (hi > lo): inside one allocation, or pageable memory; a range that straddles an
  // allocation's edge is an error, what() says whose.
  template <class What>
  placement place(std::uintptr_t lo, std::uintptr_t hi, const What& what) const {
    if (const allocation* holder = holding(lo)) {
      if (hi > holder->end())
        fail(what(), ": bytes [", lo - holder->base, ", ", hi - holder->base, ") run past the end of ", describe(*holder));
      return {holder};
    }
    const auto next = allocations_.upper_bound(lo);
    if (next != allocations_.end() && next->second.base < hi)
      fail(what(), ": the range at ", address_text(lo), " of ", hi - lo, " bytes starts outside ", describe(next->second),
           " and runs into it");
    return {nullptr};
  }

 private:
  static void release_memory(const allocation& a) {
    ::operator delete(reinterpret_cast<void*>(a.base), std::align_val_t(a.alignment));
  }

  static constexpr std::size_t gap_bytes = 256;

  std::map<std::uintptr_t, allocation> allocations_;
  std::uint64_t next_id_ = 1;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
