#pragma once
// precision<Layout> — the types a pipeline's numbers come in. The towers hold stored_type (the layout's
// value type) in their parameters and gradients; the master parameters, the optimizer state and the
// averaged gradient are master_type: float for bf16 and fp16 towers (mixed precision), else the same
// type. Every component that needs the distinction takes it from here.

#include <type_traits>

#include "towerpipe/core/half_types.hpp"

namespace towerpipe {

template <class Layout>
struct precision {
  using stored_type = typename Layout::value_type;
  using master_type = master_type_t<stored_type>;
  static constexpr bool mixed = !std::is_same<stored_type, master_type>::value;
};

}  // namespace towerpipe
