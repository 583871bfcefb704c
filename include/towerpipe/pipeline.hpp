#pragma once
// pipeline<Exec, Reduce, Optim, Layout> — one synchronous data-parallel training step,
// instantiated from its policies: towers' execution space, reduction backend, optimizer, layout.
// Why: docs/design-notes.md#pipeline
// Guarantees: a step either completes or changes nothing (bad batch, a tower that throws or leaves a
// gradient unwritten: a towerpipe::error, parameters, optimizer state and step count untouched, the
// pipeline still usable); the average is taken in the canonical tower order, so parameters are bitwise
// reproducible and equal across backends and layouts.
// Threading: a pipeline is used by one thread at a time, like a standard container; its own threads
// and streams run the towers. Calls that change it (stage, step, set_parameter, set_optimizer_state,
// set_hyper, restore_steps_done) made while another one runs — from a second thread, or from inside a
// tower function — throw towerpipe::error and change nothing. Reading between steps is free.


#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/pipeline/state.hpp"
#include "towerpipe/pipeline/step_parts.hpp"
#include "towerpipe/step/checked_verdict.hpp"
#include "towerpipe/data/split.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {

template <class Exec, class Reduce, class Optim, class Layout>
class pipeline : public detail::pipeline_state<Exec, Reduce, Optim, Layout> {
  using state = detail::pipeline_state<Exec, Reduce, Optim, Layout>;

 public:
  using exec_policy = Exec;
  using reduce_policy = Reduce;
  using optimizer = Optim;
  using layout_policy = Layout;
  using typename state::hyper_parameters;
  using typename state::master_type;

  pipeline(variable_set variables, std::vector<input_spec> inputs, std::size_t towers, const hyper_parameters& h,
           const pipeline_options& options = {})
      : state(std::move(variables), towers, h, options), inputs_(std::move(inputs)) {
    detail::validate(inputs_);
    parts_ = std::make_unique<parts_type>(*this->variables_, options.buckets, sizeof(typename state::stored_type), *this->towers_,
                                          *this->reducer_, this->towers_->trace());
    if (options.trace != nullptr && this->across_processes())
      options.trace->set_process(this->processes_->rank(), this->processes_->size(), this->processes_->global_tower(0));
  }

  const std::vector<input_spec>& inputs() const { return inputs_; }

  // Checks a batch against the declared inputs, splits it and hands it to the towers (see the top).
  // At most two batches may wait: the one the next step uses and the one after.
  // Across processes a refusal here is held against the next step, which then fails on every process
  // and drops every staged batch everywhere, so that the processes' batches stay in step.
  void stage(const batch& examples) {
    const detail::exclusive_call call(this->busy_, "stage");
    try {
      stage_held(examples);
    } catch (...) {
      if (this->across_processes() && !stage_refused_)
        stage_refused_ = "stage() refused a batch since the last step: " + detail::current_exception_text();
      throw;
    }
  }

  // stage(batch) + step(fn) as one call on this batch: refused whole (nothing staged) or run. Across
  // processes (reduce::sharded) a batch refused on one process fails the step on every process alike.
  template <class TowerFn>
  step_stats step(const batch& examples, TowerFn&& fn) {
    const detail::exclusive_call call(this->busy_, "step");
    const auto start = clock::now();
    try {
      if (this->towers_->staged() != 0) detail::fail("step(batch, fn) with a batch staged already would run on that one: call step(fn)");
      stage_held(examples);
    } catch (...) {
      if (!this->across_processes()) throw;
      refuse_on_every_process(detail::current_exception_text());
    }
    return step_held(fn, detail::seconds_since(start));
  }

  // One training step on the oldest staged batch. fn(tower_context&) runs once per tower, writes the
  // mean gradient of every variable over its shard and returns its loss (anything convertible to double).
  template <class TowerFn>
  step_stats step(TowerFn&& fn) {
    const detail::exclusive_call call(this->busy_, "step");
    return step_held(fn);
  }

  // This process's part of a global batch of `global_examples`: stage batch.slice(part.first,
  // part.examples). Across processes (reduce::sharded) the part its towers get where one process with
  // every tower would cut the batch; in one process, the examples the split uses.
  batch_part process_part(std::size_t global_examples) const {
    return process_part_of(global_examples, this->towers(), static_cast<std::size_t>(this->processes_->size()),
                           static_cast<std::size_t>(this->processes_->rank()), this->options_.split);
  }

 private:
  using clock = detail::step_clock;
  using parts_type = detail::step_parts<typename state::towers_type, typename state::reducer_type>;
  using work_type = detail::step_work<master_type, Optim>;

  void stage_held(const batch& examples) {
    const auto start = clock::now();
    if (this->towers_->staged() >= 2) detail::fail("two batches are staged already: call step(fn) before staging more");
    examples.check_against(inputs_);
    if (this->across_processes() && this->options_.split == split_policy::drop_remainder && examples.examples() % this->towers() != 0)
      detail::fail("a batch of ", examples.examples(), " examples over this process's ", this->towers(), " towers leaves ",
                   examples.examples() % this->towers(), " out: across processes each stages exactly its part of the global batch ",
                   "(pipeline::process_part), so that the examples dropped are the global batch's last");
    const std::int64_t consuming_step = this->steps_done_ + static_cast<std::int64_t>(this->towers_->staged()) + 1;
    if (consuming_step > state::max_steps) detail::fail(past_max_steps);
    this->towers_->stage(examples, plan_split(examples.examples(), this->towers(), this->options_.split));
    staged_.push_back({detail::seconds_since(start), this->across_processes() ? examples.sampled_digest() : 0});
    this->towers_->trace().span("check + split + stage", start, clock::now(), consuming_step, "split");
  }

  // begin (the reducer's step work) -> the towers, their buckets during them, the rest after them ->
  // the processes agree -> finish -> a checked step's verdict and apply. A failure anywhere abandons.
  template <class TowerFn>
  step_stats step_held(TowerFn& fn, double staging_now = 0) {
    const std::optional<std::string> cannot = stage_refused_                       ? stage_refused_
                                              : this->towers_->staged() == 0        ? std::optional<std::string>(no_staged_batch)
                                              : this->steps_done_ == state::max_steps ? std::optional<std::string>(past_max_steps)
                                                                                     : std::nullopt;
    if (cannot) {
      if (this->across_processes()) refuse_on_every_process(*cannot);  // what this process cannot do, every process hears of
      detail::fail(*cannot);
    }
    step_stats stats;
    stats.step = this->steps_done_ + 1;
    const auto start = clock::now();
    const std::vector<shard> shards = this->towers_->next_shards();  // a copy: run() consumes the staged batch
    const auto [staging_seconds, part_digest] = staged_.front();
    stats.stages.split = staging_seconds;  // when the batch was staged, maybe during the last step
    staged_.pop_front();
    std::vector<double> exact_weights;  // w_i = examples_i / all examples, over every process's shards
    try {
      exact_weights = this->processes_->agree_before_towers(  // across processes, after agreeing on the settings
          stats.step, [&] { return this->step_settings_now(); }, shards, part_digest, this->options_.split, stats.examples);
    } catch (...) {
      // Refused before the towers ran: the batch goes, as after a failed step; across processes every
      // staged batch goes, as on the process that refused (refuse_on_every_process).
      this->towers_->discard_next();
      if (this->across_processes()) drop_staged();
      throw;
    }
    this->changes_.clear();
    stats.buckets = parts_->buckets();
    const work_type work = step_work(exact_weights, stats);
    try {
      parts_->begin(work, stats.step);
      run_towers(fn, exact_weights, stats);
      const auto reduce_start = parts_->towers_ended();  // what the towers left is reduced from there (step_parts)
      stats.stages.towers = std::chrono::duration<double>(reduce_start - start).count();
      stats.stages.reduce_during_towers = parts_->seconds_during_towers();
      stats.buckets_during_towers = parts_->buckets_during_towers();
      const detail::screen_partials screen = this->reducer_->finish(*this->towers_, stats.stages);
      if (work.checked) judge_and_apply(work, screen, stats);
      this->towers_->trace().span(
          stats.skipped ? "average + screen (skipped)" : stats.accumulating ? "average + accumulate" : "average + apply + broadcast",
          reduce_start, clock::now(), stats.step, "reduce");
    } catch (...) {
      abandon(work);
      throw;
    }
    this->towers_->finish_step(stats.step);
    if (!stats.skipped && !stats.accumulating) ++this->steps_done_;
    stats.seconds = detail::seconds_since(start) + staging_now;  // step(batch, fn) staged it in this call
    if (stats.micro_batch == 1) window_throughput_ = {0, 0};  // an optimizer step's first micro-batch
    window_throughput_.first += static_cast<double>(stats.examples);
    window_throughput_.second += stats.seconds;
    stats.examples_per_second = window_throughput_.first / window_throughput_.second;
    return stats;
  }

  // The step's work (reduce/common/contract.hpp): the towers' weights (a checked step's with the loss
  // scale folded in), its place in the accumulation window, the optimizer's constants, and whether
  // buckets go during the towers — only a window's first micro-batch's, since a later one adds into the
  // running sum, which a tower failing after a bucket would leave half written.
  work_type step_work(const std::vector<double>& exact_weights, step_stats& stats) const {
    work_type work;
    for (double w : exact_weights) work.weights.push_back(static_cast<master_type>(w));
    work.checked = this->checked_steps();
    work.constants = Optim::template constants<master_type>(this->hyper_parameters_, stats.step);
    if (work.checked) {
      stats.loss_scale = this->loss_scaler_.scale();
      stats.micro_batch = this->window_.micro_batch();
      work.weights = this->loss_scaler_.unscaled(work.weights);
      work.window = this->window_.template place<master_type>(stats.examples);
    }
    work.parts_during_towers = this->options_.overlap_reduction && this->reducer_->buckets_during_towers() &&
                               (!work.checked || work.window.first);
    return work;
  }

  // The towers on this step's batch, their losses, the loss weighted by `weights`, and the parts they
  // left; across processes agreed by every process before anything is updated (step/processes.hpp).
  // The towers return their loss times the loss scale; the stats report it unscaled too.
  template <class TowerFn>
  void run_towers(TowerFn& fn, const std::vector<double>& weights, step_stats& stats) {
    stats.scaled_loss = this->processes_->agree_on_towers(
        this->steps_done_ + 1,
        [&] {
          stats.tower_loss = this->towers_->run(fn, this->steps_done_ + 1);
          double loss = 0;
          for (std::size_t i = 0; i < weights.size(); ++i) loss += weights[i] * stats.tower_loss[i];
          return loss;
        },
        [&] { parts_->after_towers(this->across_processes()); });
    stats.loss = stats.scaled_loss / stats.loss_scale;
    for (double& loss : stats.tower_loss) loss /= stats.loss_scale;
  }

  // A failure anywhere in the step (its exception is being handled): what is in flight is waited for
  // (step_parts::abandon). A checked step's parts only wrote the screen's buffer, but its accumulation
  // window's running sum may be half written: the window starts again. An unchecked step's buckets were
  // applied, and the error says so — except across processes, where the owners update only in finish().
  void abandon(const work_type& work) {
    const std::size_t applied = parts_->abandon();
    if (work.checked) this->window_.reset();
    if (applied == 0 || work.checked || this->across_processes()) return;
    detail::fail(detail::current_exception_text(), "; step ", this->steps_done_ + 1, " had applied ", applied, " of its ",
                 parts_->buckets(), " gradient bucket(s) already (an unchecked step applies a bucket once every tower marked it ",
                 "ready): their variables took this step's update, the others did not; checked steps (on_nonfinite = skip) change ",
                 "nothing when a tower fails");
  }

  // A checked step once its screen is in: accumulate, or skip or throw on a non-finite average, clip, apply.
  void judge_and_apply(const work_type& work, const detail::screen_partials& screen, step_stats& stats) {
    if (!work.window.last) {
      stats.accumulating = true;
      this->window_.add(stats.examples, screen.first_nonfinite);
      return;
    }
    const detail::nonfinite_key first_nonfinite = this->window_.first_nonfinite(screen.first_nonfinite);
    this->window_.reset();
    this->loss_scaler_.update(first_nonfinite == detail::no_nonfinite);
    const detail::checked_verdict verdict =
        detail::judge_checked_step(screen, first_nonfinite, this->options_, *this->variables_, stats.step);
    stats.gradient_norm = verdict.gradient_norm;
    stats.nonfinite = verdict.nonfinite;
    stats.skipped = !verdict.apply;
    stats.clip_coefficient = verdict.clip_coefficient;
    if (verdict.apply) this->reducer_->apply(*this->towers_, static_cast<master_type>(verdict.clip_coefficient), stats.stages);
  }

  // This process cannot take part in the step (its batch was refused, it has none): every process fails
  // the step alike and drops every staged batch (step_held), so that the next batches line up again.
  [[noreturn]] void refuse_on_every_process(const std::string& refusal) {
    try {
      this->processes_->refuse_step(this->steps_done_ + 1, refusal, [&] { return this->step_settings_now(); }, this->options_.split);
    } catch (...) {
      drop_staged();
      throw;
    }
  }
  void drop_staged() {
    while (this->towers_->staged() > 0) this->towers_->discard_next();
    staged_.clear();
    stage_refused_.reset();
  }

  static constexpr const char* past_max_steps =
      "the pipeline has done 2^53 steps, the most it counts (bias corrections take the step as a double)";
  static constexpr const char* no_staged_batch = "step(fn) needs a staged batch: call stage(batch) or step(batch, fn)";

  std::vector<input_spec> inputs_;
  std::unique_ptr<parts_type> parts_;
  // Each batch still staged, oldest first: stage()'s seconds, and across processes its sampled digest.
  std::deque<std::pair<double, std::uint64_t>> staged_;
  std::pair<double, double> window_throughput_{0, 0};  // this optimizer step's micro-batches so far: examples, seconds
  std::optional<std::string> stage_refused_;  // across processes: what stage() refused since the last step
};

}  // namespace towerpipe
