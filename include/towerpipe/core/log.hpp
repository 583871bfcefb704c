#pragma once
// Where the library's rare warnings and notes go (say, "no peer access between devices 0 and 1: staged copies").
// Nothing is printed by default (docs/guide.md, invariant 5): install a sink to see them, e.g.
//   towerpipe::set_log_sink([](const std::string& line) { std::cerr << line << '\n'; });
// A sink that throws is caught; the lines it did not take are kept for take_undelivered_log_lines().
// Why: docs/design-notes.md#core-log

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace towerpipe {

using log_sink = std::function<void(const std::string&)>;

// The most lines a throwing sink leaves for take_undelivered_log_lines().
constexpr std::size_t max_undelivered_log_lines = 100;

namespace detail {
struct log_state {
  std::mutex mutex;
  log_sink sink;
  std::deque<std::string> undelivered;  // the lines the sink threw on, oldest first
  std::size_t undelivered_dropped = 0;  // beyond max_undelivered_log_lines, since the last take
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

// The lines the sink threw on since the last call (oldest first; where more than
// max_undelivered_log_lines, a first line says how many older ones were dropped), and forgets them.
inline std::vector<std::string> take_undelivered_log_lines() {
  detail::log_state& state = detail::log_state_instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  std::vector<std::string> lines;
  if (state.undelivered_dropped > 0)
    lines.push_back("towerpipe: " + std::to_string(state.undelivered_dropped) + " older undelivered log line(s) dropped");
  lines.insert(lines.end(), state.undelivered.begin(), state.undelivered.end());
  state.undelivered.clear();
  state.undelivered_dropped = 0;
  return lines;
}

namespace detail {
// Never throws: a sink's exception is caught and its line kept (see the top).
inline void log_line(const std::string& line) noexcept {
  log_state& state = log_state_instance();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.sink) return;
  try {
    state.sink(line);
    return;
  } catch (...) {
  }
  try {
    if (state.undelivered.size() == max_undelivered_log_lines) {
      state.undelivered.pop_front();
      ++state.undelivered_dropped;
    }
    state.undelivered.push_back(line);
  } catch (...) {  // out of memory: the line is lost, and counted
    ++state.undelivered_dropped;
  }
}
}  // namespace detail

inline void log_warning(const std::string& line) { detail::log_line("towerpipe warning: " + line); }
// What the library decided for the user (which backend reduce::automatic chose, and why).
inline void log_note(const std::string& line) { detail::log_line("towerpipe: " + line); }

}  // namespace towerpipe
