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
#include <deque>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/thread_pool.hpp"
#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/exec/tower_failures.hpp"
#include "towerpipe/layout/batch.hpp"
#include "towerpipe/pipeline_options.hpp"
#include "towerpipe/split.hpp"

namespace towerpipe {

template <class Layout>
class host_towers;

// A host tower's view of the step (exec/tower_context.hpp); everything lives in host memory.
template <class Layout>
class host_tower_context
    : public tower_context_base<typename Layout::template buffer<host_memory>, typename Layout::value_type> {
  using base = tower_context_base<typename Layout::template buffer<host_memory>, typename Layout::value_type>;

 public:
  using value_type = typename Layout::value_type;

  void write_gradient(std::size_t index, const value_type* values, std::size_t count) {
    std::copy(values, values + count, this->gradient_destination(index, count));
  }
  void write_gradient(const std::string& name, const value_type* values, std::size_t count) {
    write_gradient(this->variables().index_of(name), values, count);
  }

 private:
  friend class host_towers<Layout>;
  using base::base;
};

namespace detail {
inline std::size_t host_thread_count(std::size_t towers, const pipeline_options& options) {
  return options.host_threads != 0 ? options.host_threads
                                   : std::max<std::size_t>(towers, std::thread::hardware_concurrency());
}
}  // namespace detail

// The towers of exec::host: a thread pool, the shared parameters and one gradient buffer per tower.
template <class Layout>
class host_towers {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;
  using context = host_tower_context<Layout>;

  host_towers(const variable_set& variables, std::size_t towers, const pipeline_options& options)
      : pool_(detail::host_thread_count(towers, options)),
        trace_(options.trace),
        parameters_(variables),
        written_(towers, std::vector<char>(variables.count(), 0)) {
    gradients_.reserve(towers);
    for (std::size_t i = 0; i < towers; ++i) gradients_.emplace_back(variables);
  }

  std::size_t towers() const { return gradients_.size(); }
  const buffer& gradients(std::size_t tower) const { return gradients_[tower]; }
  detail::thread_pool& pool() { return pool_; }

  // The parameters every tower reads; the host reduction writes them between steps.
  buffer& shared_parameters() { return parameters_; }
  tensor_view<const value_type> parameter_on_host(std::size_t index) { return parameters_.view(index); }
  void set_parameter(std::size_t index, const value_type* values) {
    std::copy(values, values + parameters_.view(index).size(), parameters_.data(index));
  }

  // Keeps the batch's shards for a later run(); host towers read the caller's memory in place, so it
  // must stay valid until that step.
  void stage(const towerpipe::batch& whole, const std::vector<shard>& shards) {
    std::vector<towerpipe::batch> parts;
    for (const shard& s : shards) parts.push_back(whole.slice(s.first, s.examples));
    staged_.push_back({std::move(parts), shards});
  }
  std::size_t staged() const { return staged_.size(); }
  void record_device_spans(std::int64_t) const {}  // host towers have no device
  const std::vector<shard>& next_shards() const { return staged_.front().shard_weights; }

  // Runs fn(context&) for every tower on the oldest staged batch (which it consumes, whatever the
  // outcome) and returns each tower's loss. After all towers have ended, throws if any threw or left a
  // gradient unwritten; the message names the tower and the variable.
  template <class TowerFn>
  std::vector<double> run(TowerFn& fn, std::int64_t step) {
    const staged_batch current = std::move(staged_.front());
    staged_.pop_front();
    std::vector<double> losses(towers());
    for (std::vector<char>& flags : written_) std::fill(flags.begin(), flags.end(), 0);
    std::vector<std::exception_ptr> failures = pool_.run(towers(), [&](std::size_t tower) {
      context ctx(tower, towers(), current.shards[tower], current.shard_weights[tower].weight, &parameters_,
                  &gradients_[tower], &written_[tower]);
      const auto start = timeline::clock::now();
      losses[tower] = static_cast<double>(fn(ctx));
      if (trace_ != nullptr) trace_->record(detail::make_message("tower ", tower), "compute", start, timeline::clock::now(), step);
    });
    detail::throw_tower_failures(failures, written_, parameters_.variables());
    return losses;
  }

 private:
  struct staged_batch {
    std::vector<towerpipe::batch> shards;
    std::vector<shard> shard_weights;
  };

  detail::thread_pool pool_;
  timeline* trace_;
  buffer parameters_;
  std::vector<buffer> gradients_;
  std::vector<std::vector<char>> written_;  // [tower][variable]: gradient written this step
  std::deque<staged_batch> staged_;
};

namespace exec {

// Towers as CPU threads (see the top of this header). The thread pool also runs the host reduction.
struct host {
  using policy_kind = detail::exec_policy_kind;
  static constexpr const char* name = "host";
  template <class Layout>
  using towers = host_towers<Layout>;
};

}  // namespace exec
}  // namespace towerpipe
