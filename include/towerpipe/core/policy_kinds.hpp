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

}  // namespace detail
}  // namespace towerpipe
