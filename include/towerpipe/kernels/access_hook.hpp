#pragma once
// A hook in the host path of the agents' vector I/O: a recorder set on the calling thread (the simulated devices) is
// told of every access first and may refuse it. Refuse, never throw: a throw there makes GCC 12 ICE under TSan.
// operand_access: how an agent or screen source touches one of its operands (listed by its operands(f),
// kernels/agents.hpp), for executors that check launches; the kernels never call operands().
// Why: docs/design-notes.md#kernels-access_hook

#include <cstddef>

namespace towerpipe {
namespace detail {

enum class operand_access { read, write, read_write };

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
