#pragma once
// What a pipeline checks of its options and input specs at construction, before it allocates anything.

#include <cmath>
#include <cstddef>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/step/loss_scaler.hpp"
#include "towerpipe/step/pipeline_options.hpp"

namespace towerpipe {
namespace detail {

// checked: whether the steps take the checked passes (takes_checked_steps).
inline void validate(const pipeline_options& options, std::size_t towers, std::size_t variables, bool checked) {
  loss_scaler::check_rules(options.loss_scale);
  if (options.loss_scale.mode == loss_scale_mode::dynamic && options.on_nonfinite != nonfinite_policy::skip)
    fail("dynamic loss scaling skips the steps that overflow by design: it needs on_nonfinite = skip");
  if (options.accumulation_steps == 0) fail("pipeline_options::accumulation_steps must be >= 1");
  if (options.time_backends > max_time_backends)
    fail("pipeline_options::time_backends is ", options.time_backends, ": at most ", max_time_backends,
         " trials (each runs every candidate backend's reduction of the first step again; the median of a few tells them apart)");
  if (options.time_backends > 0 && options.accumulation_steps > 1)
    fail("pipeline_options::time_backends times whole optimizer steps: it does not take accumulation_steps > 1 (",
         options.accumulation_steps, " given)");
  if (!(options.max_grad_norm >= 0) || std::isinf(options.max_grad_norm))
    fail("pipeline_options::max_grad_norm must be finite and >= 0 (0: no clipping); ", options.max_grad_norm, " given");
  if (checked && towers >= nonfinite_sum_tower)
    fail("a checked pipeline takes at most ", nonfinite_sum_tower - 1, " towers, ", towers,
         " requested (pipeline_options::on_nonfinite = unchecked lifts the limit)");
  if (checked && variables >= max_screened_variables)
    fail("a checked pipeline takes fewer than ", max_screened_variables, " variables, ", variables, " given");
}

inline void validate(const std::vector<input_spec>& inputs) {
  if (inputs.empty()) fail("a pipeline needs at least one input_spec (the batch's inputs, e.g. \"x\")");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].name.empty()) fail("input_spec #", i, " has an empty name");
    for (std::size_t j = 0; j < i; ++j) {
      if (inputs[j].name == inputs[i].name)
        fail("input_spec #", i, " repeats the name '", inputs[i].name, "' of input_spec #", j);
    }
  }
}

}  // namespace detail
}  // namespace towerpipe
