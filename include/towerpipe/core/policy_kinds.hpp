#pragma once
// Tags that mark what kind of policy a type is, so that pipeline<Exec, Reduce, Optim, Layout> can say
// which argument is wrong ("exec::host given where a reduction backend belongs") instead of failing
// deep inside a backend.

#include <type_traits>

#include "towerpipe/core/half_types.hpp"

namespace towerpipe {
namespace detail {

struct exec_policy_kind {};
struct reduce_policy_kind {};

template <class Policy, class Kind, class = void>
struct is_policy_of_kind : std::false_type {};
template <class Policy, class Kind>
struct is_policy_of_kind<Policy, Kind, std::void_t<typename Policy::policy_kind>>
    : std::is_same<typename Policy::policy_kind, Kind> {};

// An optimizer: hyper_parameters and a maximum number of state slots (optim/sgd.hpp has the interface).
template <class Optim, class = void>
struct is_optimizer : std::false_type {};
template <class Optim>
struct is_optimizer<Optim, std::void_t<typename Optim::hyper_parameters, decltype(Optim::max_state_slots)>>
    : std::true_type {};

// A layout: value_type and a buffer template (layout/per_variable.hpp has the interface).
template <class Layout, class = void>
struct is_layout : std::false_type {};
template <class Layout>
struct is_layout<Layout, std::void_t<typename Layout::value_type, decltype(Layout::alignment)>> : std::true_type {};

// pipeline<Exec, Reduce, Optim, Layout>'s arguments, each of its kind, in order.
template <class Exec, class Reduce, class Optim, class Layout>
constexpr bool check_pipeline_policies() {
  static_assert(is_policy_of_kind<Exec, exec_policy_kind>::value,
                "towerpipe::pipeline: the first parameter must be an execution space: exec::host "
                "(or exec::cuda from <towerpipe/cuda.cuh>)");
  static_assert(is_policy_of_kind<Reduce, reduce_policy_kind>::value,
                "towerpipe::pipeline: the second parameter must be a reduction backend: reduce::host, reduce::sharded, reduce::automatic "
                "(or reduce::device0, reduce::p2p_tree from <towerpipe/cuda.cuh>)");
  static_assert(is_optimizer<Optim>::value,
                "towerpipe::pipeline: the third parameter must be an optimizer: optim::sgd, optim::adam or optim::adamw");
  static_assert(is_layout<Layout>::value,
                "towerpipe::pipeline: the fourth parameter must be a layout: layout::per_variable<T> or layout::flat<T>");
  if constexpr (is_layout<Layout>::value) {
    static_assert(std::is_floating_point<typename Layout::value_type>::value ||
                      std::is_same<typename Layout::value_type, bfloat16>::value ||
                      std::is_same<typename Layout::value_type, float16>::value,
                  "towerpipe::pipeline: the layout's values must be float, double, bfloat16 or float16");
  }
  return true;
}

}  // namespace detail
}  // namespace towerpipe
