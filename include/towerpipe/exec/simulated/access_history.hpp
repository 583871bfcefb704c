#pragma once
// The race detector's memory: per allocation, the accesses that executed ops made, each with the epoch
// of its op (exec/simulated/vector_clock.hpp). A new access conflicts with a recorded one when their
// bytes overlap, one of them writes, and the recorded one is not ordered before the new one's clock.
// Found whatever order the ops ran in: ops run in an order that extends happens-before, so of two
// unordered conflicting accesses the later one to run finds the earlier.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "towerpipe/exec/simulated/vector_clock.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

struct access_record {
  std::uintptr_t lo = 0, hi = 0;  // bytes [lo, hi)
  bool write = false;
  epoch at;
  std::uint64_t op = 0;                   // the op's sequence number
  std::shared_ptr<const std::string> by;  // the op, as messages name it
};

class access_history {
 public:
  // Calls found(record) for every recorded access to [lo, hi) of allocation `id` that conflicts with an
  // access of kind `write` made at `clock`.
  template <class Found>
  void conflicts(std::uint64_t id, std::uintptr_t lo, std::uintptr_t hi, bool write, const vector_clock& clock, Found&& found) const {
    const auto list = records_.find(id);
    if (list == records_.end()) return;
    for (const access_record& r : list->second) {
      if (r.lo < hi && lo < r.hi && (write || r.write) && !ordered_before(r.at, clock)) found(r);
    }
  }

  // Adds a checked access made at `clock`, dropping what it makes redundant: the bytes of every access
  // ordered before it if it writes, of every read ordered before it if it reads. A later access that
  // would race with a dropped one races with this one as well (it is unordered with it too, and
  // conflicts), so nothing is missed and the history stays about as long as the live ranges.
  void record(std::uint64_t id, const access_record& access, const vector_clock& clock) {
    std::vector<access_record>& list = records_[id];
    std::vector<access_record> kept;
    kept.reserve(list.size() + 2);
    for (const access_record& r : list) {
      const bool overlaps = r.lo < access.hi && access.lo < r.hi;
      if (!overlaps || (r.write && !access.write) || !ordered_before(r.at, clock)) {
        kept.push_back(r);
        continue;
      }
      if (r.lo < access.lo) kept.push_back({r.lo, access.lo, r.write, r.at, r.op, r.by});
      if (access.hi < r.hi) kept.push_back({access.hi, r.hi, r.write, r.at, r.op, r.by});
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
