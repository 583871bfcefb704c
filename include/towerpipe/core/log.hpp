#pragma once
// Where the library's rare warnings and notes go (say, "no peer access between devices 0 and 1: staged copies").
// Nothing is printed by default (README.md, invariant 5): install a sink to see them, e.g.
//   towerpipe::set_log_sink([](const std::string& line) { std::cerr << line << '\n'; });

#include <functional>
#include <mutex>
#include <string>
#include <utility>

namespace towerpipe {

using log_sink = std::function<void(const std::string&)>;

namespace detail {
struct log_state {
  std::mutex mutex;
  log_sink sink;
};
inline log_state& log_state_instance() {
  static log_state state;
  return state;
}
}  // namespace detail

inline void set_log_sink(log_sink sink) {
  detail::log_state& state = detail::log_state_instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.sink = std::move(sink);
}

namespace detail {
inline void log_line(const std::string& line) {
  log_state& state = log_state_instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.sink) state.sink(line);
}
}  // namespace detail

inline void log_warning(const std::string& line) { detail::log_line("towerpipe warning: " + line); }
// What the library decided for the user (which backend reduce::automatic chose, and why).
inline void log_note(const std::string& line) { detail::log_line("towerpipe: " + line); }

}  // namespace towerpipe
