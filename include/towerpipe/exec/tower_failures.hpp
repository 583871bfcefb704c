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
