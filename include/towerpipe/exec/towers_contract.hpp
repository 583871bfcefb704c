#pragma once
// The towers interface: what pipeline<Exec, ...> needs of Exec::towers<Layout> (exec::host's host_towers,
// the device_towers of exec::cuda and exec::simulated), written down as the optimizer interface is in
// optim/sgd.hpp and checked by the pipeline with a static_assert per member that names it.
//
//   using value_type, context                   the layout's value type; what a tower function receives
//   towers(variables, tower_count, options)     constructor (pipeline_options)
//   std::size_t towers() const
//   void stage(const batch&, const std::vector<shard>&)   keeps (exec::host) or copies (exec::cuda) the shards
//   std::size_t staged() const                  batches staged and not yet run
//   const std::vector<shard>& next_shards() const         the shards the next run() uses
//   void discard_next()                                    drops the oldest staged batch unrun
//   std::vector<double> run(TowerFn&, std::int64_t step)  runs every tower on the oldest staged batch,
//                                               consumes it, returns the losses; throws a towerpipe::error
//                                               naming the tower when one failed (gradient contract,
//                                               exec/tower_context.hpp)
//   tensor_view<const value_type> parameter_on_host(std::size_t variable)   between steps
//   void set_parameter(std::size_t variable, const value_type* values)       on every tower
//   void finish_step(std::int64_t step)         called after the reduction (GPU towers record their
//                                               device-side timeline spans there)
//   void set_ready_listener(tower_ready_listener*)  where gradient_ready marks go (exec/tower_context.hpp)
//   const tracer& trace() const                 where the step's spans go (pipeline_options::trace)
//   void prepare_bucket_events(buckets), record_bucket_done(tower, bucket)
//                                               an event per tower and bucket, recorded on the tower's
//                                               stream when it has marked the bucket (GPU towers; host
//                                               towers have nothing to record)

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/data/batch.hpp"
#include "towerpipe/data/split.hpp"

namespace towerpipe {
namespace detail {

#define TOWERPIPE_DETECT_MEMBER(trait, expression)               \
  template <class T, class = void>                               \
  struct trait : std::false_type {};                             \
  template <class T>                                             \
  struct trait<T, std::void_t<decltype(expression)>> : std::true_type {}

TOWERPIPE_DETECT_MEMBER(towers_has_count, std::declval<const T&>().towers());
TOWERPIPE_DETECT_MEMBER(towers_has_stage, std::declval<T&>().stage(std::declval<const batch&>(),
                                                                   std::declval<const std::vector<shard>&>()));
TOWERPIPE_DETECT_MEMBER(towers_has_staged, std::declval<const T&>().staged());
TOWERPIPE_DETECT_MEMBER(towers_has_next_shards, std::declval<const T&>().next_shards());
TOWERPIPE_DETECT_MEMBER(towers_has_discard_next, std::declval<T&>().discard_next());
TOWERPIPE_DETECT_MEMBER(towers_has_run,  // with a tower function that only names the context type
                        std::declval<T&>().run(std::declval<double (&)(typename T::context&)>(), std::int64_t{}));
TOWERPIPE_DETECT_MEMBER(towers_has_parameter_on_host, std::declval<T&>().parameter_on_host(std::size_t{}));
TOWERPIPE_DETECT_MEMBER(towers_has_set_parameter,
                        std::declval<T&>().set_parameter(std::size_t{}, std::declval<const typename T::value_type*>()));
TOWERPIPE_DETECT_MEMBER(towers_has_step_hooks,
                        (std::declval<T&>().finish_step(std::int64_t{}), std::declval<T&>().set_ready_listener(nullptr),
                         std::declval<T&>().prepare_bucket_events(std::size_t{}),
                         std::declval<T&>().record_bucket_done(std::size_t{}, std::size_t{}), std::declval<const T&>().trace()));
TOWERPIPE_DETECT_MEMBER(has_context_type, std::declval<typename T::context>());

// Fails compilation with the name of the first member Towers lacks.
template <class Towers>
constexpr bool check_towers_contract() {
  static_assert(has_context_type<Towers>::value, "towerpipe: the execution space's towers lack 'using context'");
  static_assert(towers_has_count<Towers>::value, "towerpipe: the execution space's towers lack 'towers() const'");
  static_assert(towers_has_stage<Towers>::value, "towerpipe: the execution space's towers lack 'stage(batch, shards)'");
  static_assert(towers_has_staged<Towers>::value, "towerpipe: the execution space's towers lack 'staged() const'");
  static_assert(towers_has_next_shards<Towers>::value,
                "towerpipe: the execution space's towers lack 'next_shards() const'");
  static_assert(towers_has_run<Towers>::value, "towerpipe: the execution space's towers lack 'run(fn, step)'");
  static_assert(towers_has_discard_next<Towers>::value, "towerpipe: the execution space's towers lack 'discard_next()'");
  static_assert(towers_has_parameter_on_host<Towers>::value,
                "towerpipe: the execution space's towers lack 'parameter_on_host(variable)'");
  static_assert(towers_has_set_parameter<Towers>::value,
                "towerpipe: the execution space's towers lack 'set_parameter(variable, values)'");
  static_assert(towers_has_step_hooks<Towers>::value,
                "towerpipe: the execution space's towers lack one of 'finish_step(step)', 'set_ready_listener(listener)', "
                "'prepare_bucket_events(buckets)', 'record_bucket_done(tower, bucket)', 'trace() const'");
  return true;
}

}  // namespace detail
}  // namespace towerpipe
