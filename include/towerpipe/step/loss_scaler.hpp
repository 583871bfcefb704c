#pragma once
// The loss scale of a pipeline's steps (pipeline_options::loss_scale, which states the rules):
// torch.cuda.amp.GradScaler's state machine. The scale is a float, as GradScaler's.

#include <cmath>
#include <cstdint>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/step/pipeline_options.hpp"

namespace towerpipe {
namespace detail {

class loss_scaler {
 public:
  // The rules are checked by check_rules (detail::validate, with the pipeline's other options).
  explicit loss_scaler(const loss_scaling& rules) : rules_(rules) {
    if (on()) scale_ = static_cast<float>(rules.initial_scale);
  }

  bool on() const { return rules_.mode != loss_scale_mode::off; }
  bool dynamic() const { return rules_.mode == loss_scale_mode::dynamic; }
  float scale() const { return scale_; }  // 1 when off

  // The towers' weights with the unscaling folded in: (w * 2^-k) * g rounds as 2^-k * (w * g) does.
  template <class T>
  std::vector<T> unscaled(std::vector<T> weights) const {
    if (!on()) return weights;
    const auto inverse = static_cast<T>(1.0 / scale_);  // torch: scale.double().reciprocal().float()
    for (T& w : weights) w = w * inverse;
    return weights;
  }
  std::int64_t good_steps() const { return good_steps_; }

  // A scale and good-step count restored or set by hand; refused whole unless every step can use them.
  void check(double scale, std::int64_t good_steps) const {
    if (!on()) fail("a loss scale was given, but loss scaling is off (pipeline_options::loss_scale)");
    if (!usable(scale) || good_steps < 0 || (dynamic() && good_steps >= rules_.growth_interval))
      fail("a loss scale must be a positive normal float and its good-step count in [0, growth_interval = ",
           rules_.growth_interval, "); ", scale, " and ", good_steps, " given");
  }
  void set(double scale, std::int64_t good_steps) {
    check(scale, good_steps);
    scale_ = static_cast<float>(scale);
    good_steps_ = good_steps;
  }
  double initial_scale() const { return rules_.initial_scale; }

  // After a whole step (accumulation window): torch's _amp_update_scale_, each product taken in double
  // and rounded to float.
  void update(bool finite) {
    if (!dynamic()) return;
    if (!finite) {
      scale_ = static_cast<float>(static_cast<double>(scale_) * rules_.backoff_factor);
      good_steps_ = 0;
      return;
    }
    if (++good_steps_ < rules_.growth_interval) return;
    const float grown = static_cast<float>(static_cast<double>(scale_) * rules_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;
    good_steps_ = 0;
  }

  static void check_rules(const loss_scaling& rules) {
    if (rules.mode == loss_scale_mode::off) return;
    if (!usable(rules.initial_scale))
      fail("loss_scaling::initial_scale must be a positive normal float; ", rules.initial_scale, " given");
    if (rules.mode == loss_scale_mode::fixed) return;
    if (!(rules.growth_factor > 1)) fail("loss_scaling::growth_factor must be > 1; ", rules.growth_factor, " given");
    if (!(rules.backoff_factor > 0 && rules.backoff_factor < 1))
      fail("loss_scaling::backoff_factor must be in (0, 1); ", rules.backoff_factor, " given");
    if (rules.growth_interval < 1) fail("loss_scaling::growth_interval must be >= 1; ", rules.growth_interval, " given");
  }

 private:
  // A scale every step can use: a positive normal float (0 or a subnormal would skip every step after
  // it, or lose the gradients' bits).
  static bool usable(double scale) {
    const float rounded = static_cast<float>(scale);
    return rounded > 0 && std::isnormal(rounded);
  }

  loss_scaling rules_;
  float scale_ = 1.0f;
  std::int64_t good_steps_ = 0;  // finite steps in a row since the scale last changed (dynamic)
};

}  // namespace detail
}  // namespace towerpipe
