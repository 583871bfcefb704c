#pragma once
// The whole step of a reducer that reduces parts of a step (reduce/reducer_contract.hpp: screen_part,
// average_and_apply_part): one part over every variable, so that the unbucketed step runs the very code
// the buckets run. A reducer derives from whole_step_as_one_part<itself> and gets average_and_apply and
// screen_average from its part members.

#include <cstddef>
#include <vector>

#include "towerpipe/programs/screen.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class T>
struct non_deduced {
  using type = T;
};

template <class Reducer>
class whole_step_as_one_part {
 public:
  // One step: the average, the optimizer and the new parameters, as one part.
  template <class Towers, class Weights, class Constants>
  void average_and_apply(Towers& towers, const Weights& weights, const Constants& constants, stage_seconds& stages) {
    self().average_and_apply_part(towers, whole_step(), weights, constants, stages);
  }
  // A checked step, pass 1: the average and its screen, as one part.
  // (T from the weights alone, so that `step` may be given as {}.)
  template <class Towers, class T>
  screen_partials screen_average(Towers& towers, const std::vector<T>& weights, const typename non_deduced<accumulation<T>>::type& step,
                                 stage_seconds& stages) {
    screen_partials partials = self().begin_screen();
    self().screen_part(towers, whole_step(), weights, step, partials, stages);
    return partials;
  }

 protected:
  explicit whole_step_as_one_part(std::size_t variables) : every_variable_(every_variable(variables)) {}

 private:
  Reducer& self() { return static_cast<Reducer&>(*this); }
  step_part whole_step() const { return step_part{every_variable_, no_bucket}; }

  std::vector<std::size_t> every_variable_;  // 0, 1, ...
};

}  // namespace detail
}  // namespace towerpipe
