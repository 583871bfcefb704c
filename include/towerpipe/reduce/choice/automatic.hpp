#pragma once
// reduce::automatic — the library picks the backend. The candidates are the backends of the list
// (reduce/choice/backends.hpp) that take the execution space's towers; at construction choose_backend
// (reduce/choice/chooser.hpp) picks one from the towers' topology, and only that one is built.
// pipeline::backend_name() says which, and the log sink (core/log.hpp) which and why.
// Why: docs/design-notes.md#reduce-choice-automatic

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <type_traits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/reduce/choice/backends.hpp"
#include "towerpipe/reduce/choice/chooser.hpp"
#include "towerpipe/reduce/choice/device_space.hpp"
#include "towerpipe/reduce/choice/host_space.hpp"
#include "towerpipe/reduce/choice/tuner.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/one_of.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"

namespace towerpipe {

namespace reduce {

// The backend chosen from the towers' topology (see the top of this header).
struct automatic {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "automatic";
};

}  // namespace reduce

namespace detail {

// Candidates: the backends' policy types (reduce::host, ...), each with `traits` and a reducer_for Exec.
template <class Exec, class Optim, class Layout, class... Candidates>
class automatic_reducer {
 public:
  using towers_type = typename Exec::template towers<Layout>;
  using T = typename precision<Layout>::master_type;
  using candidate = one_of<typename reducer_for<Exec, Candidates, Optim, Layout>::type...>;
  static constexpr reducer_capabilities capabilities{
      (reducer_for<Exec, Candidates, Optim, Layout>::type::capabilities.spans_processes || ...), false, true};

  explicit automatic_reducer(const reducer_setup<towers_type, Optim>& setup) : variables_(setup.variables) {
    tower_topology t = automatic_space<towers_type>::describe(setup.towers);
    t.parameters = setup.variables.total_size();
    t.element_bytes = sizeof(typename precision<Layout>::stored_type);
    t.processes = setup.span.size();
    t.candidates = {Candidates::traits...};
    choice_ = choose_backend(t);
    const std::size_t trials = setup.options.time_backends;
    const bool timing = trials > 0 && sizeof...(Candidates) > 1 && setup.span.size() == 1;
    if (timing) {
      std::vector<candidate> all;
      for (std::size_t i = 0; i < sizeof...(Candidates); ++i) all.push_back(make_candidate(i, setup));
      tuner_ = std::make_unique<tuner_type>(std::move(all), std::vector<std::string>{Candidates::name...}, trials, setup.variables);
    } else {
      chosen_ = make_candidate(index_of(choice_.backend), setup);
    }
    // time_backends has nothing to time across processes (only sharded spans them) or with one candidate: say so.
    const std::string timing_note =
        timing        ? make_message("; timing all ", sizeof...(Candidates), " candidates on the first step (time_backends = ", trials, ")")
        : trials == 0 ? std::string()
                      : make_message("; time_backends = ", trials, " times nothing: ",
                                     setup.span.size() > 1 ? "across processes only reduce::sharded spans them" : "one candidate");
    log_note(make_message("reduce::automatic chose reduce::", choice_.backend, ": ", choice_.reason, timing_note));
  }

  backend_choice choice() const { return choice_; }
  // While timing every bucket waits for the towers: the trials take the whole step.
  bool buckets_during_towers() const {
    return !tuner_ && chosen_.buckets_during_towers();
  }
  void begin_step(towers_type& towers, const step_work<T, Optim>& work) {
    if (!tuner_) return chosen_.begin_step(towers, work);
    work_ = work;
  }
  void reduce_part(towers_type& towers, const step_part& part) {
    if (!tuner_) return chosen_.reduce_part(towers, part);
    if (part.during_towers() || part.variables.size() != variables_.count())
      fail("reduce::automatic: timing the backends takes whole steps; a part of ", part.variables.size(), " of ",
           variables_.count(), " variables was handed over");
  }
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    if (!tuner_) return chosen_.finish(towers, stages);
    if (work_.checked) return tuner_->screen(towers, work_);
    keep_fastest(tuner_->time(towers, true, [&](candidate& r, stage_seconds& s) { tuner_->whole_step(r, towers, work_, s); }),
                 stages);
    return {};
  }
  void apply(towers_type& towers, T scale, stage_seconds& stages) {
    if (!tuner_) return chosen_.apply(towers, scale, stages);
    keep_fastest(tuner_->time(towers, false, [&](candidate& r, stage_seconds& s) { r.apply(towers, scale, s); }), stages);
  }
  void abandon(towers_type& towers) {
    for_each_live([&](auto& r) { r.abandon(towers); });
  }

  std::size_t state_slots() const { return chosen().state_slots(); }
  tensor_view<const T> state(std::size_t slot, std::size_t index) { return chosen().state(slot, index); }
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    for_each_live([&](auto& r) { r.set_state(slot, index, values); });
  }
  tensor_view<const T> master(std::size_t index) { return chosen().master(index); }
  void set_master(std::size_t index, const T* values) {
    for_each_live([&](auto& r) { r.set_master(index, values); });
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return chosen().state_bytes_per_tower(); }

 private:
  using tuner_type = backend_tuner<towers_type, Optim, Layout, candidate>;

  static std::size_t index_of(const std::string& name) {
    const char* names[] = {Candidates::name...};
    for (std::size_t i = 0; i < sizeof...(Candidates); ++i)
      if (name == names[i]) return i;
    fail("reduce::automatic: chose reduce::", name, ", which is not among its candidates");
  }
  template <std::size_t I = 0>
  static candidate make_candidate(std::size_t index, const reducer_setup<towers_type, Optim>& setup) {
    if constexpr (I + 1 < sizeof...(Candidates)) {
      if (index != I) return make_candidate<I + 1>(index, setup);
    }
    return candidate::template make<I>(setup);
  }

  // The chosen candidate; while timing, the one the rule chose (every candidate holds the same state).
  const candidate& chosen() const { return tuner_ ? tuner_->candidates()[index_of(choice_.backend)] : chosen_; }
  candidate& chosen() { return const_cast<candidate&>(std::as_const(*this).chosen()); }
  template <class F>
  void for_each_live(F&& f) {
    if (!tuner_) return chosen_.visit(f);
    for (candidate& c : tuner_->candidates()) c.visit(f);
  }

  // Every trial began where the step began and all gave the same bits, so each candidate holds this
  // step's result: the fastest stays, the others go.
  void keep_fastest(const stage_seconds& fastest_stages, stage_seconds& stages) {
    const std::size_t best = tuner_->fastest();
    choice_ = {tuner_->candidates()[best].choice().backend,
               make_message("timed on this machine's first step (median of ", tuner_->trials(), "; bitwise equal): ", tuner_->timings(),
                            "; the rule alone chose reduce::", choice_.backend, " (", choice_.reason, ")")};
    chosen_ = std::move(tuner_->candidates()[best]);
    tuner_.reset();
    stages.reduce += fastest_stages.reduce;
    stages.broadcast += fastest_stages.broadcast;
    log_note(make_message("reduce::automatic kept reduce::", choice_.backend, ": ", choice_.reason));
  }

  const variable_set& variables_;
  backend_choice choice_;
  candidate chosen_;                   // empty while timing
  std::unique_ptr<tuner_type> tuner_;  // while timing: every candidate
  step_work<T, Optim> work_;           // while timing: the step's
};

// The backends of the list that take Exec's towers, as automatic_reducer's candidates.
template <class Exec, class Optim, class Layout, class List, class... Taken>
struct automatic_for;
template <class Exec, class Optim, class Layout, class... Taken>
struct automatic_for<Exec, Optim, Layout, backend_list<>, Taken...> {
  using type = automatic_reducer<Exec, Optim, Layout, Taken...>;
};
template <class Exec, class Optim, class Layout, class First, class... Rest, class... Taken>
struct automatic_for<Exec, Optim, Layout, backend_list<First, Rest...>, Taken...> {
  static constexpr bool takes = Exec::device_towers ? First::traits.device_towers : First::traits.host_towers;
  using type = typename std::conditional_t<takes, automatic_for<Exec, Optim, Layout, backend_list<Rest...>, Taken..., First>,
                                           automatic_for<Exec, Optim, Layout, backend_list<Rest...>, Taken...>>::type;
};

}  // namespace detail

template <class Exec, class Optim, class Layout>
struct reducer_for<Exec, reduce::automatic, Optim, Layout> {
  using type = typename detail::automatic_for<Exec, Optim, Layout, backends>::type;
};

}  // namespace towerpipe
