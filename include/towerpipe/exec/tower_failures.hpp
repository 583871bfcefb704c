#pragma once
// Turns what went wrong in the towers of one step into a single towerpipe::error that names the tower:
// the lowest-numbered tower that threw (and how many others did), else the first gradient left
// unwritten. Shared by every execution space.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"

namespace towerpipe {
namespace detail {

// An element of a gradient that still holds the poison after the tower function (the tower is named by
// throw_tower_failures, which wraps this message).
[[noreturn]] inline void fail_unwritten_element(const variable& v, std::size_t element) {
  fail("element ", element, " (index ", shaped_index(v, element), ") of the gradient of variable '", v.name, "' ", to_string(v.shape),
       " was not written: it still holds the poison of pipeline_options::poison_gradients");
}

inline void throw_tower_failures(const std::vector<std::exception_ptr>& failures,
                                 const std::vector<std::vector<char>>& written, const variable_set& variables) {
  const std::size_t failed = static_cast<std::size_t>(
      std::count_if(failures.begin(), failures.end(), [](const std::exception_ptr& e) { return e != nullptr; }));
  const std::string others = failed > 1 ? make_message(" (", failed - 1, " more tower(s) failed too)") : std::string();
  for (std::size_t tower = 0; tower < failures.size(); ++tower) {
    if (failures[tower] == nullptr) continue;
    try {
      std::rethrow_exception(failures[tower]);
    } catch (const error& e) {
      fail("tower ", tower, ": ", e.message(), others);
    } catch (const std::exception& e) {
      fail("tower ", tower, " threw: ", e.what(), others);
    } catch (...) {
      fail("tower ", tower, " threw an exception that is not a std::exception", others);
    }
  }
  for (std::size_t tower = 0; tower < written.size(); ++tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      if (!written[tower][v]) fail("tower ", tower, " did not write the gradient of variable '", variables[v].name, "'");
    }
  }
}

}  // namespace detail
}  // namespace towerpipe
