#pragma once
// The verdict of a checked step (kernels/screen.hpp) once its screen is in, as a function of the
// screen's partials and the options: the gradient norm, whether the step is skipped (a non-finite
// average under on_nonfinite = skip), refused (throw_error: a towerpipe::error naming the element) or
// applied, and the clipping coefficient. The reducer applies what this decides.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

struct checked_verdict {
  double gradient_norm = 0;                     // L2 norm of the averaged gradient, before clipping
  std::optional<nonfinite_gradient> nonfinite;  // where the first non-finite value is, when skipped
  bool apply = true;                            // false: skip the step
  double clip_coefficient = 1;                  // what the average is multiplied by when applied
};

inline nonfinite_gradient describe_nonfinite(const variable_set& variables, nonfinite_key key) {
  const nonfinite_place place = decode_nonfinite_key(key);
  const variable& v = variables[place.variable];
  nonfinite_gradient found{place.variable, v.name, place.element, shaped_index(v, place.element), std::nullopt};
  if (place.tower != nonfinite_sum_tower) found.tower = place.tower;
  return found;
}

// `tile_sums`: the screen's sums of squares; `first_nonfinite`: the least non-finite key of the step (of
// its whole accumulation window). Throws under on_nonfinite = throw_error when the average is not finite.
inline checked_verdict judge_checked_step(const screen_partials& screen, nonfinite_key first_nonfinite,
                                          const pipeline_options& options, const variable_set& variables, std::int64_t step) {
  checked_verdict verdict;
  verdict.gradient_norm = std::sqrt(screen.sum_of_squares());
  if (first_nonfinite != no_nonfinite && options.on_nonfinite != nonfinite_policy::unchecked) {
    const nonfinite_gradient& at = *(verdict.nonfinite = describe_nonfinite(variables, first_nonfinite));
    if (options.on_nonfinite == nonfinite_policy::throw_error)
      fail("step ", step, ": non-finite averaged gradient at element ", at.element, " ", at.index, " of variable '",
           at.variable_name, "': ",
           at.tower ? make_message("tower ", *at.tower, "'s gradient is non-finite there")
                    : std::string("every tower's gradient is finite there, their weighted sum overflowed"),
           "; nothing was updated");
    verdict.apply = false;
    return verdict;
  }
  if (options.max_grad_norm > 0)  // torch.nn.utils.clip_grad_norm_: clamp(max_norm / (norm + 1e-6), max=1)
    verdict.clip_coefficient = std::min(1.0, options.max_grad_norm / (verdict.gradient_norm + 1e-6));
  return verdict;
}

}  // namespace detail
}  // namespace towerpipe
