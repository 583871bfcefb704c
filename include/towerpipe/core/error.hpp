#pragma once
// towerpipe::error — the one exception type the library throws (docs/guide.md, invariant 5).
// Messages name what went wrong and where: tower, variable, input, shapes.

#include <cstdio>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>

namespace towerpipe {

class error : public std::runtime_error {
 public:
  explicit error(const std::string& message) : std::runtime_error("towerpipe: " + message), message_(message) {}

  // what() without the "towerpipe: " prefix, for wrapping into a message with more context.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

namespace detail {

// Streams every argument into one message: make_message("tower ", 2, ": bad") == "tower 2: bad".
template <class... Parts>
std::string make_message(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// A double with the 17 significant digits that name it, for texts that must tell every value apart.
inline std::string exact(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// The text of the exception being handled (call it inside a catch block): a towerpipe::error's message
// without its prefix, a std::exception's what(), or a note that it was neither.
inline std::string current_exception_text() {
  try {
    throw;
  } catch (const error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw error(make_message(parts...));
}

}  // namespace detail
}  // namespace towerpipe
