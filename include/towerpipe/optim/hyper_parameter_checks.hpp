#pragma once
// The checks torch.optim makes on hyper-parameters, with messages that name the optimizer and the value.
// Every check is written as "!(valid)" so that NaN, which fails every comparison, is rejected too.

#include <cmath>

#include "towerpipe/core/error.hpp"

namespace towerpipe {
namespace optim {
namespace detail {

inline void require_non_negative(const char* optimizer, const char* name, double value) {
  if (!(value >= 0.0 && std::isfinite(value)))
    towerpipe::detail::fail(optimizer, ": invalid ", name, " ", value, " (must be finite and >= 0)");
}

inline void require_beta(const char* optimizer, const char* name, double value) {
  if (!(value >= 0.0 && value < 1.0))
    towerpipe::detail::fail(optimizer, ": invalid ", name, " ", value, " (must be in [0, 1))");
}

}  // namespace detail
}  // namespace optim
}  // namespace towerpipe
