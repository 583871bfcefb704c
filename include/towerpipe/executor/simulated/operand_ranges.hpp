#pragma once
// A launch's operands as the simulated devices see them: the byte ranges an agent declares
// (kernels/agents.hpp operands()) over the launch's chunks, checked as the device would meet them —
// inside one allocation, on the launch's device or a peer it has access to, stores vector-aligned —
// and the checker that the agents' host I/O reports every access to (kernels/access_hook.hpp), which
// refuses an access outside the declaration (it is not made) and keeps the first for the message.
// Why: docs/design-notes.md#executor-simulated-operand_ranges

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#define TOWERPIPE_SIMULATION_DEMANGLE 1
#endif

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/kernels/access_hook.hpp"
#include "towerpipe/plan/chunk_table.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

// A type's name for messages: demangled where the ABI offers it, without the library's namespaces.
template <class T>
const std::string& type_name() {
  static const std::string name = [] {
    const char* mangled = typeid(T).name();
    std::string text = mangled;
#if defined(TOWERPIPE_SIMULATION_DEMANGLE)
    int status = 0;
    const std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
    if (status == 0 && demangled) text = demangled.get();
#endif
    for (const char* prefix : {"towerpipe::detail::", "towerpipe::", "(anonymous namespace)::"}) {
      const std::string p = prefix;
      for (std::size_t at = text.find(p); at != std::string::npos; at = text.find(p, at)) text.erase(at, p.size());
    }
    return text;
  }();
  return name;
}

inline const char* access_text(operand_access access) {
  switch (access) {
    case operand_access::read: return "read";
    case operand_access::write: return "write";
    case operand_access::read_write: return "read_write";
  }
  return "?";
}

struct interval {
  std::uintptr_t lo, hi;
};

struct declared_range {
  std::uintptr_t lo, hi;
  operand_access access;
  allocation holder;
  bool atomic;  // a word declared read_write: the device updates it with an atomic (record_nonfinite)
};

// Fails unless a kernel on `device` reaches the memory at `place` (which starts at `lo`): the device's
// own, or a peer's whose access `device` has enabled. what(): who reaches what, for the message.
template <class What>
void check_device_reaches(const memory_registry& memory, int device, const placement& place,
                          const std::set<std::pair<int, int>>& peers, std::uintptr_t lo, const What& what) {
  if (place.holder == nullptr)
    fail(what(), " at ", address_text(lo), memory.after_text(lo), " on device ", device,
         ": pageable host memory, which no device reaches");
  const int owner = place.holder->owner;
  if (owner == pinned_host)
    fail(what(), " in ", describe(*place.holder), " on device ", device, ": host memory, not memory of device ", device);
  if (owner != device && peers.count({device, owner}) == 0)
    fail(what(), " in ", describe(*place.holder), " on device ", device, ": device ", device, " has no peer access to device ",
         owner, "'s memory (enable_peer_access)");
}

// What one launch declared: its ranges (per access kind, sorted and merged within an allocation), for
// the race detector; and the bytes it may read and may write, merged, for the access checker.
struct launch_operands {
  std::vector<declared_range> ranges;
  std::vector<interval> readable, writable;
};

// Sorted, touching and overlapping intervals joined.
inline std::vector<interval> merged(std::vector<interval> list) {
  std::sort(list.begin(), list.end(), [](const interval& a, const interval& b) { return a.lo < b.lo; });
  std::vector<interval> out;
  for (const interval& i : list) {
    if (!out.empty() && i.lo <= out.back().hi) out.back().hi = std::max(out.back().hi, i.hi);
    else out.push_back(i);
  }
  return out;
}

// The callable handed to Agent::operands (kernels/agents.hpp says what it is called with) for a launch
// of `chunks` on `device` whose vector I/O moves `vector_elements` elements at once.
class operand_collector {
 public:
  operand_collector(const memory_registry& memory, const std::set<std::pair<int, int>>& peers, int device,
                    const tensor_chunk* chunks, std::size_t chunk_count, std::size_t vector_elements, const std::string& launch)
      : memory_(memory), peers_(peers), device_(device), chunks_(chunks), chunk_count_(chunk_count),
        vector_elements_(vector_elements), launch_(launch) {}

  template <class U>
  void operator()(const pointer_table<U>& table, int first_role, int roles, operand_access access) {
    if (roles == 0 || chunk_count_ == 0) return;
    if (first_role < 0 || roles < 0) fail(launch_, ": declares roles [", first_role, ", ", first_role + roles, ") of a pointer table");
    if (table.pointers == nullptr || table.variables <= 0)
      fail(launch_, ": declares roles of a pointer table without a pointer array (", table.variables, " variables)");
    // The kernel reads the table's entries from device memory too.
    const auto entries = reinterpret_cast<std::uintptr_t>(table.pointers + first_role * table.variables);
    add(entries, entries + std::size_t(roles) * std::size_t(table.variables) * sizeof(U*), operand_access::read,
        [&] { return make_message("the entries of roles [", first_role, ", ", first_role + roles, ") of a pointer table"); });
    const std::size_t vector_bytes = vector_elements_ * sizeof(U);
    for (int role = first_role; role < first_role + roles; ++role) {
      int last_variable = -1;  // a variable's chunks come one after another: all in one allocation
      std::uint64_t last_holder = 0;
      for (std::size_t c = 0; c < chunk_count_; ++c) {
        const tensor_chunk& chunk = chunks_[c];
        if (chunk.variable < 0 || chunk.variable >= table.variables)
          fail(launch_, ": a chunk of variable ", chunk.variable, " meets a pointer table of ", table.variables, " variables");
        U* const base = table.at(role, chunk.variable);
        if (base == nullptr)
          fail(launch_, ": role ", role, " of a pointer table has no pointer for variable ", chunk.variable,
               " (declared ", access_text(access), "): the kernel would dereference null");
        const auto lo = reinterpret_cast<std::uintptr_t>(base + chunk.first);
        const auto where = [&] { return make_message("role ", role, ", variable ", chunk.variable, ", element ", chunk.first); };
        if (access != operand_access::read && lo % vector_bytes != 0)
          fail(launch_, ": stores through ", where(), " at ", address_text(lo), ", which is not ", vector_bytes,
               "-byte aligned: the kernel's vector store of ", vector_elements_, " elements would fault there");
        const allocation holder = add(lo, lo + std::size_t(chunk.count) * sizeof(U), access, where).holder;
        if (chunk.variable == last_variable && holder.id != last_holder)
          fail(launch_, ": ", where(), " lies in ", describe(holder), ", the variable's earlier elements in allocation #", last_holder,
               ": the variable runs past the end of its allocation");
        last_variable = chunk.variable;
        last_holder = holder.id;
      }
    }
  }

  template <class U>
  void operator()(const U* word, std::size_t bytes, operand_access access) {
    if (word == nullptr) fail(launch_, ": declares a word at a null pointer");
    const auto lo = reinterpret_cast<std::uintptr_t>(word);
    if (bytes == 0) return;
    declared_range& range = add(lo, lo + bytes, access, [] { return std::string("a declared word"); });
    range.atomic = access == operand_access::read_write;
  }

  launch_operands finish() && {
    std::sort(raw_.begin(), raw_.end(), [](const declared_range& a, const declared_range& b) {
      return a.access != b.access ? a.access < b.access : a.atomic != b.atomic ? a.atomic < b.atomic : a.lo < b.lo;
    });
    launch_operands out;
    std::vector<interval> readable, writable;
    for (const declared_range& r : raw_) {
      declared_range* last = out.ranges.empty() ? nullptr : &out.ranges.back();
      const bool extends = last != nullptr && last->access == r.access && last->atomic == r.atomic && last->holder.id == r.holder.id &&
                           r.lo <= last->hi;
      if (extends)
        last->hi = std::max(last->hi, r.hi);
      else
        out.ranges.push_back(r);
      if (r.access != operand_access::write) readable.push_back({r.lo, r.hi});
      if (r.access != operand_access::read) writable.push_back({r.lo, r.hi});
    }
    out.readable = merged(std::move(readable));
    out.writable = merged(std::move(writable));
    return out;
  }

 private:
  // Bytes [lo, hi) inside one allocation that the launch's device reaches.
  template <class Where>
  declared_range& add(std::uintptr_t lo, std::uintptr_t hi, operand_access access, const Where& where) {
    const placement place = memory_.place(lo, hi, [&] { return make_message(launch_, " (", where(), ")"); });
    check_device_reaches(memory_, device_, place, peers_, lo, [&] { return make_message(launch_, " reaches ", where()); });
    return raw_.emplace_back(declared_range{lo, hi, access, *place.holder, false});
  }

  const memory_registry& memory_;
  const std::set<std::pair<int, int>>& peers_;
  int device_;
  const tensor_chunk* chunks_;
  std::size_t chunk_count_;
  std::size_t vector_elements_;
  const std::string& launch_;
  std::vector<declared_range> raw_;
};

// Set on the thread that runs a launch: every access the agent reports must lie in what it declared.
// One that does not is refused (not made) and the first is kept, for violation() after the launch.
class operand_checker final : public access_recorder {
 public:
  operand_checker(const launch_operands& declared, const memory_registry& memory, const std::string& launch)
      : declared_(declared), memory_(memory), launch_(launch) {}

  bool on_access(const void* address, std::size_t bytes, operand_access access) noexcept override {
    const auto lo = reinterpret_cast<std::uintptr_t>(address);
    const auto hi = lo + bytes;
    if (access != operand_access::write && !inside(declared_.readable, lo, hi)) return refuse(lo, hi, "reads", "reading");
    if (access != operand_access::read && !inside(declared_.writable, lo, hi)) return refuse(lo, hi, "writes", "writing");
    return true;
  }

  // The first refused access, with a count of the others; empty when there was none.
  std::string violation() const {
    if (refused_ <= 1) return first_;
    return make_message(first_, " (and ", refused_ - 1, " more refused accesses)");
  }

 private:
  static bool inside(const std::vector<interval>& list, std::uintptr_t lo, std::uintptr_t hi) {
    const auto next = std::upper_bound(list.begin(), list.end(), lo, [](std::uintptr_t a, const interval& i) { return a < i.lo; });
    return next != list.begin() && hi <= std::prev(next)->hi;
  }

  bool refuse(std::uintptr_t lo, std::uintptr_t hi, const char* verb, const char* purpose) noexcept {
    if (refused_++ == 0) {
      try {
        first_ = describe_refusal(lo, hi, verb, purpose);
      } catch (...) {
        first_ = "an access outside the declared operands (and no memory to describe it)";
      }
    }
    return false;
  }

  std::string describe_refusal(std::uintptr_t lo, std::uintptr_t hi, const char* verb, const char* purpose) const {
    const allocation* holder = memory_.holding(lo);
    const std::string where = holder != nullptr ? describe_bytes(*holder, lo, hi) : "pageable host memory" + memory_.after_text(lo);
    const declared_range* nearest = nullptr;
    std::uintptr_t best = 0;
    for (const declared_range& r : declared_.ranges) {
      const std::uintptr_t distance = hi <= r.lo ? r.lo - hi : r.hi <= lo ? lo - r.hi : 0;
      if (nearest == nullptr || distance < best) {
        nearest = &r;
        best = distance;
      }
    }
    const std::string near =
        nearest == nullptr ? std::string("it declares nothing")
                           : make_message("the nearest declared range is ", describe_bytes(nearest->holder, nearest->lo, nearest->hi), " (",
                                          access_text(nearest->access), ")");
    return make_message(launch_, " ", verb, " ", hi - lo, " bytes at ", address_text(lo), " (", where,
                        "), outside what its operands() declares for ", purpose, "; ", near);
  }

  const launch_operands& declared_;
  const memory_registry& memory_;
  const std::string& launch_;
  std::size_t refused_ = 0;
  std::string first_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
