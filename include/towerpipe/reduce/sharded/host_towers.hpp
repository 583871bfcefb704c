#pragma once
// reduce::sharded for host towers, in one process or across processes (reduce/sharded/policy.hpp has the
// design): what runs when, and the exchanges between the processes. What each pass computes over the
// slices is reduce/sharded/host_slices.hpp's.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/host_pass.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/reduce/sharded/host_slices.hpp"
#include "towerpipe/reduce/sharded/policy.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout>
class sharded_host_reducer {
 public:
  using towers_type = host_towers<Layout>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' parameters and gradients
  using master_type = typename precision<Layout>::master_type;  // the master parameters, state, sums
  static constexpr bool mixed = precision<Layout>::mixed;
  static constexpr reducer_capabilities capabilities{true, false};

  // setup.span: the processes, their configuration already compared (step/processes.hpp).
  explicit sharded_host_reducer(const reducer_setup<towers_type, Optim>& setup)
      : variables_(setup.variables),
        towers_(setup.towers),
        span_(setup.span),
        checked_(takes_checked_steps(setup.options, mixed)),
        slots_(Optim::state_slots(setup.hyper)),
        buckets_(make_bucket_plan(setup.variables, setup.options.buckets, sizeof(stored_type))),  // as the step's parts cut them
        slices_(setup.variables, setup.span, buckets_, slots_, checked_),
        send_blocks_(plan().send_blocks(sizeof(master_type))),
        receive_blocks_(plan().receive_blocks(sizeof(master_type))),
        gather_blocks_(plan().gather_blocks(sizeof(master_type))) {
    for (std::size_t b = 0; b < buckets_.count(); ++b) {
      bucket_send_blocks_.push_back(plan().send_blocks(sizeof(master_type), b));
      bucket_receive_blocks_.push_back(plan().receive_blocks(sizeof(master_type), b));
    }
    if (span_.size() > 1) {  // whether every process's group may be called from the bucket worker (a collective)
      const char mine = span_.group().callable_from_any_thread() ? 1 : 0;
      const auto all = span_.group().all_gather(&mine, 1, "agreeing whether gradient buckets are exchanged during the towers");
      exchanges_buckets_ = std::all_of(all.begin(), all.end(), [](const std::string& theirs) { return theirs == "\1"; });
    }
  }

  backend_choice choice() const { return named_by_type("sharded"); }
  // Across processes only where every process's group may be called from the bucket worker (policy.hpp).
  bool buckets_during_towers() const { return span_.size() == 1 || exchanges_buckets_; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    if (work.checked && !checked_) fail("reduce::sharded: built for unchecked steps");
    work_ = work;
    forget_parts();
    raw_key_ = owner_key_ = no_nonfinite;
    std::fill(tile_sums_.begin(), tile_sums_.end(), 0.0);
  }

  // A bucket on the calling thread (the worker), what the towers left on the pool. In one process the
  // owner is here: its update and the new parameters (or its screen) follow each part at once. Across
  // processes a part is its contributions and the exchanges they complete; the rest also runs after a
  // tower failed, so that every process makes the same exchanges (reduce/common/contract.hpp).
  void reduce_part(towers_type& towers, const step_part& part) {
    if (!part.during_towers()) rest_started_ = step_clock::now();
    if (span_.size() > 1) return contribute(towers, part);
    run_part_on(towers.pool(), part, [&](auto& runner) {
      weigh(runner, towers, part);
      if (work_.checked) {
        owner_key_ = std::min(owner_key_, slices_.screen_slice(runner, slices_.mine(part.variables), work_.window, tile_sums_));
      } else if constexpr (!mixed) {
        slices_.apply_rows(runner, towers, slices_.mine(part.variables), work_.constants);
        slices_.scatter_parameters(runner, towers, slices_.every_owner(part.variables), slices_.updated());
      }
    });
  }

  // After the processes agreed on the towers: the owner's update and every slice to every process, or a
  // checked step's screen of the owner's slice, shared.
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    gathered_states_.clear();
    if (work_.checked) {
      if (span_.size() > 1) owner_key_ = slices_.screen_slice(towers.pool(), slices_.mine(), work_.window, tile_sums_);
      const screen_partials partials = span_.share_screen({tile_sums_, std::min(raw_key_, owner_key_)});
      stages.reduce = seconds_since(rest_started_);
      return partials;
    }
    if constexpr (!mixed) {
      if (span_.size() > 1) slices_.apply_rows(towers.pool(), towers, slices_.mine(), work_.constants);
    }
    finish_step(towers, stages, span_.size() > 1);
    return {};
  }

  // A checked step's second pass: the optimizer on scale * the owner's average, then the parameters gathered.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const double screened = stages.reduce;
    rest_started_ = step_clock::now();
    slices_.apply_average(towers.pool(), towers, slices_.mine(), work_.constants, scale);
    finish_step(towers, stages, true);
    stages.reduce += screened;
  }
  // Its parts ran on the calling thread or the pool: only the step's bookkeeping goes.
  void abandon(towers_type&) { forget_parts(); }

  // Mixed precision: every process keeps the whole master copy (the gather brings it every step), whose
  // rounded copy the towers see.
  tensor_view<const master_type> master(std::size_t index) {
    if constexpr (mixed) return tensor_view<const master_type>(slices_.master() + slices_.padded_start(index), variables_[index].shape);
    else return towers_.parameter_on_host(index);
  }
  void set_master(std::size_t index, const master_type* values) {
    if constexpr (mixed) std::copy(values, values + variables_[index].size, slices_.master() + slices_.padded_start(index));
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }
  // Collective (policy.hpp): gathers the slot's slices, once per slot between steps, into the slot's own
  // copy (views of two slots coexist).
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) {
    const auto [gathered, fresh] = gathered_states_.try_emplace(slot);
    if (fresh) {
      gathered->second.resize(plan().total());
      gather(slices_.slot_base(slot), gathered->second.data(), "gathering optimizer state");
    }
    return tensor_view<const master_type>(gathered->second.data() + slices_.padded_start(index), variables_[index].shape);
  }
  // This process's part of the values (no communication).
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    gathered_states_.clear();
    plan().mine().for_each_stored_range_of(index, [&](const element_range& range, std::size_t offset) {
      std::copy(values + range.begin, values + range.end, slices_.slot_base(slot) + offset);
    });
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return std::vector<std::size_t>(span_.local_towers(), 0); }  // host memory

 private:
  const exchange_plan& plan() const { return slices_.plan(); }

  // A part's contributions (run_part_on), and, in a checked step, the first non-finite one.
  template <class Runner>
  void weigh(Runner& runner, towers_type& towers, const step_part& part) {
    raw_key_ = std::min(raw_key_, slices_.weigh_contributions(runner, towers, slices_.every_owner(part.variables), work_.weights, work_.checked));
  }

  // Across processes, a part's contributions and what can be exchanged then (policy.hpp): a bucket's on
  // the calling thread (the worker), then the buckets in order as far as they are in; what the towers
  // left on the pool, then every exchange not made yet — also when a contribution failed, whose error
  // follows the exchanges.
  void contribute(towers_type& towers, const step_part& part) {
    std::exception_ptr failure;
    try {
      run_part_on(towers.pool(), part, [&](auto& runner) { weigh(runner, towers, part); });
    } catch (...) {
      if (part.during_towers()) throw;
      failure = std::current_exception();
    }
    if (part.during_towers()) {
      contributed_[part.bucket] = 1;
      while (exchanged_ < buckets_.count() && contributed_[exchanged_]) exchange_bucket(exchanged_++);
      return;
    }
    if (work_.parts_during_towers) {
      while (exchanged_ < buckets_.count()) exchange_bucket(exchanged_++);
    } else {
      exchange(send_blocks_, receive_blocks_, "sending gradients to their owners");
    }
    if (failure) std::rethrow_exception(failure);
  }
  // A bucket's rows to their owners.
  void exchange_bucket(std::size_t bucket) {
    exchange(bucket_send_blocks_[bucket], bucket_receive_blocks_[bucket], "sending a gradient bucket to its owners");
  }
  // The send buffer's rows (`send`'s pieces) to their owners (several processes; one reads them where they are).
  void exchange(const exchange_plan::blocks& send, const exchange_plan::blocks& receive, const char* what) {
    span_.group().all_to_all(reinterpret_cast<const char*>(slices_.send()), send.offsets, send.bytes,
                             reinterpret_cast<char*>(slices_.received()), receive.offsets, receive.bytes, what);
  }
  // A new step's parts: no bucket contributed or exchanged yet.
  void forget_parts() {
    std::fill(contributed_.begin(), contributed_.end(), 0);
    exchanged_ = 0;
  }

  // After the owners' updates: every slice to every process (the master copy, with mixed precision), into
  // the towers' parameters. `scatter`: whether the new parameters still go to the towers (an unchecked
  // step in one process has put each part's there already). stages.reduce from the rest's start.
  void finish_step(towers_type& towers, stage_seconds& stages, bool scatter) {
    gathered_states_.clear();
    const auto reduced = step_clock::now();
    master_type* all = mixed ? slices_.master() : span_.size() > 1 ? slices_.gathered() : slices_.updated();
    if (all != slices_.updated()) gather(slices_.updated(), all, "gathering parameters");
    if (scatter) slices_.scatter_parameters(towers.pool(), towers, slices_.every_owner(), all);
    stages.reduce = std::chrono::duration<double>(reduced - rest_started_).count();
    stages.broadcast = seconds_since(reduced);
  }
  // Every process's slice (this process's: `slice`, in compact storage) into `all`, the variables end to
  // end, each padded (padded_flat_starts).
  void gather(const master_type* slice, master_type* all, const char* what) {
    span_.group().all_gather_blocks(reinterpret_cast<const char*>(slice), reinterpret_cast<char*>(all), gather_blocks_.offsets,
                                    gather_blocks_.bytes, what);
  }

  const variable_set& variables_;
  towers_type& towers_;
  const processes& span_;
  bool checked_;  // built for checked steps
  int slots_;     // optimizer state slots
  bucket_plan buckets_;  // the gradient buckets
  sharded_host_slices<Optim, Layout> slices_;
  exchange_plan::blocks send_blocks_, receive_blocks_, gather_blocks_;
  std::vector<exchange_plan::blocks> bucket_send_blocks_, bucket_receive_blocks_;  // per bucket
  std::map<std::size_t, std::vector<master_type>> gathered_states_;  // per state slot read since the last step or set
  // A checked step's screen as its parts go: the first non-finite raw gradient and average, and the
  // owner's tiles' sums of squares (a chunk of the table is a tile).
  nonfinite_key raw_key_ = no_nonfinite, owner_key_ = no_nonfinite;
  std::vector<double> tile_sums_ = std::vector<double>(slices_.tiles(), 0.0);
  // Across processes, this step's buckets: which are in the send buffer, how many (in order) exchanged;
  // whether buckets are exchanged while the towers run at all.
  std::vector<char> contributed_ = std::vector<char>(buckets_.count(), 0);
  std::size_t exchanged_ = 0;
  bool exchanges_buckets_ = false;
  step_work<master_type, Optim> work_;
  step_clock::time_point rest_started_;
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::sharded, Optim, Layout> {
  using type = detail::sharded_host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
