#pragma once
// The checks torch.optim makes on hyper-parameters, with messages that name the optimizer and the value.
// Every check is written as "!(valid)" so that NaN, which fails every comparison, is rejected too.
// Also the text form of hyper-parameters (describe), exact to the last bit, for fingerprints.

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace optim {
namespace detail {

// Finite in float too: float pipelines compute with the value rounded to float, where 1e39 is infinite.
inline void require_non_negative(const char* optimizer, const char* name, double value) {
  if (!(value >= 0.0 && std::isfinite(static_cast<float>(value))))
    towerpipe::detail::fail(optimizer, ": invalid ", name, " ", value, " (must be >= 0 and finite in float)");
}

inline void require_beta(const char* optimizer, const char* name, double value) {
  if (!(value >= 0.0 && value < 1.0))
    towerpipe::detail::fail(optimizer, ": invalid ", name, " ", value, " (must be in [0, 1))");
}

// "lr=0.001 beta1=0.90000000000000002 ...": each value with the 17 significant digits that name a double.
inline std::string describe_values(std::initializer_list<std::pair<const char*, double>> values) {
  std::string text;
  for (const auto& [name, value] : values) text += (text.empty() ? "" : " ") + std::string(name) + "=" + towerpipe::detail::exact(value);
  return text;
}

}  // namespace detail
}  // namespace optim
}  // namespace towerpipe
