#pragma once
// Tags that mark what kind of policy a type is, so that pipeline<Exec, Reduce, Optim, Layout> can say
// which argument is wrong ("exec::host given where a reduction backend belongs") instead of failing
// deep inside a backend.

#include <type_traits>

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

}  // namespace detail
}  // namespace towerpipe
