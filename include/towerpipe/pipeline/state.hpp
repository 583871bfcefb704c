#pragma once
// pipeline_state<Exec, Reduce, Optim, Layout> — what a pipeline holds between steps and the calls that
// read and set it: the variables, the towers and their parameters, the reducer and its optimizer state,
// the step count, the loss scale and the accumulation window; what a checkpoint (io/checkpoint.hpp)
// saves and restores. pipeline<...> (pipeline.hpp) derives from it and adds the steps.
//
// Every call that changes the state holds the pipeline busy (step/exclusive_call.hpp) and is
// validated first, so a refused call changes nothing. Across processes every change is noted for the
// processes' agreement at the next step (step/changes_since_step.hpp).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/towers_contract.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/step/accumulation_window.hpp"
#include "towerpipe/step/changes_since_step.hpp"
#include "towerpipe/step/exclusive_call.hpp"
#include "towerpipe/step/loss_scaler.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/validate.hpp"

namespace towerpipe {
namespace detail {

template <class Exec, class Reduce, class Optim, class Layout>
class pipeline_state {
  static_assert(check_pipeline_policies<Exec, Reduce, Optim, Layout>());

 public:
  // The towers hold stored_type; master parameters, optimizer state and the averaged gradient are
  // master_type (layout/precision.hpp). value_type, as containers name what they hand out, is master_type.
  using stored_type = typename precision<Layout>::stored_type;
  using master_type = typename precision<Layout>::master_type;
  using value_type = master_type;
  static constexpr bool mixed_precision = precision<Layout>::mixed;
  using hyper_parameters = typename Optim::hyper_parameters;
  using towers_type = typename Exec::template towers<Layout>;
  using reducer_type = typename reducer_for<Exec, Reduce, Optim, Layout>::type;
  using tower_context = typename towers_type::context;
  static_assert(check_towers_contract<towers_type>());
  static_assert(check_reducer_contract<reducer_type, towers_type, Optim, master_type>());

  const variable_set& variables() const { return *variables_; }
  std::size_t towers() const { return towers_->towers(); }
  std::int64_t steps_done() const { return steps_done_; }
  // Micro-batches of the open accumulation window already averaged (pipeline_options::
  // accumulation_steps); 0 between optimizer steps, where checkpoints are taken.
  std::size_t micro_batches_pending() const { return window_.pending(); }
  // The towers themselves (exec/towers_contract.hpp: replicas, gradients, streams), for users who need
  // more than the step interface (a GPU tower's stream between steps, say).
  towers_type& execution_space() { return *towers_; }
  const pipeline_options& options() const { return options_; }

  // The reduction backend the steps run: Reduce's, or the one reduce::automatic chose; and why.
  std::string backend_name() const { return reducer_->choice().backend; }
  std::string backend_reason() const { return reducer_->choice().reason; }

  const hyper_parameters& hyper() const { return hyper_parameters_; }
  // For schedules: takes effect from the next step; validated first, so a bad value changes nothing.
  void set_hyper(const hyper_parameters& h) {
    const exclusive_call call(busy_, "set_hyper");
    if (Optim::state_slots(h) != Optim::state_slots(hyper_parameters_))
      fail(Optim::name, ": new hyper-parameters need ", Optim::state_slots(h), " optimizer state slot(s), the pipeline was built with ",
           Optim::state_slots(hyper_parameters_));
    hyper_parameters_ = validated(h);
  }

  // Parameters as the towers see them, read-only between steps (copied to the host where they live on
  // devices); with mixed precision the master parameters, whose rounded copy the towers see.
  tensor_view<const master_type> parameter(std::size_t index) const {
    variables_->check_index(index);
    return reducer_->master(index);
  }
  tensor_view<const master_type> parameter(const std::string& name) const { return parameter(variables_->index_of(name)); }
  // Sets a variable's parameters on every tower.
  void set_parameter(std::size_t index, const master_type* values, std::size_t count) {
    const exclusive_call call(busy_, "set_parameter");
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

  // Optimizer state slot `slot` (see the optimizer's header for what each slot holds).
  std::size_t optimizer_state_slots() const { return reducer_->state_slots(); }
  // Bytes of optimizer state on each tower's device, for backends that spread it (reduce::sharded on
  // GPU towers: about 1/N each). The others hold it in one place: tower 0's device or host memory.
  template <class Reducer = reducer_type>
  std::vector<std::size_t> optimizer_state_bytes_per_tower() const {
    static_assert(Reducer::capabilities.spreads_state,
                  "towerpipe: this reduction backend keeps the optimizer state in one place (tower 0's device or the "
                  "host); reduce::sharded on GPU towers spreads it over the towers");
    return reducer_->state_bytes_per_tower();
  }
  tensor_view<const master_type> optimizer_state(std::size_t slot, std::size_t index) const {
    check_state_slot(slot, index);
    return reducer_->state(slot, index);
  }
  void set_optimizer_state(std::size_t slot, std::size_t index, const master_type* values, std::size_t count) {
    const exclusive_call call(busy_, "set_optimizer_state");
    set_optimizer_state_held(slot, index, values, count);
  }

  // The loss scale the tower functions multiply their loss by (1 when loss scaling is off), and the
  // count of good steps towards its next growth; both for checkpoints and schedules.
  double loss_scale() const { return loss_scaler_.scale(); }
  bool loss_scaling_on() const { return loss_scaler_.on(); }
  std::int64_t loss_scale_good_steps() const { return loss_scaler_.good_steps(); }
  void set_loss_scale(double scale, std::int64_t good_steps = 0) {
    const exclusive_call call(busy_, "set_loss_scale");
    loss_scaler_.set(scale, good_steps);
  }

  // For resuming from a checkpoint: the next step is step + 1 (bias corrections depend on it).
  void restore_steps_done(std::int64_t steps) {
    const exclusive_call call(busy_, "restore_steps_done");
    check_step_count(steps);
    steps_done_ = steps;
  }

  // What a checkpoint holds (io/checkpoint.hpp), applied under one exclusive call once every part is
  // checked, so that a refused restore changes nothing. `values`: every variable's parameters in order,
  // then each state slot's values likewise. `loss_scale`: the scale and its good-step count, or none
  // (a file from before loss scaling was saved): the configured initial scale.
  void restore_state(const master_type* values, std::int64_t steps, std::optional<std::pair<double, std::int64_t>> loss_scale) {
    const exclusive_call call(busy_, "restore_state");
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

  // The most steps a pipeline counts: bias corrections take the step as a double, exact up to 2^53.
  static constexpr std::int64_t max_steps = std::int64_t(1) << 53;
  static void check_step_count(std::int64_t steps) {
    if (steps < 0 || steps > max_steps) fail("a step count must be in [0, 2^53]; ", steps, " given");
  }

 protected:
  pipeline_state(variable_set variables, std::size_t towers, const hyper_parameters& h, const pipeline_options& options)
      : variables_(std::make_unique<variable_set>(std::move(variables))),
        options_(options),
        hyper_parameters_(validated(h)),
        loss_scaler_(options.loss_scale),
        window_(options.accumulation_steps) {
    if (towers == 0) fail("a pipeline needs at least one tower");
    if (variables_->empty()) fail("a pipeline needs at least one variable");
    validate(options_, towers, variables_->count(), checked_steps());
    if (options_.time_backends > 0 && !reducer_type::capabilities.chooses_backend)
      fail("pipeline_options::time_backends times reduce::automatic's candidates; this pipeline runs reduce::", Reduce::name);
    if (options_.processes && !reducer_type::capabilities.spans_processes)
      fail("pipeline_options::processes is set, but reduce::", Reduce::name, " does not span processes: each process would ",
           "train alone on its own shards; use reduce::sharded, or leave processes empty");
    processes_ = std::make_unique<processes>(  // alone, a process has nothing to compare
        options_, checked_steps(), towers,
        options_.processes ? configuration_fingerprint<Optim, Layout>(Exec::name, *variables_, hyper_parameters_, towers, options_)
                           : std::vector<std::string>{});
    towers_ = std::make_unique<towers_type>(*variables_, towers, options_);
    reducer_ = std::make_unique<reducer_type>(reducer_setup<towers_type, Optim>{*variables_, hyper_parameters_, *towers_, options_, *processes_});
  }

  bool checked_steps() const { return takes_checked_steps(options_, mixed_precision); }
  // Whether steps span several processes (reduce::sharded given pipeline_options::processes).
  bool across_processes() const { return processes_->size() > 1; }

  // What every process must agree on before a step's towers run, beyond what it compared at
  // construction: what set_hyper, set_loss_scale, restore_steps_done and set_optimizer_state changed,
  // and whether the parameters were set since the last step (the processes then compare them).
  step_settings step_settings_now() const {
    return {make_message("step: ", steps_done_ + 1, "\noptimizer: ", Optim::describe(hyper_parameters_), "\nloss scale: ",
                         exact(loss_scaler_.scale()), ", good steps ", loss_scaler_.good_steps(), "\nmicro-batch: ",
                         window_.micro_batch(), "\n", changes_.describe_state()),
            changes_.parameters_were_set(), [this] {
              std::uint64_t digest = fnv1a_basis;
              for (std::size_t v = 0; v < variables_->count(); ++v) {
                const tensor_view<const master_type> values = parameter(v);
                digest = fnv1a(values.data(), values.size() * sizeof(master_type), digest);
              }
              return digest;
            }};
  }

  // Declared first: what the rest refers to is destroyed last (the reducer before the towers).
  std::unique_ptr<variable_set> variables_;  // on the heap: buffers keep a pointer to it
  pipeline_options options_;
  hyper_parameters hyper_parameters_;
  std::unique_ptr<processes> processes_;  // the processes the towers span; this one alone without options.processes
  std::unique_ptr<towers_type> towers_;
  std::unique_ptr<reducer_type> reducer_;
  std::int64_t steps_done_ = 0;
  changes_since_step changes_;  // for the processes' agreement at the next step
  std::atomic<bool> busy_{false};
  loss_scaler loss_scaler_;
  accumulation_window window_;

 private:
  void set_parameter_held(std::size_t index, const master_type* values, std::size_t count) {
    variables_->check_index(index);
    const variable& v = (*variables_)[index];
    if (count != v.size)
      fail("parameter '", v.name, "' set with ", count, " values; its shape ", to_string(v.shape), " holds ", v.size);
    if constexpr (mixed_precision) {
      std::vector<stored_type> rounded(count);
      for (std::size_t i = 0; i < count; ++i) rounded[i] = static_cast<stored_type>(values[i]);
      towers_->set_parameter(index, rounded.data());
    } else {
      towers_->set_parameter(index, values);
    }
    reducer_->set_master(index, values);
    changes_.parameters_set();
  }
  void set_optimizer_state_held(std::size_t slot, std::size_t index, const master_type* values, std::size_t count) {
    check_state_slot(slot, index);
    if (count != (*variables_)[index].size)
      fail(Optim::name, " state slot ", slot, " of '", (*variables_)[index].name, "' set with ", count, " values; it holds ",
           (*variables_)[index].size);
    reducer_->set_state(slot, index, values);
    // Each process's own record of what it set (a sharded process holds only its slice of the state).
    changes_.state_set(slot, index, values, count * sizeof(master_type));
  }
  void check_state_slot(std::size_t slot, std::size_t index) const {
    if (slot >= reducer_->state_slots())
      fail(Optim::name, " has ", reducer_->state_slots(), " state slot(s) here; slot ", slot, " requested");
    variables_->check_index(index);
  }
  static const hyper_parameters& validated(const hyper_parameters& h) {
    Optim::validate(h);
    return h;
  }
};

}  // namespace detail
}  // namespace towerpipe
