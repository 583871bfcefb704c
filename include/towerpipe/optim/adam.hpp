#pragma once
// optim::adam — torch.optim.Adam (amsgrad = false, maximize = false), per element, step t = 1, 2, ...:
//
//   if weight_decay != 0:  g = g + weight_decay * p          L2 penalty folded into the gradient
//   m = beta1 * m + (1 - beta1) * g                            state slot 0
//   v = beta2 * v + (1 - beta2) * g * g                        state slot 1
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// Why: docs/design-notes.md#optim-adam

#include <cmath>
#include <cstdint>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/optim/hyper_parameter_checks.hpp"

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace optim {
namespace detail {

// Adam and AdamW: the same moments and step; they differ only in how weight decay enters.
template <bool DecoupledWeightDecay>
struct adam_family {
  static constexpr const char* name = DecoupledWeightDecay ? "adamw" : "adam";

  struct hyper_parameters {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = DecoupledWeightDecay ? 1e-2 : 0.0;  // torch's defaults
  };

  static constexpr int max_state_slots = 2;
  static int state_slots(const hyper_parameters&) { return 2; }

  static std::string describe(const hyper_parameters& h) {
    return describe_values(
        {{"lr", h.lr}, {"beta1", h.beta1}, {"beta2", h.beta2}, {"eps", h.eps}, {"weight_decay", h.weight_decay}});
  }

  static void validate(const hyper_parameters& h) {
    require_non_negative(name, "learning rate", h.lr);
    require_non_negative(name, "epsilon", h.eps);
    require_beta(name, "beta1", h.beta1);
    require_beta(name, "beta2", h.beta2);
    require_non_negative(name, "weight_decay", h.weight_decay);
  }

  template <class T>
  struct step_constants {
    T beta1, one_minus_beta1, beta2, one_minus_beta2;
    T step_size;              // lr / (1 - beta1^t)
    T bias_correction2_sqrt;  // sqrt(1 - beta2^t)
    T eps;
    T decay;                  // adam: the L2 coefficient weight_decay; adamw: the factor 1 - lr * weight_decay
  };

  template <class T>
  static step_constants<T> constants(const hyper_parameters& h, std::int64_t step) {
    const double t = static_cast<double>(step);
    return {static_cast<T>(h.beta1),
            static_cast<T>(1.0 - h.beta1),
            static_cast<T>(h.beta2),
            static_cast<T>(1.0 - h.beta2),
            static_cast<T>(h.lr / (1.0 - std::pow(h.beta1, t))),
            static_cast<T>(std::sqrt(1.0 - std::pow(h.beta2, t))),
            static_cast<T>(h.eps),
            static_cast<T>(DecoupledWeightDecay ? 1.0 - h.lr * h.weight_decay : h.weight_decay)};
  }

  template <class T>
  TOWERPIPE_HOST_DEVICE static void update(const step_constants<T>& c, T grad, T& param, T* state) {
    using namespace towerpipe::detail;
    if constexpr (DecoupledWeightDecay) {
      param = rounded_mul(param, c.decay);
    } else if (c.decay != T(0)) {
      grad = rounded_add(grad, rounded_mul(c.decay, param));
    }
    T& m = state[0];
    T& v = state[1];
    m = rounded_add(rounded_mul(c.beta1, m), rounded_mul(c.one_minus_beta1, grad));
    v = rounded_add(rounded_mul(c.beta2, v), rounded_mul(c.one_minus_beta2, rounded_mul(grad, grad)));
    const T denominator = rounded_add(rounded_div(rounded_sqrt(v), c.bias_correction2_sqrt), c.eps);
    param = rounded_sub(param, rounded_mul(c.step_size, rounded_div(m, denominator)));
  }
};

}  // namespace detail

using adam = detail::adam_family<false>;

}  // namespace optim
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
