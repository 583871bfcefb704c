#pragma once
// What was set on a pipeline between two steps, for the processes' agreement at the next one
// (step/processes.hpp): whether the parameters were set (initialisation, a checkpoint; the processes
// then compare the parameters they hold), and the optimizer state set, per slot and variable, the last
// values set winning. A process that resumed other state than the others, or none, then differs in a
// digest.

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "towerpipe/core/checksum.hpp"

namespace towerpipe {
namespace detail {

class changes_since_step {
 public:
  void parameters_set() { parameters_set_ = true; }
  void state_set(std::size_t slot, std::size_t variable, const void* values, std::size_t bytes) {
    state_set_[{slot, variable}] = fnv1a(values, bytes);
  }
  void clear() {
    parameters_set_ = false;
    state_set_.clear();
  }

  bool parameters_were_set() const { return parameters_set_; }
  // One line, "optimizer state: ...".
  std::string describe_state() const {
    if (state_set_.empty()) return "optimizer state: unchanged";
    std::uint64_t digest = fnv1a_basis;
    for (const auto& [where, values] : state_set_) {
      const std::uint64_t record[3] = {where.first, where.second, values};
      digest = fnv1a(record, sizeof record, digest);
    }
    return "optimizer state: set since the last step, digest " + hex_digest(digest);
  }

 private:
  bool parameters_set_ = false;
  std::map<std::pair<std::size_t, std::size_t>, std::uint64_t> state_set_;
};

}  // namespace detail
}  // namespace towerpipe
