#pragma once
// optim::sgd — torch.optim.SGD (maximize = false), per element, step t = 1, 2, ...:
//
//   d = g                                   gradient (the tower average)
//   if weight_decay != 0:  d = d + weight_decay * p
//   if momentum != 0:
//     b = (t == 1) ? d : momentum * b + (1 - dampening) * d     momentum buffer, state slot 0
//     d = nesterov ? d + momentum * b : b
//   p = p - lr * d
//
// Every operation is rounded once (no fused multiply-add), so host and device agree bitwise.
// Validation as torch: lr, momentum, weight_decay >= 0; nesterov needs momentum > 0 and dampening = 0;
// besides, nothing may be NaN or infinite.
//
// The optimizer interface every backend uses:
//   hyper_parameters, validate(h), max_state_slots, state_slots(h) (slots actually allocated),
//   step_constants<T> + constants<T>(h, t) (computed on the host in double, once per step),
//   update(c, g, p, state) — the per-element step on values in registers; state points at
//   max_state_slots values of which the first state_slots(h) are loaded and stored by the caller;
//   describe(h) — the hyper-parameters as text, exact (processes compare it: reduce::sharded).

#include <cmath>
#include <cstdint>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/optim/hyper_parameter_checks.hpp"

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace optim {

struct sgd {
  static constexpr const char* name = "sgd";

  struct hyper_parameters {
    double lr = 1e-3;
    double momentum = 0.0;
    double dampening = 0.0;
    bool nesterov = false;
    double weight_decay = 0.0;
  };

  static constexpr int max_state_slots = 1;
  static int state_slots(const hyper_parameters& h) { return h.momentum != 0.0 ? 1 : 0; }

  static std::string describe(const hyper_parameters& h) {
    return detail::describe_values({{"lr", h.lr},
                                    {"momentum", h.momentum},
                                    {"dampening", h.dampening},
                                    {"nesterov", h.nesterov ? 1.0 : 0.0},
                                    {"weight_decay", h.weight_decay}});
  }

  static void validate(const hyper_parameters& h) {
    detail::require_non_negative(name, "learning rate", h.lr);
    detail::require_non_negative(name, "momentum", h.momentum);
    detail::require_non_negative(name, "weight_decay", h.weight_decay);
    if (!std::isfinite(h.dampening)) towerpipe::detail::fail(name, ": invalid dampening ", h.dampening);
    if (h.nesterov && (h.momentum <= 0.0 || h.dampening != 0.0))
      towerpipe::detail::fail(name, ": nesterov momentum requires a momentum > 0 and zero dampening (momentum ",
                              h.momentum, ", dampening ", h.dampening, ")");
  }

  template <class T>
  struct step_constants {
    T lr, momentum, one_minus_dampening, weight_decay;
    bool nesterov, first_step;
  };

  template <class T>
  static step_constants<T> constants(const hyper_parameters& h, std::int64_t step) {
    return {static_cast<T>(h.lr),           static_cast<T>(h.momentum), static_cast<T>(1.0 - h.dampening),
            static_cast<T>(h.weight_decay), h.nesterov,                 step == 1};
  }

  template <class T>
  TOWERPIPE_HOST_DEVICE static void update(const step_constants<T>& c, T grad, T& param, T* state) {
    using namespace towerpipe::detail;
    T d = grad;
    if (c.weight_decay != T(0)) d = rounded_add(d, rounded_mul(c.weight_decay, param));
    if (c.momentum != T(0)) {
      T& buffer = state[0];
      buffer = c.first_step ? d : rounded_add(rounded_mul(c.momentum, buffer), rounded_mul(c.one_minus_dampening, d));
      d = c.nesterov ? rounded_add(d, rounded_mul(c.momentum, buffer)) : buffer;
    }
    param = rounded_sub(param, rounded_mul(c.lr, d));
  }
};

}  // namespace optim
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
