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
#include <exception>
#include <string>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/thread_pool.hpp"
#include "towerpipe/layout/batch.hpp"
#include "towerpipe/split.hpp"

namespace towerpipe {

template <class Layout>
class host_towers;

// What a tower function sees: its shard of the batch, the parameters, and its gradient buffers, into
// which it writes the MEAN gradient over its shard. Every variable's gradient must be written each step,
// through gradient(i) (a writable view) or write_gradient(i, values, count).
template <class Layout>
class host_tower_context {
 public:
  using value_type = typename Layout::value_type;
  using buffer = typename Layout::template buffer<host_memory>;

  std::size_t tower() const { return tower_; }
  std::size_t towers() const { return towers_; }
  const towerpipe::batch& shard() const { return shard_; }
  template <class T>
  batch_view<T> input(const std::string& name) const { return shard_.input<T>(name); }
  std::size_t examples() const { return shard_.examples(); }
  double weight() const { return weight_; }  // this tower's share of the batch, b_i / B
  const variable_set& variables() const { return parameters_->variables(); }

  tensor_view<const value_type> parameter(std::size_t index) const {
    variables().check_index(index);
    return parameters_->view(index);
  }
  tensor_view<const value_type> parameter(const std::string& name) const { return parameter(variables().index_of(name)); }

  tensor_view<value_type> gradient(std::size_t index) {
    variables().check_index(index);
    written_[index] = 1;
    return gradients_->view(index);
  }
  tensor_view<value_type> gradient(const std::string& name) { return gradient(variables().index_of(name)); }

  void write_gradient(std::size_t index, const value_type* values, std::size_t count) {
    variables().check_index(index);
    const variable& v = variables()[index];
    if (count != v.size)
      detail::fail("gradient of variable '", v.name, "' written with ", count, " elements; its shape ",
                   to_string(v.shape), " holds ", v.size);
    std::copy(values, values + count, gradients_->data(index));
    written_[index] = 1;
  }
  void write_gradient(const std::string& name, const value_type* values, std::size_t count) {
    write_gradient(variables().index_of(name), values, count);
  }

 private:
  friend class host_towers<Layout>;
  host_tower_context(std::size_t tower, std::size_t towers, towerpipe::batch shard, double weight,
                     const buffer* parameters, buffer* gradients, std::vector<char>& written)
      : tower_(tower),
        towers_(towers),
        shard_(std::move(shard)),
        weight_(weight),
        parameters_(parameters),
        gradients_(gradients),
        written_(written) {}

  std::size_t tower_, towers_;
  towerpipe::batch shard_;
  double weight_;
  const buffer* parameters_;
  buffer* gradients_;
  std::vector<char>& written_;
};

// The towers of exec::host: a thread pool and one gradient buffer per tower.
template <class Layout>
class host_towers {
 public:
  using buffer = typename Layout::template buffer<host_memory>;
  using context = host_tower_context<Layout>;

  host_towers(const variable_set& variables, std::size_t towers, std::size_t threads)
      : pool_(threads), written_(towers, std::vector<char>(variables.count(), 0)) {
    gradients_.reserve(towers);
    for (std::size_t i = 0; i < towers; ++i) gradients_.emplace_back(variables);
  }

  std::size_t towers() const { return gradients_.size(); }
  const buffer& gradients(std::size_t tower) const { return gradients_[tower]; }
  detail::thread_pool& pool() { return pool_; }

  // Runs fn(context&) for every tower and returns each tower's loss. After all towers have ended, throws
  // if any threw or left a gradient unwritten; the message names the tower and the variable.
  template <class TowerFn>
  std::vector<double> run(const towerpipe::batch& whole, const std::vector<shard>& shards, const buffer& parameters,
                          TowerFn& fn) {
    std::vector<double> losses(towers());
    for (std::vector<char>& flags : written_) std::fill(flags.begin(), flags.end(), 0);
    std::vector<std::exception_ptr> failures = pool_.run(towers(), [&](std::size_t tower) {
      context ctx(tower, towers(), whole.slice(shards[tower].first, shards[tower].examples), shards[tower].weight,
                  &parameters, &gradients_[tower], written_[tower]);
      losses[tower] = static_cast<double>(fn(ctx));
    });
    throw_first_failure(failures, parameters.variables());
    return losses;
  }

 private:
  void throw_first_failure(const std::vector<std::exception_ptr>& failures, const variable_set& variables) const {
    const std::size_t failed = static_cast<std::size_t>(
        std::count_if(failures.begin(), failures.end(), [](const std::exception_ptr& e) { return e != nullptr; }));
    const std::string others =
        failed > 1 ? detail::make_message(" (", failed - 1, " more tower(s) failed too)") : std::string();
    for (std::size_t tower = 0; tower < failures.size(); ++tower) {
      if (failures[tower] == nullptr) continue;
      try {
        std::rethrow_exception(failures[tower]);
      } catch (const error& e) {
        detail::fail("tower ", tower, ": ", e.message(), others);
      } catch (const std::exception& e) {
        detail::fail("tower ", tower, " threw: ", e.what(), others);
      } catch (...) {
        detail::fail("tower ", tower, " threw an exception that is not a std::exception", others);
      }
    }
    for (std::size_t tower = 0; tower < written_.size(); ++tower) {
      for (std::size_t v = 0; v < variables.count(); ++v) {
        if (!written_[tower][v])
          detail::fail("tower ", tower, " did not write the gradient of variable '", variables[v].name, "'");
      }
    }
  }

  detail::thread_pool pool_;
  std::vector<buffer> gradients_;
  std::vector<std::vector<char>> written_;  // [tower][variable]: gradient written this step
};

namespace exec {

// Towers as CPU threads (see the top of this header). The thread pool also runs the host reduction.
struct host {
  using policy_kind = detail::exec_policy_kind;
  using memory_space = host_memory;
  static constexpr const char* name = "host";
  template <class Layout>
  using towers = host_towers<Layout>;
};

}  // namespace exec
}  // namespace towerpipe
