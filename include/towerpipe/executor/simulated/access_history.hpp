#pragma once
// The race detector's memory: per allocation, the accesses that executed ops made, each with the epoch
// of its op (executor/simulated/vector_clock.hpp). A new access conflicts with a recorded one when their
// bytes overlap, one of them writes (atomic updates do not conflict with each other), and the recorded one is
// not ordered before the new one's clock.
// Why: docs/design-notes.md#executor-simulated-access_history

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "towerpipe/executor/simulated/vector_clock.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

enum class access_kind { read, write, atomic };

inline bool conflicting(access_kind a, access_kind b) {
  return !(a == access_kind::read && b == access_kind::read) && !(a == access_kind::atomic && b == access_kind::atomic);
}

inline const char* verb(access_kind kind) {
  return kind == access_kind::read ? "reads" : kind == access_kind::write ? "writes" : "updates atomically";
}

struct access_record {
  std::uintptr_t lo = 0, hi = 0;  // bytes [lo, hi)
  access_kind kind = access_kind::read;
  epoch at;
  std::uint64_t op = 0;                   // the op's sequence number
  std::shared_ptr<const std::string> by;  // the op, as messages name it
};

class access_history {
 public:
  // Calls found(record) for every recorded access to [lo, hi) of allocation `id` that conflicts with an
  // access of `kind` made at `clock`.
  template <class Found>
  void conflicts(std::uint64_t id, std::uintptr_t lo, std::uintptr_t hi, access_kind kind, const vector_clock& clock,
                 Found&& found) const {
    const auto list = records_.find(id);
    if (list == records_.end()) return;
    for (const access_record& r : list->second) {
      if (r.lo < hi && lo < r.hi && conflicting(kind, r.kind) && !ordered_before(r.at, clock)) found(r);
    }
  }

  // Adds a checked access made at `clock`, dropping the accesses ordered before it that it makes redundant (nothing missed).
  void record(std::uint64_t id, const access_record& access, const vector_clock& clock) {
    std::vector<access_record>& list = records_[id];
    std::vector<access_record> kept;
    kept.reserve(list.size() + 2);
    for (const access_record& r : list) {
      const bool overlaps = r.lo < access.hi && access.lo < r.hi;
      const bool redundant = access.kind == access_kind::write || access.kind == r.kind;
      if (!overlaps || !redundant || !ordered_before(r.at, clock)) {
        kept.push_back(r);
        continue;
      }
      if (r.lo < access.lo) kept.push_back({r.lo, access.lo, r.kind, r.at, r.op, r.by});
      if (access.hi < r.hi) kept.push_back({access.hi, r.hi, r.kind, r.at, r.op, r.by});
    }
    kept.push_back(access);
    list.swap(kept);
  }

  void forget(std::uint64_t id) { records_.erase(id); }

 private:
  std::unordered_map<std::uint64_t, std::vector<access_record>> records_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
