#pragma once
// A hook in the host path of the agents' vector I/O (kernels/lanes.hpp load_lanes/store_lanes,
// kernels/screen.hpp record_nonfinite): while a recorder is set on the calling thread, every access an
// agent makes on the host is reported to it before it happens, and the recorder may refuse it. The
// simulated devices (exec/simulated/) set one while they run a launch and refuse each access outside
// what the agent declared (operands()), then report the first. With no recorder set the hook costs one
// thread-local load; the device path of the I/O does not call it.
//
// Refusing rather than throwing keeps exceptions out of the agents' code: a throwing call in their
// I/O makes GCC 12 fail (an internal compiler error in SRA) on the agents under -fsanitize=thread.

#include <cstddef>

#include "towerpipe/kernels/operands.hpp"

namespace towerpipe {
namespace detail {

class access_recorder {
 public:
  // False refuses the access: it is not made (a refused load yields zeros).
  virtual bool on_access(const void* address, std::size_t bytes, operand_access access) noexcept = 0;

 protected:
  ~access_recorder() = default;
};

inline thread_local access_recorder* current_access_recorder = nullptr;

// Whether the access may be made.
inline bool report_access(const void* address, std::size_t bytes, operand_access access) noexcept {
  if (access_recorder* recorder = current_access_recorder) return recorder->on_access(address, bytes, access);
  return true;
}

// Sets `recorder` for the calling thread for the scope's lifetime.
class scoped_access_recorder {
 public:
  explicit scoped_access_recorder(access_recorder& recorder) : previous_(current_access_recorder) {
    current_access_recorder = &recorder;
  }
  ~scoped_access_recorder() { current_access_recorder = previous_; }
  scoped_access_recorder(const scoped_access_recorder&) = delete;
  scoped_access_recorder& operator=(const scoped_access_recorder&) = delete;

 private:
  access_recorder* previous_;
};

}  // namespace detail
}  // namespace towerpipe
