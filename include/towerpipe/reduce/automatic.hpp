#pragma once
// reduce::automatic — the library picks the backend. The candidates are the backends the execution
// space and the layout allow (host towers: reduce::host, reduce::sharded; GPU towers:
// reduce/automatic_for_cuda.cuh); at construction choose_backend (reduce/backend_choice.hpp) picks one
// from the towers' topology, and only that one is built. pipeline::backend_name() says which, and the
// log sink (core/log.hpp) which and why.
//
// Every backend gives the same bits, so no choice can change a result. pipeline_options::time_backends
// builds every candidate instead and times them on the first step that applies the optimizer: each trial
// starts from the parameters, optimizer state and gradients the step began with (the device backends
// add partial sums into the towers' gradient buffers), runs one candidate's pass and is timed by the
// candidate's own stage_seconds; every candidate's first result is compared bit for bit with the
// first candidate's (parameters, master, optimizer state; a checked step's sum of squares and first
// non-finite element too), a difference
// throwing a towerpipe::error that names both backends and the variable after restoring what the step
// began with. The fastest by median is kept, the others are freed; the step counts once.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/reduce/backend_choice.hpp"
#include "towerpipe/reduce/host.hpp"
#include "towerpipe/reduce/reducer_contract.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/reduce/sharded/host_towers.hpp"

namespace towerpipe {

namespace reduce {

// The backend chosen from the towers' topology (see the top of this header).
struct automatic {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "automatic";
};

}  // namespace reduce

namespace detail {

template <backend_kind Kind, class Reducer>
struct automatic_candidate {
  static constexpr backend_kind kind = Kind;
  using type = Reducer;
};

// What reduce::automatic needs of an execution space's towers, one specialisation per towers type:
//   static tower_topology describe(Towers&)      the towers' devices and the links between them
//   class gradient_copy                    gradient_copy(const variable_set&, Towers&); save(Towers&); restore(Towers&)
template <class Towers>
struct automatic_space;

template <class Layout>
struct automatic_space<host_towers<Layout>> {
  static tower_topology describe(host_towers<Layout>& towers) {
    tower_topology t;
    t.tower_devices.assign(towers.towers(), host_device);
    return t;
  }
  class gradient_copy {
   public:
    gradient_copy(const variable_set& variables, host_towers<Layout>& towers)
        : variables_(variables), saved_(towers.towers(), std::vector<std::vector<typename Layout::value_type>>(variables.count())) {}
    void save(host_towers<Layout>& towers) {
      for (std::size_t t = 0; t < saved_.size(); ++t)
        for (std::size_t v = 0; v < variables_.count(); ++v) {
          const auto* data = towers.gradients(t).data(v);
          saved_[t][v].assign(data, data + variables_[v].size);
        }
    }
    void restore(host_towers<Layout>& towers) {
      for (std::size_t t = 0; t < saved_.size(); ++t)
        for (std::size_t v = 0; v < variables_.count(); ++v) std::copy(saved_[t][v].begin(), saved_[t][v].end(), towers.gradients(t).data(v));
    }

   private:
    const variable_set& variables_;
    std::vector<std::vector<std::vector<typename Layout::value_type>>> saved_;  // [tower][variable]
  };
};

template <class Towers, class Optim, class Layout, class... Candidates>
class automatic_reducer {
 public:
  using stored_type = typename Layout::value_type;
  using master_type = master_type_t<stored_type>;
  static constexpr bool mixed = !std::is_same<stored_type, master_type>::value;
  using hyper_parameters = typename Optim::hyper_parameters;
  using constants_type = typename Optim::template step_constants<master_type>;
  static constexpr std::size_t count = sizeof...(Candidates);

  automatic_reducer(const variable_set& variables, const hyper_parameters& h, Towers& towers, const pipeline_options& options,
                    const processes& span)
      : variables_(variables), every_variable_(every_variable(variables.count())), trials_(options.time_backends) {
    tower_topology t = automatic_space<Towers>::describe(towers);
    t.parameters = variables.total_size();
    t.element_bytes = sizeof(stored_type);
    t.processes = span.size();
    t.candidates = {Candidates::kind...};
    choice_ = choose_backend(t);
    chosen_ = index_of(choice_.backend);
    timing_ = trials_ > 0 && count > 1 && span.size() == 1;
    for_each_candidate([&](auto i) {
      if (timing_ || i == chosen_)
        std::get<i>(live_) = make_reducer<typename candidate_t<i>::type, Towers, Optim>(variables, h, towers, options, span);
    });
    // time_backends has nothing to time across processes (only sharded spans them) or with one candidate: say so.
    const std::string timing_note =
        timing_        ? make_message("; timing all ", count, " candidates on the first step (time_backends = ", trials_, ")")
        : trials_ == 0 ? std::string()
                       : make_message("; time_backends = ", trials_, " times nothing: ",
                                      span.size() > 1 ? "across processes only reduce::sharded spans them" : "one candidate");
    log_note(make_message("reduce::automatic chose reduce::", backend_name(), ": ", choice_.reason, timing_note));
  }

  const char* backend_name() const { return towerpipe::backend_name(choice_.backend); }
  const backend_choice& choice() const { return choice_; }

  std::size_t state_slots() const {
    return with_chosen([](auto& r, auto) { return static_cast<std::size_t>(r.state_slots()); });
  }
  tensor_view<const master_type> state_on_host(std::size_t slot, std::size_t index) {
    return with_chosen([&](auto& r, auto) { return tensor_view<const master_type>(r.state_on_host(slot, index)); });
  }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    for_each_live([&](auto& r, auto) { r.set_state(slot, index, values); });
  }
  tensor_view<const master_type> master_on_host(std::size_t index) const {
    return with_chosen([&](auto& r, auto) -> tensor_view<const master_type> {
      if constexpr (reducer_has_master_on_host<std::decay_t<decltype(r)>>::value) return r.master_on_host(index);
      else fail("reduce::", backend_name(), " keeps no master copy");
    });
  }
  void parameter_set(std::size_t index, const master_type* values) {
    for_each_live([&](auto& r, auto) {
      if constexpr (reducer_has_parameter_set<std::decay_t<decltype(r)>>::value) r.parameter_set(index, values);
    });
  }

  void average_and_apply(Towers& towers, const std::vector<master_type>& weights, const constants_type& constants,
                         stage_seconds& stages) {
    if (!timing_) return with_chosen([&](auto& r, auto) { r.average_and_apply(towers, weights, constants, stages); });
    timed(towers, stages, true, [&](auto& r, stage_seconds& s) { r.average_and_apply(towers, weights, constants, s); });
  }
  screen_partials screen_average(Towers& towers, const std::vector<master_type>& weights, const accumulation<master_type>& step,
                                 stage_seconds& stages) {
    if (!timing_) return with_chosen([&](auto& r, auto) { return r.screen_average(towers, weights, step, stages); });
    return timed_screen(towers, weights, step);
  }
  void apply_averaged(Towers& towers, master_type scale, const constants_type& constants, stage_seconds& stages) {
    if (!timing_) return with_chosen([&](auto& r, auto) { r.apply_averaged(towers, scale, constants, stages); });
    timed(towers, stages, false, [&](auto& r, stage_seconds& s) { r.apply_averaged(towers, scale, constants, s); });
  }

  // Parts of a step (reduce/overlapped_reduction.hpp) go to the chosen backend where it takes them;
  // else, and while timing, every bucket waits for the towers and comes here as one whole part.
  bool overlaps_buckets() const {
    return !timing_ && with_chosen([](auto& r, auto) {
      if constexpr (takes_parts<std::decay_t<decltype(r)>>) return r.overlaps_buckets();
      else return false;
    });
  }
  screen_partials begin_screen() {
    return with_chosen([](auto& r, auto) {
      if constexpr (takes_parts<std::decay_t<decltype(r)>>) return r.begin_screen();
      else return screen_partials{};
    });
  }
  void screen_part(Towers& towers, const step_part& part, const std::vector<master_type>& weights, const accumulation<master_type>& step,
                   screen_partials& partials, stage_seconds& stages) {
    with_chosen([&](auto& r, auto) {
      if constexpr (takes_parts<std::decay_t<decltype(r)>>) {
        if (!timing_) return r.screen_part(towers, part, weights, step, partials, stages);
      }
      check_whole(part);
      partials = screen_average(towers, weights, step, stages);
    });
  }
  void average_and_apply_part(Towers& towers, const step_part& part, const std::vector<master_type>& weights,
                              const constants_type& constants, stage_seconds& stages) {
    with_chosen([&](auto& r, auto) {
      if constexpr (takes_parts<std::decay_t<decltype(r)>>) {
        if (!timing_) return r.average_and_apply_part(towers, part, weights, constants, stages);
      }
      check_whole(part);
      average_and_apply(towers, weights, constants, stages);
    });
  }
  void join_parts(Towers& towers) {
    with_chosen([&](auto& r, auto) {
      if constexpr (reducer_has_join_parts<std::decay_t<decltype(r)>, Towers>::value) r.join_parts(towers);
    });
  }
  // Across processes (reduce::sharded), what every process must do before they agree on the towers.
  void settle_part(Towers& towers, const step_part& rest, const std::vector<master_type>& weights) {
    with_chosen([&](auto& r, auto) {
      if constexpr (reducer_settles_parts<std::decay_t<decltype(r)>, Towers, master_type>::value) r.settle_part(towers, rest, weights);
    });
  }

 private:
  template <std::size_t I>
  using candidate_t = std::tuple_element_t<I, std::tuple<Candidates...>>;
  template <class R>
  static constexpr bool takes_parts = reducer_reduces_parts<R, Towers, Optim, master_type>::value;

  template <class F, std::size_t... I>
  static void each_index(F& f, std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}), ...);
  }
  template <class F>
  static void for_each_candidate(F&& f) {
    each_index(f, std::index_sequence_for<Candidates...>{});
  }
  template <class F>
  void for_each_live(F&& f) {
    for_each_candidate([&](auto i) {
      if (std::get<i>(live_)) f(*std::get<i>(live_), i);
    });
  }
  template <std::size_t I = 0, class F>
  decltype(auto) with_chosen(F&& f) const {
    if constexpr (I + 1 < count) {
      if (chosen_ != I) return with_chosen<I + 1>(f);
    }
    return f(*std::get<I>(live_), std::integral_constant<std::size_t, I>{});
  }
  static std::size_t index_of(backend_kind kind) {
    std::size_t index = 0, at = 0;
    ((Candidates::kind == kind ? (index = at, ++at) : ++at), ...);
    return index;
  }

  void check_whole(const step_part& part) const {
    if (part.during_towers() || part.variables.size() != variables_.count())
      fail("reduce::automatic: reduce::", backend_name(), " was handed a part of a step (", part.variables.size(), " of ",
           variables_.count(), " variables) but reduces whole steps only");
  }

  // What a step leaves behind, read back to compare candidates and to start every trial alike.
  struct step_values {
    std::vector<std::vector<stored_type>> parameters;  // [variable], as the towers hold them
    std::vector<std::vector<master_type>> master;      // [variable]; mixed precision only
    std::vector<std::vector<master_type>> state;       // [slot * variables + variable]
  };
  template <class R>
  step_values read_back(R& r, Towers& towers) {
    step_values values;
    for (std::size_t v = 0; v < variables_.count(); ++v) {
      const auto p = towers.parameter_on_host(v);
      values.parameters.emplace_back(p.begin(), p.end());
      if constexpr (mixed) {
        const auto m = r.master_on_host(v);
        values.master.emplace_back(m.begin(), m.end());
      }
    }
    for (std::size_t slot = 0; slot < r.state_slots(); ++slot)
      for (std::size_t v = 0; v < variables_.count(); ++v) {
        const auto s = r.state_on_host(slot, v);
        values.state.emplace_back(s.begin(), s.end());
      }
    return values;
  }
  template <class R>
  void start_from_snapshot(R& r, Towers& towers) {
    const std::size_t n = variables_.count();
    for (std::size_t v = 0; v < n; ++v) {
      towers.set_parameter(v, snapshot_.parameters[v].data());
      if constexpr (reducer_has_parameter_set<R>::value) {
        if constexpr (mixed) r.parameter_set(v, snapshot_.master[v].data());
        else r.parameter_set(v, snapshot_.parameters[v].data());
      }
    }
    for (std::size_t k = 0; k < snapshot_.state.size(); ++k) r.set_state(k / n, k % n, snapshot_.state[k].data());
    gradients_->restore(towers);
  }
  void take_snapshot(Towers& towers) {
    with_chosen([&](auto& r, auto) { snapshot_ = read_back(r, towers); });
    if (!gradients_) gradients_ = std::make_unique<typename automatic_space<Towers>::gradient_copy>(variables_, towers);
    gradients_->save(towers);
  }
  // After a failed trial: every candidate and the towers as the step began.
  void restore_everyone(Towers& towers) {
    for_each_live([&](auto& r, auto) { start_from_snapshot(r, towers); });
  }

  static bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
  template <class U>
  std::size_t first_difference(const std::vector<U>& a, const std::vector<U>& b) const {
    for (std::size_t k = 0; k < a.size(); ++k)
      if (std::memcmp(&a[k], &b[k], sizeof(U)) != 0) return k;
    return a.size();
  }
  [[noreturn]] void fail_mismatch(std::size_t other, const char* what, std::size_t variable, std::size_t element) const {
    fail("reduce::automatic: reduce::", towerpipe::backend_name(kind_of(reference_)), " and reduce::",
         towerpipe::backend_name(kind_of(other)), " gave different ", what, " for variable '", variables_[variable].name,
         "' (first at element ", element, ") while timing the backends; the step changed nothing. Every backend should give ",
         "the same bits: please report this");
  }
  void compare(std::size_t candidate, const step_values& mine) const {
    const std::size_t n = variables_.count();
    for (std::size_t v = 0; v < n; ++v) {
      const std::size_t k = first_difference(reference_values_.parameters[v], mine.parameters[v]);
      if (k < mine.parameters[v].size()) fail_mismatch(candidate, "parameters", v, k);
    }
    for (std::size_t v = 0; v < mine.master.size(); ++v) {
      const std::size_t k = first_difference(reference_values_.master[v], mine.master[v]);
      if (k < mine.master[v].size()) fail_mismatch(candidate, "master parameters", v, k);
    }
    for (std::size_t s = 0; s < mine.state.size(); ++s) {
      const std::size_t k = first_difference(reference_values_.state[s], mine.state[s]);
      if (k < mine.state[s].size()) fail_mismatch(candidate, "optimizer state", s % n, k);
    }
  }
  static backend_kind kind_of(std::size_t index) {
    const backend_kind kinds[] = {Candidates::kind...};
    return kinds[index];
  }

  // The checked step's first pass while timing: every candidate screens the step's gradients (restored
  // before each trial: the device trees add into them); the screens must agree.
  screen_partials timed_screen(Towers& towers, const std::vector<master_type>& weights, const accumulation<master_type>& step) {
    take_snapshot(towers);
    seconds_.assign(count, {});
    screened_ = true;
    screen_partials reference;
    bool have_reference = false;
    try {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for_each_live([&](auto& r, auto i) {
          gradients_->restore(towers);
          stage_seconds s;
          const screen_partials mine = r.screen_average(towers, weights, step, s);
          seconds_[i].push_back(s.reduce + s.broadcast);
          if (!have_reference) {
            reference = mine;
            reference_ = i;
            have_reference = true;
          } else if (trial == 0 && (mine.first_nonfinite != reference.first_nonfinite ||
                                    !same_bits(mine.sum_of_squares(), reference.sum_of_squares()))) {
            fail("reduce::automatic: reduce::", towerpipe::backend_name(kind_of(reference_)), " and reduce::",
                 towerpipe::backend_name(kind_of(i)), " screened the same gradients differently (sums of squares or the first ",
                 "non-finite element) while timing the backends; the step changed nothing. Please report this");
          }
        });
      }
    } catch (...) {
      restore_everyone(towers);
      throw;
    }
    return reference;
  }

  // Every candidate runs `pass` `trials_` times from the step's start; the first result of each is
  // compared with the first candidate's; the fastest is kept. `fresh`: the timings start here (an
  // unchecked step), else they add to the screen's of this step.
  template <class Pass>
  void timed(Towers& towers, stage_seconds& stages, bool fresh, Pass&& pass) {
    if (fresh) {
      take_snapshot(towers);
      seconds_.assign(count, {});
    } else if (!screened_) {
      fail("reduce::automatic: apply_averaged while timing needs the screen_average of the same step first");
    }
    std::vector<stage_seconds> last(count);
    bool have_reference = false;
    try {
      for (std::size_t trial = 0; trial < trials_; ++trial) {
        for_each_live([&](auto& r, auto i) {
          start_from_snapshot(r, towers);
          stage_seconds s;
          pass(r, s);
          const double took = s.reduce + s.broadcast;
          if (fresh) seconds_[i].push_back(took);
          else seconds_[i][trial] += took;
          last[i] = s;
          if (trial != 0) return;
          step_values mine = read_back(r, towers);
          if (!have_reference) {
            reference_values_ = std::move(mine);
            reference_ = i;
            have_reference = true;
          } else {
            compare(i, mine);
          }
        });
      }
    } catch (...) {
      restore_everyone(towers);
      throw;
    }
    keep_fastest(last[pick_fastest()], stages);
  }

  std::size_t pick_fastest() const {
    std::size_t best = 0;
    for (std::size_t i = 1; i < count; ++i)
      if (median_of(seconds_[i]) < median_of(seconds_[best])) best = i;
    return best;
  }
  static double median_of(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }
  // Every trial began where the step began and all gave the same bits, so each candidate holds this
  // step's result: the fastest stays, the others go.
  void keep_fastest(const stage_seconds& fastest_stages, stage_seconds& stages) {
    const std::size_t best = pick_fastest();
    std::string timings;
    for (std::size_t i = 0; i < count; ++i)
      timings += make_message(i ? ", " : "", towerpipe::backend_name(kind_of(i)), " ", median_of(seconds_[i]) * 1e3, " ms");
    const backend_kind rule = choice_.backend;
    choice_ = {kind_of(best), make_message("timed on this machine's first step (median of ", trials_, "; bitwise equal): ", timings,
                                           "; the rule alone chose reduce::", towerpipe::backend_name(rule), " (", choice_.reason, ")")};
    chosen_ = best;
    for_each_candidate([&](auto i) {
      if (i != best) std::get<i>(live_).reset();
    });
    timing_ = false;
    snapshot_ = {};
    reference_values_ = {};
    gradients_.reset();
    stages.reduce += fastest_stages.reduce;
    stages.broadcast += fastest_stages.broadcast;
    log_note(make_message("reduce::automatic kept reduce::", backend_name(), ": ", choice_.reason));
  }

  const variable_set& variables_;
  std::vector<std::size_t> every_variable_;
  std::size_t trials_;
  backend_choice choice_;
  std::size_t chosen_ = 0;
  bool timing_ = false;
  bool screened_ = false;  // timing a checked step: its screen ran
  std::tuple<std::unique_ptr<typename Candidates::type>...> live_;
  step_values snapshot_;                  // timing: what the step began with
  std::unique_ptr<typename automatic_space<Towers>::gradient_copy> gradients_;
  std::vector<std::vector<double>> seconds_;  // timing: [candidate][trial]
  step_values reference_values_;
  std::size_t reference_ = 0;  // the candidate the others are compared with
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::automatic, Optim, Layout> {
  using type = detail::automatic_reducer<detail::host_towers<Layout>, Optim, Layout,
                                         detail::automatic_candidate<backend_kind::host, detail::host_reducer<Optim, Layout>>,
                                         detail::automatic_candidate<backend_kind::sharded, detail::sharded_host_reducer<Optim, Layout>>>;
};

}  // namespace towerpipe
