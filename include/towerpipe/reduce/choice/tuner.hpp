#pragma once
// backend_tuner — pipeline_options::time_backends for reduce::automatic (reduce/choice/automatic.hpp): every
// candidate built, timed on the first step that applies the optimizer, the fastest kept.
// Why: docs/design-notes.md#reduce-choice-tuner

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/reduce/common/contract.hpp"

namespace towerpipe {
namespace detail {

// What reduce::automatic needs of an execution space's towers, one specialisation per towers type:
//   static tower_topology describe(Towers&)      the towers' devices and the links between them
//   class gradient_copy                    gradient_copy(const variable_set&, Towers&); save(Towers&); restore(Towers&)
template <class Towers>
struct automatic_space;

// Candidate: a one_of (reduce/common/one_of.hpp) of the candidates' reducers (all alive while timing).
template <class Towers, class Optim, class Layout, class Candidate>
class backend_tuner {
 public:
  using T = typename precision<Layout>::master_type;
  using work_type = step_work<T, Optim>;

  backend_tuner(std::vector<Candidate> candidates, std::vector<std::string> names, std::size_t trials, const variable_set& variables)
      : candidates_(std::move(candidates)), names_(std::move(names)), trials_(trials), variables_(variables) {}

  std::vector<Candidate>& candidates() { return candidates_; }

  // A checked step's first pass: every candidate screens the step's gradients (restored before each trial:
  // the device trees add into them); the screens must agree.
  screen_partials screen(Towers& towers, const work_type& work) {
    take_snapshot(towers);
    screen_partials reference;
    guarded(towers, [&] {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for (std::size_t i = 0; i < candidates_.size(); ++i) {
          gradients_->restore(towers);
          stage_seconds s;
          const screen_partials mine = whole_step(candidates_[i], towers, work, s);
          seconds_[i].push_back(s.reduce + s.broadcast);
          if (trial != 0) continue;
          if (i == 0) {
            reference = mine;
          } else if (mine.first_nonfinite != reference.first_nonfinite || !same_bits(mine.sum_of_squares(), reference.sum_of_squares())) {
            fail("reduce::automatic: reduce::", names_[0], " and reduce::", names_[i], " screened the same gradients differently (sums ",
                 "of squares or the first non-finite element) while timing the backends; the step changed nothing. Please report this");
          }
        }
      }
    });
    screened_ = true;
    return reference;
  }

  // Every candidate runs `pass` trials_ times from the step's start; the first result of each is compared
  // with the first candidate's. `fresh`: the timings start here (an unchecked step: pass = the whole step),
  // else they add to the screen's of this step (pass = the apply). Returns the stages of the fastest's last trial.
  template <class Pass>
  stage_seconds time(Towers& towers, bool fresh, Pass&& pass) {
    if (fresh) {
      take_snapshot(towers);
    } else if (!screened_) {
      fail("reduce::automatic: apply while timing needs the screen of the same step first");
    }
    std::vector<stage_seconds> last(candidates_.size());
    guarded(towers, [&] {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for (std::size_t i = 0; i < candidates_.size(); ++i) {
          start_from_snapshot(candidates_[i], towers);
          stage_seconds s;
          pass(candidates_[i], s);
          const double took = s.reduce + s.broadcast;
          if (fresh) seconds_[i].push_back(took);
          else seconds_[i][trial] += took;
          last[i] = s;
          if (trial != 0) continue;
          step_values mine = read_back(candidates_[i], towers);
          if (i == 0) reference_ = std::move(mine);
          else compare(i, mine);
        }
      }
    });
    return last[fastest()];
  }

  // The candidate with the least median time, and each one's median, for the log.
  std::size_t fastest() const {
    std::size_t best = 0;
    for (std::size_t i = 1; i < candidates_.size(); ++i)
      if (median_of(seconds_[i]) < median_of(seconds_[best])) best = i;
    return best;
  }
  std::string timings() const {
    std::string text;
    for (std::size_t i = 0; i < candidates_.size(); ++i) text += make_message(i ? ", " : "", names_[i], " ", median_of(seconds_[i]) * 1e3, " ms");
    return text;
  }
  std::size_t trials() const { return trials_; }

  // The whole step through one candidate, as the pipeline drives it: begin, every variable as one part, finish.
  screen_partials whole_step(Candidate& r, Towers& towers, const work_type& work, stage_seconds& stages) {
    r.begin_step(towers, work);
    r.reduce_part(towers, step_part{every_variable_, no_bucket});
    return r.finish(towers, stages);
  }

 private:
  // What a step leaves behind, read back to compare candidates and to start every trial alike.
  struct step_values {
    std::vector<std::vector<typename precision<Layout>::stored_type>> parameters;  // [variable], as the towers hold them
    std::vector<std::vector<T>> master;                // [variable]; mixed precision only
    std::vector<std::vector<T>> state;                 // [slot * variables + variable]
  };
  step_values read_back(Candidate& r, Towers& towers) const {
    step_values values;
    for (std::size_t v = 0; v < variables_.count(); ++v) {
      const auto p = towers.parameter_on_host(v);
      values.parameters.emplace_back(p.begin(), p.end());
      if constexpr (precision<Layout>::mixed) {
        const auto m = r.master(v);
        values.master.emplace_back(m.begin(), m.end());
      }
    }
    for (std::size_t slot = 0; slot < r.state_slots(); ++slot)
      for (std::size_t v = 0; v < variables_.count(); ++v) {
        const auto s = r.state(slot, v);
        values.state.emplace_back(s.begin(), s.end());
      }
    return values;
  }
  void start_from_snapshot(Candidate& r, Towers& towers) {
    const std::size_t n = variables_.count();
    for (std::size_t v = 0; v < n; ++v) {
      towers.set_parameter(v, snapshot_.parameters[v].data());
      if constexpr (precision<Layout>::mixed) r.set_master(v, snapshot_.master[v].data());
      else r.set_master(v, snapshot_.parameters[v].data());
    }
    for (std::size_t k = 0; k < snapshot_.state.size(); ++k) r.set_state(k / n, k % n, snapshot_.state[k].data());
    gradients_->restore(towers);
  }
  // What the step began with, and the timings started afresh.
  void take_snapshot(Towers& towers) {
    snapshot_ = read_back(candidates_[0], towers);
    seconds_.assign(candidates_.size(), {});
    every_variable_ = every_variable(variables_.count());
    if (!gradients_) gradients_ = std::make_unique<typename automatic_space<Towers>::gradient_copy>(variables_, towers);
    gradients_->save(towers);
  }
  // f(); after a failed trial, every candidate and the towers as the step began, and the failure rethrown.
  template <class F>
  void guarded(Towers& towers, F&& f) {
    try {
      f();
    } catch (...) {
      for (Candidate& c : candidates_) start_from_snapshot(c, towers);
      throw;
    }
  }

  static bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
  // Fails naming the first element where `mine` differs from the first candidate's in bits.
  void compare(std::size_t candidate, const step_values& mine) const {
    const auto check = [&](const auto& reference, const auto& values, const char* what) {
      for (std::size_t k = 0; k < values.size(); ++k)  // k: [variable], or [slot * variables + variable]
        for (std::size_t e = 0; e < values[k].size(); ++e)
          if (std::memcmp(&reference[k][e], &values[k][e], sizeof values[k][e]) != 0)
            fail("reduce::automatic: reduce::", names_[0], " and reduce::", names_[candidate], " gave different ", what,
                 " for variable '", variables_[k % variables_.count()].name, "' (first at element ", e,
                 ") while timing the backends; the step changed nothing. Every backend should give the same bits: ",
                 "please report this");
    };
    check(reference_.parameters, mine.parameters, "parameters");
    check(reference_.master, mine.master, "master parameters");
    check(reference_.state, mine.state, "optimizer state");
  }
  static double median_of(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }

  std::vector<Candidate> candidates_;
  std::vector<std::string> names_;
  std::size_t trials_;
  const variable_set& variables_;
  std::vector<std::size_t> every_variable_;
  bool screened_ = false;  // a checked step's screen was timed
  step_values snapshot_;   // what the step began with
  step_values reference_;  // the first candidate's results
  std::unique_ptr<typename automatic_space<Towers>::gradient_copy> gradients_;
  std::vector<std::vector<double>> seconds_;  // [candidate][trial]
};

}  // namespace detail
}  // namespace towerpipe
