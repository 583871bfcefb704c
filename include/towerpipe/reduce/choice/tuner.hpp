#pragma once
// backend_tuner — pipeline_options::time_backends for reduce::automatic (reduce/choice/automatic.hpp): every
// candidate built, timed on the first step that applies the optimizer, the fastest kept.
//
// Each trial starts from what the step began with; every candidate's first result must equal the first candidate's bit
// for bit (else a towerpipe::error naming both); the fastest by median is kept and the step counts once.
// Why: docs/design-notes.md#reduce-choice-tuner

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <variant>
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

// Candidate: a std::variant of std::unique_ptr to each candidate's reducer (all alive while timing).
template <class Towers, class Optim, class Layout, class Candidate>
class backend_tuner {
 public:
  using stored_type = typename precision<Layout>::stored_type;
  using T = typename precision<Layout>::master_type;
  using work_type = step_work<T, Optim>;

  backend_tuner(std::vector<Candidate> candidates, std::vector<std::string> names, std::size_t trials, const variable_set& variables)
      : candidates_(std::move(candidates)), names_(std::move(names)), trials_(trials), variables_(variables) {}

  std::vector<Candidate>& candidates() { return candidates_; }

  // A checked step's first pass: every candidate screens the step's gradients (restored before each trial:
  // the device trees add into them); the screens must agree.
  screen_partials screen(Towers& towers, const work_type& work) {
    take_snapshot(towers);
    seconds_.assign(candidates_.size(), {});
    screen_partials reference;
    guarded(towers, [&] {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for (std::size_t i = 0; i < candidates_.size(); ++i) {
          gradients_->restore(towers);
          stage_seconds s;
          const screen_partials mine = whole_step(i, towers, work, s);
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
      seconds_.assign(candidates_.size(), {});
    } else if (!screened_) {
      fail("reduce::automatic: apply while timing needs the screen of the same step first");
    }
    std::vector<stage_seconds> last(candidates_.size());
    guarded(towers, [&] {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for (std::size_t i = 0; i < candidates_.size(); ++i) {
          std::visit([&](auto& r) { start_from_snapshot(*r, towers); }, candidates_[i]);
          stage_seconds s;
          std::visit([&](auto& r) { pass(*r, s); }, candidates_[i]);
          const double took = s.reduce + s.broadcast;
          if (fresh) seconds_[i].push_back(took);
          else seconds_[i][trial] += took;
          last[i] = s;
          if (trial != 0) continue;
          step_values mine = std::visit([&](auto& r) { return read_back(*r, towers); }, candidates_[i]);
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
  screen_partials whole_step(std::size_t i, Towers& towers, const work_type& work, stage_seconds& stages) {
    return std::visit(
        [&](auto& r) {
          r->begin_step(towers, work);
          r->reduce_part(towers, step_part{every_variable_, no_bucket});
          return r->finish(towers, stages);
        },
        candidates_[i]);
  }

 private:
  // What a step leaves behind, read back to compare candidates and to start every trial alike.
  struct step_values {
    std::vector<std::vector<stored_type>> parameters;  // [variable], as the towers hold them
    std::vector<std::vector<T>> master;                // [variable]; mixed precision only
    std::vector<std::vector<T>> state;                 // [slot * variables + variable]
  };
  template <class R>
  step_values read_back(R& r, Towers& towers) const {
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
  template <class R>
  void start_from_snapshot(R& r, Towers& towers) {
    const std::size_t n = variables_.count();
    for (std::size_t v = 0; v < n; ++v) {
      towers.set_parameter(v, snapshot_.parameters[v].data());
      if constexpr (precision<Layout>::mixed) r.set_master(v, snapshot_.master[v].data());
      else r.set_master(v, snapshot_.parameters[v].data());
    }
    for (std::size_t k = 0; k < snapshot_.state.size(); ++k) r.set_state(k / n, k % n, snapshot_.state[k].data());
    gradients_->restore(towers);
  }
  void take_snapshot(Towers& towers) {
    snapshot_ = std::visit([&](auto& r) { return read_back(*r, towers); }, candidates_[0]);
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
      for (Candidate& c : candidates_) std::visit([&](auto& r) { start_from_snapshot(*r, towers); }, c);
      throw;
    }
  }

  static bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
  template <class U>
  static std::size_t first_difference(const std::vector<U>& a, const std::vector<U>& b) {
    for (std::size_t k = 0; k < a.size(); ++k)
      if (std::memcmp(&a[k], &b[k], sizeof(U)) != 0) return k;
    return a.size();
  }
  [[noreturn]] void fail_mismatch(std::size_t other, const char* what, std::size_t variable, std::size_t element) const {
    fail("reduce::automatic: reduce::", names_[0], " and reduce::", names_[other], " gave different ", what, " for variable '",
         variables_[variable].name, "' (first at element ", element, ") while timing the backends; the step changed nothing. ",
         "Every backend should give the same bits: please report this");
  }
  void compare(std::size_t candidate, const step_values& mine) const {
    const std::size_t n = variables_.count();
    for (std::size_t v = 0; v < n; ++v) {
      const std::size_t k = first_difference(reference_.parameters[v], mine.parameters[v]);
      if (k < mine.parameters[v].size()) fail_mismatch(candidate, "parameters", v, k);
    }
    for (std::size_t v = 0; v < mine.master.size(); ++v) {
      const std::size_t k = first_difference(reference_.master[v], mine.master[v]);
      if (k < mine.master[v].size()) fail_mismatch(candidate, "master parameters", v, k);
    }
    for (std::size_t s = 0; s < mine.state.size(); ++s) {
      const std::size_t k = first_difference(reference_.state[s], mine.state[s]);
      if (k < mine.state[s].size()) fail_mismatch(candidate, "optimizer state", s % n, k);
    }
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
