#pragma once
// Happens-before for the simulated devices: a vector clock per stream and one for the host, with one
// component per stream and component 0 for the host. An op's epoch is its own component's value; an
// earlier op is ordered before a later one exactly when the later one's clock has reached that epoch.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace towerpipe {
namespace detail {
namespace simulation {

using vector_clock = std::vector<std::uint64_t>;  // missing components are 0

constexpr std::size_t host_component = 0;

inline void join(vector_clock& into, const vector_clock& other) {
  if (into.size() < other.size()) into.resize(other.size(), 0);
  for (std::size_t c = 0; c < other.size(); ++c) into[c] = std::max(into[c], other[c]);
}

// Advances `clock`'s own component; returns the new value.
inline std::uint64_t tick(vector_clock& clock, std::size_t component) {
  if (clock.size() <= component) clock.resize(component + 1, 0);
  return ++clock[component];
}

struct epoch {
  std::size_t component = 0;
  std::uint64_t time = 0;
};

inline bool ordered_before(const epoch& e, const vector_clock& later) {
  return e.component < later.size() && later[e.component] >= e.time;
}

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
