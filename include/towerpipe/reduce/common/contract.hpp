#pragma once
// The reducer contract: what pipeline<Exec, Reduce, Optim, Layout> needs of the class that averages the
// towers' gradients, applies the optimizer and hands the new parameters back to the towers
// (reducer_for<Exec, Reduce, Optim, Layout>::type). Every member is required; optional behaviour is
// declared, not probed: `capabilities` says what the pipeline may expect of the reducer.
//
// A step is parts (pipeline/step_parts.hpp drives them), the same for every reducer and every step:
//   begin_step(towers, work)      before the towers run: this step's weights, constants and kind
//   reduce_part(towers, part)     a gradient bucket while the towers run (on the bucket worker, only where
//                                 buckets_during_towers()), then, after the towers, the rest (maybe no
//                                 variable at all) on the pipeline's thread. An unbucketed step is one part
//                                 over every variable.
//   finish(towers, stages)        after the processes agreed on the towers (step/processes.hpp): an
//                                 unchecked step's parameters are applied and on every tower when it
//                                 returns; a checked step returns its screen (kernels/screen.hpp)
//   apply(towers, scale, stages)  a checked step that is not skipped: the optimizer on scale * average
//   abandon(towers)               after a failure anywhere in the step: what was enqueued is waited for,
//                                 the towers' next work is ordered after it, the step's parts are forgotten
// The state store, between steps:
//   state_slots(), state(slot, v), set_state(slot, v, values)   the optimizer state
//   master(v), set_master(v, values)   the master parameters (mixed precision: the fp32 copy the towers'
//                                 16-bit parameters are rounded from; else the towers' own); set_master
//                                 is told after the towers' parameters were set
//   state_bytes_per_tower()       optimizer state bytes on each tower's device (or 0s where it is on the host)
// And what it is: choice() (which backend runs and why: reduce::automatic's pick, or the type's name).
//
// Bits: every reducer gives the parameters, state and screen of the canonical order (plan/canonical_order.hpp),
// whatever its parts; a reducer that spans processes (capabilities.spans_processes) changes nothing
// before finish(), and its reduce_part(rest) runs on every process even after a tower failed (the
// processes' collectives must stay in step; the agreement then fails the step everywhere).

#include <chrono>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {

// Which reduction backend a pipeline runs, and why: the type's (reduce::host, ...) or reduce::automatic's
// choice (reduce/choice/automatic.hpp).
struct backend_choice {
  std::string backend;  // its name, as in reduce::<name>
  std::string reason;
};

// What a reducer declares of itself (CUB's policy style: a constexpr value the pipeline reads).
struct reducer_capabilities {
  bool spans_processes = false;  // takes pipeline_options::processes (see the top)
  bool spreads_state = false;    // keeps about 1/N of the optimizer state on each tower's device
  bool chooses_backend = false;  // runs one of several backends it chose (reduce::automatic): takes time_backends
};

namespace detail {

inline backend_choice named_by_type(const char* name) {
  return {name, make_message("reduce::", name, " named by the pipeline's type")};
}

// The reducers' stage times (stage_seconds) on the host clock.
using step_clock = std::chrono::steady_clock;
inline double seconds_since(step_clock::time_point start) {
  return std::chrono::duration<double>(step_clock::now() - start).count();
}

// What every reducer is built from.
template <class Towers, class Optim>
struct reducer_setup {
  const variable_set& variables;
  const typename Optim::hyper_parameters& hyper;
  Towers& towers;
  const pipeline_options& options;
  const processes& span;  // the processes the towers span (this one alone without options.processes)
};

// One step's work, fixed before its towers run. T: the master type.
template <class T, class Optim>
struct step_work {
  std::vector<T> weights;  // per tower; a checked step's are divided by the loss scale
  bool checked = false;    // average + screen in the parts, the optimizer in apply(); else all in the parts
  accumulation<T> window;  // a checked step's place in its accumulation window
  typename Optim::template step_constants<T> constants{};  // the optimizer's, for this step's number
  // Whether buckets are reduced while the towers run this step (pipeline/step_parts.hpp decides): a reducer
  // across processes then exchanges bucket by bucket, in bucket order, else once after the towers.
  bool parts_during_towers = false;
};

template <class R, class Towers, class Optim, class T, class = void>
struct reducer_has_step_members : std::false_type {};
template <class R, class Towers, class Optim, class T>
struct reducer_has_step_members<
    R, Towers, Optim, T,
    std::void_t<decltype(std::declval<const R&>().choice()), decltype(bool(std::declval<const R&>().buckets_during_towers())),
                decltype(std::declval<R&>().begin_step(std::declval<Towers&>(), std::declval<const step_work<T, Optim>&>())),
                decltype(std::declval<R&>().reduce_part(std::declval<Towers&>(), std::declval<const step_part&>())),
                decltype(screen_partials(std::declval<R&>().finish(std::declval<Towers&>(), std::declval<stage_seconds&>()))),
                decltype(std::declval<R&>().apply(std::declval<Towers&>(), std::declval<T>(), std::declval<stage_seconds&>())),
                decltype(std::declval<R&>().abandon(std::declval<Towers&>()))>> : std::true_type {};

template <class R, class T, class = void>
struct reducer_has_state_store : std::false_type {};
template <class R, class T>
struct reducer_has_state_store<
    R, T,
    std::void_t<decltype(std::size_t(std::declval<const R&>().state_slots())),
                decltype(tensor_view<const T>(std::declval<R&>().state(std::size_t{}, std::size_t{}))),
                decltype(std::declval<R&>().set_state(std::size_t{}, std::size_t{}, std::declval<const T*>())),
                decltype(tensor_view<const T>(std::declval<R&>().master(std::size_t{}))),
                decltype(std::declval<R&>().set_master(std::size_t{}, std::declval<const T*>())),
                decltype(std::vector<std::size_t>(std::declval<const R&>().state_bytes_per_tower()))>> : std::true_type {};

// Fails compilation with what a reducer lacks (see the top for each member's meaning).
template <class R, class Towers, class Optim, class T>
constexpr bool check_reducer_contract() {
  static_assert(std::is_same<std::decay_t<decltype(R::capabilities)>, reducer_capabilities>::value,
                "towerpipe: a reducer declares `static constexpr reducer_capabilities capabilities`");
  static_assert(std::is_constructible<R, const reducer_setup<Towers, Optim>&>::value,
                "towerpipe: a reducer is constructed from a reducer_setup<Towers, Optim>");
  static_assert(reducer_has_step_members<R, Towers, Optim, T>::value,
                "towerpipe: a reducer lacks one of choice(), buckets_during_towers(), begin_step(towers, work), "
                "reduce_part(towers, part), finish(towers, stages), apply(towers, scale, stages), abandon(towers)");
  static_assert(reducer_has_state_store<R, T>::value,
                "towerpipe: a reducer lacks one of state_slots(), state(slot, variable), set_state(slot, variable, values), "
                "master(variable), set_master(variable, values), state_bytes_per_tower()");
  return true;
}

}  // namespace detail
}  // namespace towerpipe
