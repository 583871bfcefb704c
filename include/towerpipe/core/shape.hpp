#pragma once
// A tensor shape: the extent of each dimension, outermost first.

#include <cstddef>
#include <string>
#include <vector>

namespace towerpipe {

using shape = std::vector<std::size_t>;

// Number of elements of a tensor of this shape (1 for a scalar, i.e. an empty shape).
inline std::size_t element_count(const shape& dims) {
  std::size_t count = 1;
  for (std::size_t extent : dims) count *= extent;
  return count;
}

// "[256, 784]", as error messages print shapes.
inline std::string to_string(const shape& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i != 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace towerpipe
