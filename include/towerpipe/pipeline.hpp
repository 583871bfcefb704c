#pragma once
// pipeline<Exec, Reduce, Optim, Layout> — one synchronous data-parallel training step:
//
//   batch --split--> shard_i --tower fn--> gradients_i --average+apply--> parameters --broadcast--> towers
//
// instantiated from compile-time policies: the execution space of the towers (exec::host, ...), the
// reduction backend (reduce::host, ..., or reduce::automatic, which picks one: backend_name()), the
// optimizer (optim::sgd, optim::adam, optim::adamw) and the
// layout of parameters, gradients and optimizer state (layout::per_variable<T>, layout::flat<T>).
//
// Guarantees: a step either completes or changes nothing (bad batch, a tower that throws or leaves a
// gradient unwritten: a towerpipe::error, parameters, optimizer state and step count untouched, the
// pipeline still usable); the average is taken in the canonical tower order, so parameters are bitwise
// reproducible and equal across backends and layouts.
//
// Overlapping input with compute: stage(next) before step(fn) starts copying the next batch to the
// towers while this step runs (exec::cuda double-buffers it); step(fn) runs on the oldest staged batch
// and consumes it, whether it succeeds or fails. step(batch, fn) is stage(batch) + step(fn) on that
// batch: refused while another batch is staged.
//
// Overlapping the reduction with backward: towers that mark their gradients ready
// (tower_context::gradient_ready) have each gradient bucket (pipeline_options::buckets) reduced while
// they go on, where the reducer takes parts of a step (reduce/overlapped_reduction.hpp); bitwise the
// unbucketed step.
//
// Threading: a pipeline is used by one thread at a time, like a standard container; its own threads
// and streams run the towers. Calls that change it (stage, step, set_parameter, set_optimizer_state,
// set_hyper, restore_steps_done) made while another one runs — from a second thread, or from inside a
// tower function — throw towerpipe::error and change nothing. Reading between steps is free.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <exception>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/half_types.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/layout/batch.hpp"
#include "towerpipe/exec/towers_contract.hpp"
#include "towerpipe/programs/screen.hpp"
#include "towerpipe/reduce/reducer_contract.hpp"
#include "towerpipe/reduce/overlapped_reduction.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/accumulation_window.hpp"
#include "towerpipe/step/changes_since_step.hpp"
#include "towerpipe/step/checked_verdict.hpp"
#include "towerpipe/step/exclusive_call.hpp"
#include "towerpipe/step/loss_scaler.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/split.hpp"
#include "towerpipe/step/stats.hpp"
#include "towerpipe/step/validate.hpp"
#include "towerpipe/trace/tracer.hpp"

namespace towerpipe {

template <class Exec, class Reduce, class Optim, class Layout>
class pipeline {
  static_assert(detail::check_pipeline_policies<Exec, Reduce, Optim, Layout>());

 public:
  using exec_policy = Exec;
  using reduce_policy = Reduce;
  using optimizer = Optim;
  using layout_policy = Layout;
  // The towers' gradients and parameters hold stored_type; master parameters, optimizer state and the
  // averaged gradient are master_type: float for the 16-bit types (mixed precision), else the same.
  // value_type, as containers name what they hand out, is master_type.
  using stored_type = typename Layout::value_type;
  using master_type = master_type_t<stored_type>;
  using value_type = master_type;
  static constexpr bool mixed_precision = !std::is_same<stored_type, master_type>::value;
  using hyper_parameters = typename Optim::hyper_parameters;
  using towers_type = typename Exec::template towers<Layout>;
  using reducer_type = typename reducer_for<Exec, Reduce, Optim, Layout>::type;
  using tower_context = typename towers_type::context;
  static_assert(detail::check_towers_contract<towers_type>());
  static_assert(detail::check_reducer_contract<reducer_type, towers_type, Optim, master_type, mixed_precision>());
  static constexpr bool spans_processes = detail::reducer_spans_processes<reducer_type, towers_type, Optim>::value;
  // Whether gradient buckets are reduced while the towers run (reduce/overlapped_reduction.hpp); else
  // after them, every bucket at once.
  static constexpr bool overlaps_reduction =
      detail::reducer_reduces_parts<reducer_type, towers_type, Optim, master_type>::value;

  pipeline(variable_set variables, std::vector<input_spec> inputs, std::size_t towers, const hyper_parameters& h,
           const pipeline_options& options = {})
      : variables_(std::make_unique<variable_set>(std::move(variables))),
        inputs_(std::move(inputs)),
        options_(options),
        tracer_(options.trace),
        hyper_parameters_(validated(h)),
        loss_scaler_(options.loss_scale),
        window_(options.accumulation_steps) {
    if (towers == 0) detail::fail("a pipeline needs at least one tower");
    if (variables_->empty()) detail::fail("a pipeline needs at least one variable");
    detail::validate(inputs_);
    detail::validate(options_, towers, variables_->count(), checked_steps(options_));
    if (options_.processes && !spans_processes)
      detail::fail("pipeline_options::processes is set, but reduce::", Reduce::name, " does not span processes: each process would ",
                   "train alone on its own shards; use reduce::sharded, or leave processes empty");
    if (options_.time_backends > 0 && !detail::reducer_chooses_backend<reducer_type>::value)
      detail::fail("pipeline_options::time_backends times reduce::automatic's candidates; this pipeline runs reduce::", Reduce::name);
    processes_ = std::make_unique<detail::processes>(  // alone, a process has nothing to compare
        options_, checked_steps(options_), towers,
        options_.processes ? detail::configuration_fingerprint<Optim, Layout>(Exec::name, *variables_, hyper_parameters_, towers, options_)
                           : std::vector<std::string>{});
    const detail::bucket_plan buckets = detail::make_bucket_plan(*variables_, options_.buckets, sizeof(stored_type));
    bucket_count_ = buckets.count();
    towers_ = std::make_unique<towers_type>(*variables_, towers, options_);
    reducer_ = detail::make_reducer<reducer_type, towers_type, Optim>(*variables_, hyper_parameters_, *towers_, options_, *processes_);
    if constexpr (overlaps_reduction) {
      detail::overlapped_reduction::tower_done on_tower_done;  // GPU towers: an event on the tower's stream
      if constexpr (detail::towers_record_bucket_events<towers_type>::value) {
        towers_->prepare_bucket_events(bucket_count_);
        on_tower_done = [this](std::size_t tower, std::size_t bucket) { towers_->record_bucket_done(tower, bucket); };
      }
      overlap_ = std::make_unique<detail::overlapped_reduction>(*variables_, options_.buckets, towers, sizeof(stored_type),
                                                                std::move(on_tower_done));
      towers_->set_ready_listener(overlap_.get());
    }
    if (options_.trace != nullptr && across_processes())
      options_.trace->set_process(processes_->rank(), processes_->size(), processes_->global_tower(0));
  }

  // The reduction backend the steps run: Reduce's, or the one reduce::automatic chose; and why.
  const char* backend_name() const {
    if constexpr (detail::reducer_chooses_backend<reducer_type>::value) return reducer_->backend_name();
    else return Reduce::name;
  }
  std::string backend_reason() const {
    if constexpr (detail::reducer_chooses_backend<reducer_type>::value) return reducer_->choice().reason;
    else return detail::make_message("reduce::", Reduce::name, " named by the pipeline's type");
  }

  pipeline(const pipeline&) = delete;
  pipeline& operator=(const pipeline&) = delete;

  const variable_set& variables() const { return *variables_; }
  const std::vector<input_spec>& inputs() const { return inputs_; }
  std::size_t towers() const { return towers_->towers(); }
  std::int64_t steps_done() const { return steps_done_; }
  // Micro-batches of the open accumulation window already averaged (pipeline_options::
  // accumulation_steps); 0 between optimizer steps, where checkpoints are taken.
  std::size_t micro_batches_pending() const { return window_.pending(); }

  // The towers themselves (exec/towers_contract.hpp: replicas, gradients, streams), for users who need
  // more than the step interface (a GPU tower's stream between steps, say).
  towers_type& execution_space() { return *towers_; }

  const pipeline_options& options() const { return options_; }
  const hyper_parameters& hyper() const { return hyper_parameters_; }
  // For schedules: takes effect from the next step; validated first, so a bad value changes nothing.
  void set_hyper(const hyper_parameters& h) {
    const detail::exclusive_call call(busy_, "set_hyper");
    if (Optim::state_slots(h) != Optim::state_slots(hyper_parameters_))
      detail::fail(Optim::name, ": new hyper-parameters need ", Optim::state_slots(h),
                   " optimizer state slot(s), the pipeline was built with ", Optim::state_slots(hyper_parameters_));
    hyper_parameters_ = validated(h);
  }

  // Parameters as the towers see them, read-only between steps (copied to the host where they live on
  // devices); with mixed precision the master parameters, whose rounded copy the towers see.
  tensor_view<const master_type> parameter(std::size_t index) const {
    variables_->check_index(index);
    if constexpr (mixed_precision) {
      return reducer_->master_on_host(index);
    } else {
      return towers_->parameter_on_host(index);
    }
  }
  tensor_view<const master_type> parameter(const std::string& name) const { return parameter(variables_->index_of(name)); }

  // Sets a variable's parameters on every tower.
  void set_parameter(std::size_t index, const master_type* values, std::size_t count) {
    const detail::exclusive_call call(busy_, "set_parameter");
    set_parameter_held(index, values, count);
  }
  void set_parameter(const std::string& name, const master_type* values, std::size_t count) {
    set_parameter(variables_->index_of(name), values, count);
  }

  // Calls init(variable, view) for every variable in order, e.g. to draw initial weights.
  void initialize(const std::function<void(const variable&, tensor_view<master_type>)>& init) {
    for (std::size_t i = 0; i < variables_->count(); ++i) {
      const variable& v = (*variables_)[i];
      std::vector<master_type> values(v.size);
      init(v, tensor_view<master_type>(values.data(), v.shape));
      set_parameter(i, values.data(), values.size());
    }
  }

 private:
  void set_parameter_held(std::size_t index, const master_type* values, std::size_t count) {
    variables_->check_index(index);
    const variable& v = (*variables_)[index];
    if (count != v.size)
      detail::fail("parameter '", v.name, "' set with ", count, " values; its shape ", to_string(v.shape), " holds ",
                   v.size);
    if constexpr (mixed_precision) {
      std::vector<stored_type> rounded(count);
      for (std::size_t i = 0; i < count; ++i) rounded[i] = detail::narrow<stored_type>(values[i]);
      towers_->set_parameter(index, rounded.data());
    } else {
      towers_->set_parameter(index, values);
    }
    if constexpr (detail::reducer_has_parameter_set<reducer_type>::value) reducer_->parameter_set(index, values);
    changes_.parameters_set();
  }
  void set_optimizer_state_held(std::size_t slot, std::size_t index, const master_type* values, std::size_t count) {
    check_state_slot(slot, index);
    if (count != (*variables_)[index].size)
      detail::fail(Optim::name, " state slot ", slot, " of '", (*variables_)[index].name, "' set with ", count,
                   " values; it holds ", (*variables_)[index].size);
    reducer_->set_state(slot, index, values);
    // Each process's own record of what it set (a sharded process holds only its slice of the state).
    changes_.state_set(slot, index, values, count * sizeof(master_type));
  }

 public:

  // Optimizer state slot `slot` (see the optimizer's header for what each slot holds).
  std::size_t optimizer_state_slots() const { return reducer_->state_slots(); }
  // Bytes of optimizer state on each tower's device, for backends that spread it (reduce::sharded on
  // GPU towers: about 1/N each). The others hold it in one place: tower 0's device or host memory.
  template <class Reducer = reducer_type>
  std::vector<std::size_t> optimizer_state_bytes_per_tower() const {
    static_assert(detail::reducer_spreads_state<Reducer>::value,
                  "towerpipe: this reduction backend keeps the optimizer state in one place (tower 0's device or the "
                  "host); reduce::sharded on GPU towers spreads it over the towers");
    return reducer_->state_bytes_per_tower(towers_->towers());
  }
  tensor_view<const master_type> optimizer_state(std::size_t slot, std::size_t index) const {
    check_state_slot(slot, index);
    return reducer_->state_on_host(slot, index);
  }
  void set_optimizer_state(std::size_t slot, std::size_t index, const master_type* values, std::size_t count) {
    const detail::exclusive_call call(busy_, "set_optimizer_state");
    set_optimizer_state_held(slot, index, values, count);
  }

  // The loss scale the tower functions multiply their loss by (1 when loss scaling is off), and the
  // count of good steps towards its next growth; both for checkpoints and schedules.
  double loss_scale() const { return loss_scaler_.scale(); }
  bool loss_scaling_on() const { return loss_scaler_.on(); }
  std::int64_t loss_scale_good_steps() const { return loss_scaler_.good_steps(); }
  void set_loss_scale(double scale, std::int64_t good_steps = 0) {
    const detail::exclusive_call call(busy_, "set_loss_scale");
    loss_scaler_.set(scale, good_steps);
  }

  // For resuming from a checkpoint: the next step is step + 1 (bias corrections depend on it).
  void restore_steps_done(std::int64_t steps) {
    const detail::exclusive_call call(busy_, "restore_steps_done");
    check_step_count(steps);
    steps_done_ = steps;
  }

  // What a checkpoint holds (io/checkpoint.hpp), applied under one exclusive call once every part is
  // checked, so that a refused restore changes nothing. `values`: every variable's parameters in order,
  // then each state slot's values likewise. `loss_scale`: the scale and its good-step count, or none
  // (a file from before loss scaling was saved): the configured initial scale.
  void restore_state(const master_type* values, std::int64_t steps, std::optional<std::pair<double, std::int64_t>> loss_scale) {
    const detail::exclusive_call call(busy_, "restore_state");
    check_step_count(steps);
    if (loss_scaling_on()) {
      if (!loss_scale) loss_scale = std::make_pair(loss_scaler_.initial_scale(), std::int64_t(0));
      loss_scaler_.check(loss_scale->first, loss_scale->second);
    }
    const std::size_t total = variables_->total_size();
    for (std::size_t v = 0, offset = 0; v < variables_->count(); offset += (*variables_)[v++].size)
      set_parameter_held(v, values + offset, (*variables_)[v].size);
    for (std::size_t slot = 0; slot < reducer_->state_slots(); ++slot) {
      for (std::size_t v = 0, offset = (1 + slot) * total; v < variables_->count(); offset += (*variables_)[v++].size)
        set_optimizer_state_held(slot, v, values + offset, (*variables_)[v].size);
    }
    steps_done_ = steps;
    if (loss_scaling_on()) loss_scaler_.set(loss_scale->first, loss_scale->second);
  }

  // Checks a batch against the declared inputs, splits it and hands it to the towers (see the top).
  // At most two batches may wait: the one the next step uses and the one after.
  // Across processes a refusal here is held against the next step, which then fails on every process
  // and drops every staged batch everywhere, so that the processes' batches stay in step.
  void stage(const batch& examples) {
    const detail::exclusive_call call(busy_, "stage");
    try {
      stage_held(examples);
    } catch (...) {
      if (across_processes() && !stage_refused_)
        stage_refused_ = "stage() refused a batch since the last step: " + detail::current_exception_text();
      throw;
    }
  }

  // stage(batch) + step(fn) as one call on this batch: refused whole (nothing staged) or run. Across
  // processes (reduce::sharded) a batch refused on one process fails the step on every process alike.
  template <class TowerFn>
  step_stats step(const batch& examples, TowerFn&& fn) {
    const detail::exclusive_call call(busy_, "step");
    const auto start = clock::now();
    try {
      if (towers_->staged() != 0)
        detail::fail("step(batch, fn) with a batch staged already would run on that one: call step(fn)");
      stage_held(examples);
    } catch (...) {
      if (!across_processes()) throw;
      refuse_on_every_process(detail::current_exception_text());
    }
    const double staging = seconds_since(start);
    step_stats stats = step_held(fn);
    stats.seconds += staging;
    stats.examples_per_second = static_cast<double>(stats.examples) / stats.seconds;
    return stats;
  }

  // One training step on the oldest staged batch. fn(tower_context&) runs once per tower, writes the
  // mean gradient of every variable over its shard and returns its loss (anything convertible to double).
  template <class TowerFn>
  step_stats step(TowerFn&& fn) {
    const detail::exclusive_call call(busy_, "step");
    return step_held(fn);
  }

  // This process's part of a global batch of `global_examples`: stage batch.slice(part.first,
  // part.examples). Across processes (reduce::sharded) the part its towers get where one process with
  // every tower would cut the batch; in one process, the examples the split uses.
  batch_part process_part(std::size_t global_examples) const {
    return process_part_of(global_examples, towers(), static_cast<std::size_t>(processes_->size()),
                           static_cast<std::size_t>(processes_->rank()), options_.split);
  }

  // The most steps a pipeline counts: bias corrections take the step as a double, exact up to 2^53.
  static constexpr std::int64_t max_steps = std::int64_t(1) << 53;
  static void check_step_count(std::int64_t steps) {
    if (steps < 0 || steps > max_steps)
      detail::fail("a step count must be in [0, 2^53]; ", steps, " given");
  }

 private:
  using clock = std::chrono::steady_clock;

  void stage_held(const batch& examples) {
    const auto start = clock::now();
    if (towers_->staged() >= 2) detail::fail("two batches are staged already: call step(fn) before staging more");
    examples.check_against(inputs_);
    if (across_processes() && options_.split == split_policy::drop_remainder && examples.examples() % towers() != 0)
      detail::fail("a batch of ", examples.examples(), " examples over this process's ", towers(), " towers leaves ",
                   examples.examples() % towers(), " out: across processes each stages exactly its part of the global batch ",
                   "(pipeline::process_part), so that the examples dropped are the global batch's last");
    const std::int64_t consuming_step = steps_done_ + static_cast<std::int64_t>(towers_->staged()) + 1;
    if (consuming_step > max_steps) detail::fail(past_max_steps);
    towers_->stage(examples, plan_split(examples.examples(), towers(), options_.split));
    staging_seconds_.push_back(seconds_since(start));
    tracer_.span("check + split + stage", start, clock::now(), consuming_step, "split");
  }

  template <class TowerFn>
  step_stats step_held(TowerFn& fn) {
    const std::optional<std::string> cannot = stage_refused_               ? stage_refused_
                                              : towers_->staged() == 0       ? std::optional<std::string>(no_staged_batch)
                                              : steps_done_ == max_steps     ? std::optional<std::string>(past_max_steps)
                                                                             : std::nullopt;
    if (cannot) {
      if (across_processes()) refuse_on_every_process(*cannot);  // what this process cannot do, every process hears of
      detail::fail(*cannot);
    }
    step_stats stats;
    const auto start = clock::now();
    const std::vector<shard> shards = towers_->next_shards();  // a copy: run() consumes the staged batch
    stats.stages.split = staging_seconds_.front();  // when the batch was staged, maybe during the last step
    staging_seconds_.pop_front();
    std::vector<double> exact_weights;
    try {
      exact_weights = tower_weights(shards, stats);
    } catch (...) {
      // Refused before the towers ran: the batch goes, as after a failed step; across processes every
      // staged batch goes, as on the process that refused (refuse_on_every_process).
      towers_->discard_next();
      if (across_processes()) drop_staged();
      throw;
    }
    std::vector<master_type> weights;
    for (double w : exact_weights) weights.push_back(static_cast<master_type>(w));
    const auto constants = Optim::template constants<master_type>(hyper_parameters_, steps_done_ + 1);
    stats.step = steps_done_ + 1;
    stats.buckets = bucket_count_;
    screen_pass screen;
    if (checked_steps(options_)) {
      stats.loss_scale = loss_scaler_.scale();
      stats.micro_batch = window_.micro_batch();
      screen.weights = loss_scaler_.unscaled(weights);
      screen.window = window_.place<master_type>(stats.examples);
    }
    if constexpr (overlaps_reduction) begin_overlap(weights, constants, screen, stats);
    try {
      run_towers(fn, exact_weights, stats);
    } catch (...) {
      if constexpr (overlaps_reduction) abandon_overlap(stats.step);
      throw;
    }
    stats.stages.towers = seconds_since(start);

    const auto reduce_start = clock::now();
    if (checked_steps(options_)) {
      try {
        if constexpr (overlaps_reduction) {
          finish_overlap(stats);
        } else {
          screen.partials = reducer_->screen_average(*towers_, screen.weights, screen.window, stats.stages);
        }
      } catch (...) {
        window_.reset();  // the running sum may be half written: the window starts again
        throw;
      }
      judge_and_apply(screen, constants, stats);
    } else if constexpr (overlaps_reduction) {
      finish_overlap(stats);
    } else {
      reducer_->average_and_apply(*towers_, weights, constants, stats.stages);
    }
    tracer_.span(stats.skipped        ? "average + screen (skipped)"
                 : stats.accumulating ? "average + accumulate"
                                      : "average + apply + broadcast",
                 reduce_start,
                 clock::now(), stats.step, "reduce");
    if constexpr (detail::towers_has_finish_step<towers_type>::value) towers_->finish_step(stats.step);

    if (!stats.skipped && !stats.accumulating) ++steps_done_;
    stats.seconds = seconds_since(start);
    stats.examples_per_second = static_cast<double>(stats.examples) / stats.seconds;
    return stats;
  }

  static bool checked_steps(const pipeline_options& options) { return detail::takes_checked_steps(options, mixed_precision); }

  // The towers' weights w_i = examples_i / all examples; with several processes (reduce::sharded) every
  // process's shards count, stats.examples becomes their total, and the processes first agree on this
  // step's settings (step/processes.hpp).
  std::vector<double> tower_weights(const std::vector<shard>& shards, step_stats& stats) {
    const std::vector<double> weights = processes_->agree_before_towers(
        steps_done_ + 1, [&] { return step_settings(); }, shards, options_.split, stats.examples);
    changes_.clear();
    return weights;
  }

  // Whether steps span several processes (reduce::sharded given pipeline_options::processes).
  bool across_processes() const { return processes_->size() > 1; }

  // This process cannot take part in the step (its batch was refused, it has none): every process fails
  // the step alike and drops every staged batch (step_held), so that the next batches line up again.
  [[noreturn]] void refuse_on_every_process(const std::string& refusal) {
    try {
      processes_->refuse_step(steps_done_ + 1, refusal, [&] { return step_settings(); }, options_.split);
    } catch (...) {
      drop_staged();
      throw;
    }
  }
  void drop_staged() {
    while (towers_->staged() > 0) towers_->discard_next();
    staging_seconds_.clear();
    stage_refused_.reset();
  }

  // The towers on this step's batch, their losses, and the loss weighted by `weights`; across processes
  // agreed by every process before anything is updated (step/processes.hpp).
  template <class TowerFn>
  void run_towers(TowerFn& fn, const std::vector<double>& weights, step_stats& stats) {
    stats.loss = processes_->agree_on_towers(
        steps_done_ + 1,
        [&] {
          stats.tower_loss = towers_->run(fn, steps_done_ + 1);
          double loss = 0;
          for (std::size_t i = 0; i < weights.size(); ++i) loss += weights[i] * stats.tower_loss[i];
          return loss;
        },
        [&] {
          if constexpr (overlaps_reduction) overlap_->settle();
        });
  }

  // What every process must agree on before a step's towers run, beyond what it compared at
  // construction: what set_hyper, set_loss_scale, restore_steps_done and the parameters changed since.
  // Parameters that were set since the last step (initialisation, a checkpoint) go in as a digest, so
  // that a process that resumed other state, or none, stops every process.
  std::string step_settings() const {
    std::string text = detail::make_message("step: ", steps_done_ + 1, "\noptimizer: ", Optim::describe(hyper_parameters_),
                                            "\nloss scale: ", detail::exact(loss_scaler_.scale()), ", good steps ", loss_scaler_.good_steps(),
                                            "\nmicro-batch: ", window_.micro_batch(), "\n");
    return text + changes_.describe([&] {
      std::uint64_t digest = fnv1a_basis;
      for (std::size_t v = 0; v < variables_->count(); ++v) {
        const tensor_view<const master_type> values = parameter(v);
        digest = fnv1a(values.data(), values.size() * sizeof(master_type), digest);
      }
      return digest;
    });
  }

  // A checked step's first pass (programs/screen.hpp) as it goes: the weights it averages with (the loss
  // scale folded in), where the step stands in its accumulation window, and the screen's partials.
  struct screen_pass {
    std::vector<master_type> weights;
    detail::accumulation<master_type> window;
    detail::screen_partials partials;
  };

  // Before the towers run: how a part of this step over some variables is reduced, so that the buckets
  // the towers mark ready go while they run (reduce/overlapped_reduction.hpp). A checked step screens its
  // buckets then and applies after the verdict; only a window's first micro-batch does, because a later
  // one adds into the running sum, which a tower failing after a bucket would leave half written.
  void begin_overlap(const std::vector<master_type>& weights, const typename Optim::template step_constants<master_type>& constants,
                     screen_pass& screen, step_stats& stats) {
    const bool checked = checked_steps(options_);
    if (checked) screen.partials = reducer_->begin_screen();
    detail::overlapped_reduction::part settle;  // across processes, before they agree on the towers (step/processes.hpp)
    if constexpr (detail::reducer_settles_parts<reducer_type, towers_type, master_type>::value) {
      const std::vector<master_type>* contribution_weights = checked ? &screen.weights : &weights;
      settle = [this, contribution_weights](const detail::step_part& rest) { reducer_->settle_part(*towers_, rest, *contribution_weights); };
    }
    overlap_->begin_step(
        [this, checked, &stats, &weights, &constants, &screen](const detail::step_part& part) {
          const auto begin = clock::now();
          if (checked) reducer_->screen_part(*towers_, part, screen.weights, screen.window, screen.partials, stats.stages);
          else reducer_->average_and_apply_part(*towers_, part, weights, constants, stats.stages);
          if (part.during_towers())
            tracer_.span(checked ? "bucket: average + screen" : "bucket: average + apply", begin, clock::now(), stats.step,
                         "reduce (during towers)");
        },
        options_.overlap_reduction && reducer_->overlaps_buckets() && (!checked || screen.window.first), std::move(settle));
  }
  // After the towers: the buckets they left, and what the step hid behind them.
  void finish_overlap(step_stats& stats) {
    detail::overlapped_reduction::outcome outcome;
    try {
      outcome = overlap_->finish();
    } catch (...) {
      abandon_overlap(stats.step);
      throw;
    }
    stats.stages.reduce_during_towers = outcome.seconds_during_towers;
    stats.buckets_during_towers = outcome.buckets_during_towers;
  }
  // A tower or a bucket's pass failed (its exception is being handled): the buckets in flight are
  // waited for, on the host and, where the reducer enqueues them on devices, there too (join_parts).
  // A checked step's buckets only wrote the screen's buffer; an unchecked step's were applied, and the
  // error says so — except across processes, where the owners update only after the processes agreed on
  // the towers (reduce/sharded/host_towers.hpp).
  void abandon_overlap(std::int64_t step) {
    const std::size_t applied = overlap_->abandon();
    if constexpr (detail::reducer_has_join_parts<reducer_type, towers_type>::value) reducer_->join_parts(*towers_);
    if (applied == 0 || checked_steps(options_) || across_processes()) return;
    detail::fail(detail::current_exception_text(), "; step ", step, " had applied ", applied, " of its ", bucket_count_,
                 " gradient bucket(s) already (an unchecked step applies a bucket once every tower marked it ready): ",
                 "their variables took this step's update, the others did not; checked steps (on_nonfinite = skip) change "
                 "nothing when a tower fails");
  }

  // A checked step once its screen is in: accumulate, or skip or throw on a non-finite average, clip, apply.
  void judge_and_apply(const screen_pass& screen, const typename Optim::template step_constants<master_type>& constants,
                       step_stats& stats) {
    if (!screen.window.last) {
      stats.accumulating = true;
      window_.add(stats.examples, screen.partials.first_nonfinite);
      return;
    }
    const detail::nonfinite_key first_nonfinite = window_.first_nonfinite(screen.partials.first_nonfinite);
    window_.reset();
    loss_scaler_.update(first_nonfinite == detail::no_nonfinite);
    const detail::checked_verdict verdict =
        detail::judge_checked_step(screen.partials, first_nonfinite, options_, *variables_, stats.step);
    stats.gradient_norm = verdict.gradient_norm;
    stats.nonfinite = verdict.nonfinite;
    stats.skipped = !verdict.apply;
    stats.clip_coefficient = verdict.clip_coefficient;
    if (verdict.apply)
      reducer_->apply_averaged(*towers_, static_cast<master_type>(verdict.clip_coefficient), constants, stats.stages);
  }

  static constexpr const char* past_max_steps =
      "the pipeline has done 2^53 steps, the most it counts (bias corrections take the step as a double)";
  static constexpr const char* no_staged_batch = "step(fn) needs a staged batch: call stage(batch) or step(batch, fn)";

  static double seconds_since(clock::time_point start) {
    return std::chrono::duration<double>(clock::now() - start).count();
  }

  void check_state_slot(std::size_t slot, std::size_t index) const {
    if (slot >= reducer_->state_slots())
      detail::fail(Optim::name, " has ", reducer_->state_slots(), " state slot(s) here; slot ", slot, " requested");
    variables_->check_index(index);
  }

  static const hyper_parameters& validated(const hyper_parameters& h) {
    Optim::validate(h);
    return h;
  }

  std::unique_ptr<variable_set> variables_;  // on the heap: buffers keep a pointer to it
  std::vector<input_spec> inputs_;
  pipeline_options options_;
  detail::tracer tracer_;
  hyper_parameters hyper_parameters_;
  std::unique_ptr<towers_type> towers_;
  std::unique_ptr<detail::processes> processes_;  // the processes the towers span; this one alone without options.processes
  std::unique_ptr<reducer_type> reducer_;
  std::size_t bucket_count_ = 1;
  std::unique_ptr<detail::overlapped_reduction> overlap_;  // overlaps_reduction only
  std::deque<double> staging_seconds_;  // stage()'s time for each batch still staged, oldest first
  std::int64_t steps_done_ = 0;
  detail::changes_since_step changes_;  // for the processes' agreement at the next step
  std::optional<std::string> stage_refused_;  // across processes: what stage() refused since the last step
  std::atomic<bool> busy_{false};
  detail::loss_scaler loss_scaler_;
  detail::accumulation_window window_;
};

}  // namespace towerpipe
