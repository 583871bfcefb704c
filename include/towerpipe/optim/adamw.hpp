#pragma once
// optim::adamw — torch.optim.AdamW (amsgrad = false, maximize = false): decoupled weight decay,
// then Adam without the L2 term:
//
//   p = p * (1 - lr * weight_decay)        the factor computed on the host in double, once per step
//   m, v, p as in optim::adam with weight_decay = 0
//
// Defaults as torch: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. Validation as optim::adam.

#include "towerpipe/optim/adam.hpp"

namespace towerpipe {
namespace optim {

using adamw = detail::adam_family<true>;

}  // namespace optim
}  // namespace towerpipe
