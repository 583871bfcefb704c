#pragma once
// exec::host — towers are CPU threads of one persistent pool; the host path is a real execution space,
// and the bitwise reference that every GPU backend must equal.
//
// Parameters: host towers read ONE shared parameter buffer instead of per-tower replicas. All towers
// live in the same memory, the parameters are only read during the tower stage and only written by the
// reduction after every tower has finished, so replicas would cost N copies of the model and a
// broadcast pass while buying nothing. Gradients: each tower owns a buffer in the pipeline's layout.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/gradient_poison.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/executor/thread_pool.hpp"
#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/data/split.hpp"
#include "towerpipe/trace/tracer.hpp"

namespace towerpipe {
namespace detail {

template <class Layout>
class host_towers;

// A host tower's view of the step (exec/tower_context.hpp has the gradient contract); everything lives
// in host memory and the tower function runs on a thread of the pool.
template <class Layout>
class host_tower_context : public tower_context_base<host_tower_context<Layout>,
                                                     typename Layout::template buffer<host_memory>,
                                                     typename Layout::value_type> {
  using base = typename host_tower_context::tower_context_base;

 public:
  using value_type = typename Layout::value_type;

 private:
  friend base;
  friend class host_towers<Layout>;
  template <class... BaseArguments>
  explicit host_tower_context(std::vector<std::uint64_t>* ready_digests, BaseArguments&&... arguments)
      : base(std::forward<BaseArguments>(arguments)...), ready_digests_(ready_digests) {}

  // poison_gradients: the gradient's bits at the mark, to find writes through older views at return.
  void note_ready(std::size_t index) {
    if (ready_digests_ == nullptr) return;
    const tensor_view<const value_type> g = this->gradients_view(index);
    (*ready_digests_)[index] = fnv1a(g.data(), g.size() * sizeof(value_type));
  }

  std::vector<std::uint64_t>* ready_digests_;

  static void fill_zero(value_type* target, std::size_t count) { std::fill(target, target + count, value_type(0)); }
  static void copy_into(value_type* target, const value_type* source, std::size_t count) {
    std::copy(source, source + count, target);
  }
};

// Threads for the tower functions and the host reduction: pipeline_options::host_threads, or by default
// the machine's cores (towers beyond that take turns; more threads would only add switching).
inline std::size_t host_thread_count(const pipeline_options& options) {
  if (options.host_threads != 0) return options.host_threads;
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

// The towers of exec::host: a thread pool, the shared parameters and one gradient buffer per tower.
// (The towers interface every execution space implements is written in exec/towers_contract.hpp.)
template <class Layout>
class host_towers {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;
  using context = host_tower_context<Layout>;

  host_towers(const variable_set& variables, std::size_t towers, const pipeline_options& options)
      : pool_(host_thread_count(options)),
        tracer_(options.trace),
        poison_(options.poison_gradients),
        parameters_(variables),
        written_(towers, std::vector<char>(variables.count(), 0)),
        ready_(towers, std::vector<char>(variables.count(), 0)),
        ready_digests_(poison_ ? towers : 0, std::vector<std::uint64_t>(variables.count(), 0)) {
    gradients_.reserve(towers);
    for (std::size_t i = 0; i < towers; ++i) gradients_.emplace_back(variables);
  }

  std::size_t towers() const { return gradients_.size(); }
  const buffer& gradients(std::size_t tower) const { return gradients_[tower]; }
  thread_pool& pool() { return pool_; }
  const tracer& trace() const { return tracer_; }

  // The parameters every tower reads; the host reduction writes them between steps.
  buffer& shared_parameters() { return parameters_; }
  tensor_view<const value_type> parameter_on_host(std::size_t index) { return parameters_.view(index); }
  void set_parameter(std::size_t index, const value_type* values) {
    std::copy(values, values + parameters_.view(index).size(), parameters_.data(index));
  }

  // Where gradient_ready marks go (the overlapped reduction), or nowhere (null).
  void set_ready_listener(tower_ready_listener* listener) { listener_ = listener; }
  // Host towers' work is done when their functions return: no events to record, nothing to finish.
  void prepare_bucket_events(std::size_t) {}
  void record_bucket_done(std::size_t, std::size_t) {}
  void finish_step(std::int64_t) {}

  // Keeps the batch's shards for a later run(); host towers read the caller's memory in place, so it
  // must stay valid until that step.
  void stage(const towerpipe::batch& whole, const std::vector<shard>& shards) {
    std::vector<towerpipe::batch> parts;
    for (const shard& s : shards) parts.push_back(whole.slice(s.first, s.examples));
    staged_.push_back({std::move(parts), shards});
  }
  std::size_t staged() const { return staged_.size(); }
  const std::vector<shard>& next_shards() const { return staged_.front().shard_weights; }
  // Drops the oldest staged batch without running it (a step refused before its towers ran).
  void discard_next() { staged_.pop_front(); }

  // Runs fn(context&) for every tower on the oldest staged batch (which it consumes, whatever the
  // outcome) and returns each tower's loss. After all towers have ended, throws if any threw or left a
  // gradient unwritten; the message names the tower and the variable.
  template <class TowerFn>
  std::vector<double> run(TowerFn& fn, std::int64_t step) {
    static_assert(std::is_invocable_v<TowerFn&, context&>,
                  "towerpipe: a tower function for exec::host is called as fn(trainer::tower_context&)");
    static_assert(std::is_convertible_v<std::invoke_result_t<TowerFn&, context&>, double>,
                  "towerpipe: a tower function for exec::host must return its shard's mean loss (a number); "
                  "returning nothing is for exec::cuda, where the loss can be left in tower.device_loss()");
    const staged_batch current = std::move(staged_.front());
    staged_.pop_front();
    std::vector<double> losses(towers());
    for (std::vector<char>& flags : written_) std::fill(flags.begin(), flags.end(), 0);
    for (std::vector<char>& flags : ready_) std::fill(flags.begin(), flags.end(), 0);
    std::vector<std::exception_ptr> failures = pool_.run(towers(), [&](std::size_t tower) {
      if (poison_) poison(gradients_[tower]);
      context ctx(poison_ ? &ready_digests_[tower] : nullptr, tower, towers(), current.shards[tower],
                  current.shard_weights[tower].weight, &parameters_, &gradients_[tower], &written_[tower], &ready_[tower],
                  listener_);
      const auto start = timeline::clock::now();
      losses[tower] = static_cast<double>(fn(ctx));
      tracer_.span("compute", start, timeline::clock::now(), step, "tower ", tower);
      if (poison_) {
        check_written(gradients_[tower], written_[tower]);
        check_unchanged_after_ready(gradients_[tower], ready_[tower], ready_digests_[tower]);
      }
      if (listener_ != nullptr) listener_->tower_returned(tower, ready_[tower]);
    });
    throw_tower_failures(failures, written_, parameters_.variables());
    return losses;
  }

 private:
  struct staged_batch {
    std::vector<towerpipe::batch> shards;
    std::vector<shard> shard_weights;
  };

  // pipeline_options::poison_gradients (core/gradient_poison.hpp has the pattern): fills every gradient.
  static void poison(buffer& gradients) {
    for (std::size_t v = 0; v < gradients.variables().count(); ++v) {
      const tensor_view<value_type> view = gradients.view(v);
      std::fill(view.begin(), view.end(), poison_value<value_type>());
    }
  }

  // Throws if a written gradient still holds the poison somewhere, naming the variable and element.
  static void check_written(const buffer& gradients, const std::vector<char>& written) {
    for (std::size_t v = 0; v < gradients.variables().count(); ++v) {
      if (!written[v]) continue;  // reported with the tower by throw_tower_failures
      const auto view = gradients.view(v);
      const std::size_t element = first_poisoned(view.data(), view.size());
      if (element != view.size()) fail_unwritten_element(gradients.variables()[v], element);
    }
  }

  // Throws if a gradient marked ready changed afterwards (written through a view taken before
  // gradient_ready), naming the variable.
  static void check_unchanged_after_ready(const buffer& gradients, const std::vector<char>& ready,
                                          const std::vector<std::uint64_t>& digests) {
    for (std::size_t v = 0; v < gradients.variables().count(); ++v) {
      if (!ready[v]) continue;
      const auto view = gradients.view(v);
      if (fnv1a(view.data(), view.size() * sizeof(value_type)) != digests[v])
        fail("the gradient of variable '", gradients.variables()[v].name, "' changed after gradient_ready('",
             gradients.variables()[v].name, "'): its bucket may have been reduced before the change");
    }
  }

  thread_pool pool_;
  tracer tracer_;
  bool poison_;
  buffer parameters_;
  std::vector<buffer> gradients_;
  std::vector<std::vector<char>> written_;  // [tower][variable]: gradient written this step
  std::vector<std::vector<char>> ready_;    // [tower][variable]: marked by gradient_ready this step
  std::vector<std::vector<std::uint64_t>> ready_digests_;  // poison_gradients: [tower][variable] bits at the mark
  tower_ready_listener* listener_ = nullptr;
  std::deque<staged_batch> staged_;
};

}  // namespace detail

namespace exec {

// Towers as CPU threads (see the top of this header). The thread pool also runs the host reduction.
struct host {
  using policy_kind = detail::exec_policy_kind;
  static constexpr const char* name = "host";
  static constexpr bool device_towers = false;
  template <class Layout>
  using towers = detail::host_towers<Layout>;
};

}  // namespace exec
}  // namespace towerpipe
