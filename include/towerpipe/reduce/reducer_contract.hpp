#pragma once
// The reducer interface: what pipeline<Exec, Reduce, Optim, Layout> needs of
// reducer_for<Exec, Reduce, Optim, Layout>::type (reduce/reducer_for.hpp), written down as the optimizer
// interface is in optim/sgd.hpp and checked by the pipeline with a static_assert per member.
//
//   reducer(variables, hyper_parameters, towers&)     constructor; allocates the optimizer state (zeros)
//   void average_and_apply(towers&, const std::vector<T>& weights, const step_constants<T>&, stage_seconds&)
//       one step: canonical weighted average of the towers' gradients (programs/canonical_order.hpp), the
//       optimizer's update, the new parameters on every tower; fills stages.reduce (and .broadcast)
//   screen_partials screen_average(towers&, const std::vector<T>& weights, const accumulation<T>&, stage_seconds&)
//       the first pass of a checked step (programs/screen.hpp): the canonical average into a buffer of the
//       reducer's (with accumulation: into its running sum), the tiles' sums of squares and the first
//       non-finite key; changes no parameter or state
//   void apply_averaged(towers&, T scale, const step_constants<T>&, stage_seconds&)
//       the second: the optimizer on scale * that average, the new parameters on every tower.
//       Precondition: called once after the screen_average of the same step whose accumulation was the
//       window's last (or had none), and only when that step is not skipped; between the two calls
//       nothing else touches the towers' gradients or the reducer
//   std::size_t state_slots() const                    optimizer state slots allocated
//   tensor_view<const T> state_on_host(slot, variable)  between steps
//   void set_state(slot, variable, const T* values)     between steps
// Required with 16-bit towers (mixed precision: T is the master type, the towers hold 16-bit values):
//   tensor_view<const T> master_on_host(variable)      the master parameters, between steps
//   void parameter_set(variable, const T* values)       told after the towers' parameters were set: the
//                                                       master follows them (else it stays zero)
// Optional:
//   reducer(variables, hyper_parameters, towers&, const pipeline_options&)   a constructor that reads the options
//   reducer(variables, hyper_parameters, towers&, const pipeline_options&, const processes&)
//                                                       for reducers whose towers span processes
//                                                       (reduce::sharded): the pipeline owns the processes
//                                                       (step/processes.hpp), agrees with the others through
//                                                       them every step, and lends them for the exchange
//   void parameter_set(variable, const T* values)       without 16-bit towers: for reducers that keep a
//                                                       master copy of their own (across processes)
//   std::vector<std::size_t> state_bytes_per_tower(towers) const   for reducers that spread the optimizer
//                                                       state over the towers' devices (reduce::sharded)
//   bool overlaps_buckets() const, screen_partials begin_screen(),
//   void screen_part(towers&, const step_part&, weights, accumulation, screen_partials&, stage_seconds&),
//   void average_and_apply_part(towers&, const step_part&, weights, constants, stage_seconds&)
//                                                       the passes over a part of the step only
//                                                       (step/buckets.hpp): such a reducer takes gradient
//                                                       buckets while the towers run, where
//                                                       overlaps_buckets() (reduce/overlapped_reduction.hpp),
//                                                       then what is left after them, which finishes the
//                                                       pass (and fills stages.reduce, stages.broadcast);
//                                                       begin_screen() before a checked step's parts;
//                                                       the others reduce every bucket after the towers
//   const char* backend_name() const, const backend_choice& choice() const
//                                                       reduce::automatic: the backend it runs, and why
//   void join_parts(towers&)                            after a failed step: waits for the parts it
//                                                       enqueued (on devices), orders the towers' next
//                                                       work after them, and forgets the step's parts
//   void settle_part(towers&, const step_part& rest, weights)   across processes, where buckets went during
//                                                       the towers: after them (or a tower's failure),
//                                                       before the processes agree on their outcome,
//                                                       what must happen on every process alike whatever
//                                                       its towers did (reduce::sharded: the rest of the
//                                                       exchange); the part of `rest` then finishes
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/exec/towers_contract.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/programs/screen.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/split.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Reducer, class Towers, class Optim, class T, class = void>
struct reducer_has_average_and_apply : std::false_type {};
template <class Reducer, class Towers, class Optim, class T>
struct reducer_has_average_and_apply<
    Reducer, Towers, Optim, T,
    std::void_t<decltype(std::declval<Reducer&>().average_and_apply(
        std::declval<Towers&>(), std::declval<const std::vector<T>&>(),
        std::declval<const typename Optim::template step_constants<T>&>(), std::declval<stage_seconds&>()))>>
    : std::true_type {};

template <class Reducer, class Towers, class Optim, class T, class = void>
struct reducer_has_checked_passes : std::false_type {};
template <class Reducer, class Towers, class Optim, class T>
struct reducer_has_checked_passes<
    Reducer, Towers, Optim, T,
    std::void_t<decltype(std::declval<Reducer&>().screen_average(std::declval<Towers&>(), std::declval<const std::vector<T>&>(),
                                                                  std::declval<const accumulation<T>&>(),
                                                                  std::declval<stage_seconds&>())),
                decltype(std::declval<Reducer&>().apply_averaged(
                    std::declval<Towers&>(), std::declval<T>(),
                    std::declval<const typename Optim::template step_constants<T>&>(), std::declval<stage_seconds&>()))>>
    : std::true_type {};

TOWERPIPE_DETECT_MEMBER(reducer_has_state_slots, std::declval<const T&>().state_slots());
TOWERPIPE_DETECT_MEMBER(reducer_has_state_on_host, std::declval<T&>().state_on_host(std::size_t{}, std::size_t{}));
TOWERPIPE_DETECT_MEMBER(reducer_has_set_state, std::declval<T&>().set_state(std::size_t{}, std::size_t{}, nullptr));
TOWERPIPE_DETECT_MEMBER(reducer_has_master_on_host, std::declval<T&>().master_on_host(std::size_t{}));
TOWERPIPE_DETECT_MEMBER(reducer_has_parameter_set, std::declval<T&>().parameter_set(std::size_t{}, nullptr));
TOWERPIPE_DETECT_MEMBER(reducer_chooses_backend, std::declval<const T&>().choice());
TOWERPIPE_DETECT_MEMBER(reducer_spreads_state, std::declval<const T&>().state_bytes_per_tower(std::size_t{}));

template <class Reducer, class Towers, class Optim, class T, class = void>
struct reducer_reduces_parts : std::false_type {};
template <class Reducer, class Towers, class Optim, class T>
struct reducer_reduces_parts<
    Reducer, Towers, Optim, T,
    std::void_t<decltype(std::declval<Reducer&>().screen_part(std::declval<Towers&>(), std::declval<const step_part&>(),
                                                               std::declval<const std::vector<T>&>(),
                                                               std::declval<const accumulation<T>&>(), std::declval<screen_partials&>(),
                                                               std::declval<stage_seconds&>())),
                decltype(std::declval<Reducer&>().average_and_apply_part(
                    std::declval<Towers&>(), std::declval<const step_part&>(), std::declval<const std::vector<T>&>(),
                    std::declval<const typename Optim::template step_constants<T>&>(), std::declval<stage_seconds&>())),
                decltype(std::declval<Reducer&>().begin_screen()), decltype(std::declval<const Reducer&>().overlaps_buckets())>>
    : std::true_type {};

template <class Reducer, class Towers, class = void>
struct reducer_has_join_parts : std::false_type {};
template <class Reducer, class Towers>
struct reducer_has_join_parts<Reducer, Towers, std::void_t<decltype(std::declval<Reducer&>().join_parts(std::declval<Towers&>()))>>
    : std::true_type {};

template <class Reducer, class Towers, class T, class = void>
struct reducer_settles_parts : std::false_type {};
template <class Reducer, class Towers, class T>
struct reducer_settles_parts<Reducer, Towers, T,
                             std::void_t<decltype(std::declval<Reducer&>().settle_part(
                                 std::declval<Towers&>(), std::declval<const step_part&>(), std::declval<const std::vector<T>&>()))>>
    : std::true_type {};

template <class Reducer, class Towers, class Optim>
using reducer_spans_processes = std::is_constructible<Reducer, const variable_set&, const typename Optim::hyper_parameters&, Towers&,
                                                      const pipeline_options&, const processes&>;

// Builds a reducer with the arguments its constructors take: the options as a fourth argument where it
// reads them, the processes as a fifth where its towers span processes (reduce::sharded).
template <class Reducer, class Towers, class Optim>
std::unique_ptr<Reducer> make_reducer(const variable_set& variables, const typename Optim::hyper_parameters& h, Towers& towers,
                                      const pipeline_options& options, const processes& span) {
  if constexpr (reducer_spans_processes<Reducer, Towers, Optim>::value) {
    return std::make_unique<Reducer>(variables, h, towers, options, span);
  } else if constexpr (std::is_constructible<Reducer, const variable_set&, const typename Optim::hyper_parameters&, Towers&,
                                             const pipeline_options&>::value) {
    return std::make_unique<Reducer>(variables, h, towers, options);
  } else {
    return std::make_unique<Reducer>(variables, h, towers);
  }
}

template <class Reducer, class Towers, class Optim, class T, bool MixedPrecision>
constexpr bool check_reducer_contract() {
  static_assert(!MixedPrecision || reducer_has_master_on_host<Reducer>::value,
                "towerpipe: the reduction backend takes 16-bit towers but lacks 'master_on_host(variable)'");
  static_assert(!MixedPrecision || reducer_has_parameter_set<Reducer>::value,
                "towerpipe: the reduction backend takes 16-bit towers but lacks 'parameter_set(variable, values)', "
                "so its fp32 master would never follow set_parameter");
  static_assert(reducer_has_average_and_apply<Reducer, Towers, Optim, T>::value,
                "towerpipe: the reduction backend lacks 'average_and_apply(towers, weights, constants, stages)'");
  static_assert(reducer_has_checked_passes<Reducer, Towers, Optim, T>::value,
                "towerpipe: the reduction backend lacks 'screen_average(towers, weights, accumulation, stages)' or "
                "'apply_averaged(towers, scale, constants, stages)' (the passes of a checked step)");
  static_assert(reducer_has_state_slots<Reducer>::value, "towerpipe: the reduction backend lacks 'state_slots() const'");
  static_assert(reducer_has_state_on_host<Reducer>::value,
                "towerpipe: the reduction backend lacks 'state_on_host(slot, variable)'");
  static_assert(reducer_has_set_state<Reducer>::value,
                "towerpipe: the reduction backend lacks 'set_state(slot, variable, values)'");
  return true;
}

}  // namespace detail
}  // namespace towerpipe
