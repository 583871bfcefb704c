#pragma once
// reduce::sharded for device towers in one process: tower t's device owns slice t of the chunk table (and only that
// slice's optimizer state) and runs device0's fused pass over it; bitwise device0's (docs/guide.md, invariant 2).
// Across processes: reduce/sharded/device_towers_across_processes.hpp (reducer_for below picks at run time).
// Why: docs/design-notes.md#reduce-sharded-device_towers

#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/plan/owner_slices.hpp"
#include "towerpipe/wiring/owner_wiring.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/device_state.hpp"
#include "towerpipe/reduce/common/one_of.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/reduce/sharded/device_owner.hpp"
#include "towerpipe/reduce/sharded/device_towers_across_processes.hpp"
#include "towerpipe/reduce/sharded/host_towers.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Executor, class Policy = multi_tensor_policy>
class sharded_device_reducer {
 public:
  using towers_type = device_towers<Layout, Executor>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' gradients and replicas
  using master_type = typename precision<Layout>::master_type;  // master, state, average, weights
  static constexpr bool mixed = precision<Layout>::mixed;
  static constexpr reducer_capabilities capabilities{false, true};

  explicit sharded_device_reducer(const reducer_setup<towers_type, Optim>& setup)
      : exec_(setup.towers.executor()),
        towers_(setup.towers),
        slots_(Optim::state_slots(setup.hyper)),
        variables_(setup.variables),
        master_mirror_(variables_if(mixed, setup.variables)) {
    towers_type& towers = setup.towers;
    const std::size_t n = towers.towers();
    check_device_tower_count("reduce::sharded", n);
    const std::vector<tensor_chunk> table = make_chunk_table(setup.variables, Policy::chunk_elements);
    const owner_keeps keeps{takes_checked_steps(setup.options, mixed), mixed};
    std::vector<owner_slice> slices = cut_into_slices(table, n);
    for (std::size_t k = 0; k < n; ++k) {
      if (!slices[k].empty()) owners_.push_back(std::make_unique<owner>(exec_, setup.variables, table, std::move(slices[k]), k, towers, slots_, keeps));
    }
    for (const auto& o : owners_) {
      for (std::size_t t = 0; t < n; ++t) reaches_every_tower_ = reaches_every_tower_ && !o->copies.copied(t);
    }
  }

  backend_choice choice() const { return named_by_type("sharded"); }
  // Off where an owner copies its slice of some tower's buffers (no peer access): the copies are of the
  // whole slice, after the towers.
  bool buckets_during_towers() const { return reaches_every_tower_; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (!work_.checked) return;
    for (auto& o : owners_) {
      const typename Executor::device_guard on(exec_, o->device());
      o->screen().reset(o->owner_stream());
    }
  }
  // Each owner's pass over the part's chunks in its slice, on the owner's stream after the part's
  // gradients: a checked step's slice of the average and its screen (16-bit gradients widened), or the
  // fused pass, which writes the new slice into every replica.
  void reduce_part(towers_type& towers, const step_part& part) {
    const typename Executor::range range(exec_, "towerpipe reduce::sharded part");
    for (auto& o : owners_) {
      const typename Executor::device_guard on(exec_, o->device());
      o->wait_for_part(towers, part, o->copies.gradients_in());
      if (work_.checked) {
        for (const chunk_group& tiles : o->tile_runs.runs(part.variables))
          launch_tower_screen(o->screen(), o->owner_stream(), static_cast<int>(towers.towers()), o->gradients.const_view(), work_.weights,
                              o->average().view(), work_.window, tiles);
      } else if constexpr (!mixed) {
        if (!part.during_towers()) run_copies_async(exec_, o->copies.master_in(), o->owner_stream());
        for (const chunk_group& run : o->chunk_runs.runs(part.variables))
          launch_fused_apply<Policy, Optim, master_type>(o->chunks(), o->owner_stream(), static_cast<int>(towers.towers()),
                                                         o->gradients.const_view(), work_.weights, apply_for(*o, towers), run);
        if (!part.during_towers()) run_copies_async(exec_, o->copies.replicas_out(), o->owner_stream());
      }
    }
  }
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    if (!work_.checked) {
      order_towers_after_owners(towers);
      stages.reduce = wait_for_owners(towers, "sharded average + apply + broadcast");
      return {};
    }
    for (auto& o : owners_) {
      const typename Executor::device_guard on(exec_, o->device());
      o->screen().read_key(o->owner_stream());  // also when no tile was launched
      exec_.record(o->end(), o->owner_stream());
    }
    // The towers may write their gradients again once every owner has read them.
    stages.reduce = wait_for_owners(towers, "sharded average + screen");
    screen_partials partials;
    for (auto& o : owners_) {
      const screen_partials mine = o->screen().results();
      partials.tile_sums.insert(partials.tile_sums.end(), mine.tile_sums.begin(), mine.tile_sums.end());
      partials.first_nonfinite = std::min(partials.first_nonfinite, mine.first_nonfinite);
    }
    return partials;
  }
  // Pass 2: the optimizer on scale * each owner's slice of the average, the new slices into every replica
  // (with mixed precision: into the owner's master slice, and rounded into every replica).
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::sharded apply");
    for (auto& o : owners_) {
      const typename Executor::device_guard on(exec_, o->device());
      exec_.record(o->start(), o->owner_stream());
      if (!mixed) run_copies_async(exec_, o->copies.master_in(), o->owner_stream());  // mixed: the owner's master slice is its own
      launch_fused_apply_for<Policy, 1>(o->chunks(), o->owner_stream(), 1, o->average().const_view(), std::vector<master_type>{scale},
                                        apply_for(*o, towers));
      run_copies_async(exec_, o->copies.replicas_out(), o->owner_stream());
    }
    order_towers_after_owners(towers);
    stages.reduce += wait_for_owners(towers, "sharded apply + broadcast");
  }
  // After a failed step: the passes enqueued on the owners' streams done, and the towers' next work after them.
  void abandon(towers_type& towers) {
    order_towers_after_owners(towers);
    for (auto& o : owners_) exec_.synchronize(o->end());
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }
  // Between steps: the slot's values of one variable, gathered from the owners that hold parts of it.
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) {
    // The slot's own copy, made when first read (views of two slots coexist; nothing is held for programs
    // that never read the state).
    const tensor_view<master_type> target = host_mirrors_.try_emplace(slot, variables_).first->second.view(index);
    for (const auto& o : owners_) o->state_to_host(slot, index, target.data());
    return target;
  }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    for (auto& o : owners_) o->set_state(slot, index, values);
  }
  // Mixed precision: every owner's part of the master (without, the master is tower 0's replica, which
  // the towers set). Between steps.
  void set_master(std::size_t index, const master_type* values) {
    if constexpr (mixed) {
      for (auto& o : owners_) o->set_master(index, values);
    }
  }
  tensor_view<const master_type> master(std::size_t index) {
    if constexpr (!mixed) {
      return towers_.parameter_on_host(index);
    } else {
      const tensor_view<master_type> target = master_mirror_.view(index);
      for (const auto& o : owners_) o->master_to_host(index, target.data());
      return target;
    }
  }
  // Bytes of optimizer state on each tower's device: the owner's slice of every slot.
  std::vector<std::size_t> state_bytes_per_tower() const {
    std::vector<std::size_t> bytes(towers_.towers(), 0);
    for (const auto& o : owners_) bytes[o->tower] = o->state_bytes();
    return bytes;
  }

 private:
  // One owner: tower `tower`'s device (device_owner: its slice, its slice of the state), and every tower's
  // buffers as its pass uses them (wiring/owner_wiring.hpp slice_copies: in place where its device
  // reaches the tower, else compact copies of the slice, copied in and out around the pass).
  struct owner : device_owner<master_type, Policy, Executor> {
    owner(const Executor& exec, const variable_set& variables, const std::vector<tensor_chunk>& table, owner_slice owned, std::size_t k,
          towers_type& towers, int slots, owner_keeps keeps)
        : device_owner<master_type, Policy, Executor>(exec, variables, std::move(owned), table, slots, keeps, towers.device(k)),
          tower(k),
          copies(this->parts().slice(), towers, k, exec.device_memory(towers.device(k))),
          gradients(this->upload(copies.gradients(), variables, "reduce::sharded: the gradients an owner reads")),
          replicas(this->upload(copies.replicas(), variables, "reduce::sharded: the replicas an owner writes")),
          chunk_runs(this->parts().chunks(), variables.count()),
          tile_runs(keeps.average ? this->screen().tiles() : std::vector<tensor_chunk>{}, variables.count()) {
      for (std::size_t t = 0; t < copies.towers(); ++t) {
        if (copies.copied(t))
          log_warning(make_message("reduce::sharded: owner ", k, " (device ", this->device(), ") does not reach tower ", t, " (device ",
                                   towers.device(t), ") directly; its slice of that tower's buffers is copied"));
      }
    }

    std::size_t tower;
    slice_copies<stored_type, device_memory_of<Executor>> copies;
    typename Executor::template pointer_table<stored_type> gradients;  // role = tower
    typename Executor::template pointer_table<stored_type> replicas;   // role = tower; without mixed precision replica 0 is the master every owner reads
    chunks_by_variable chunk_runs, tile_runs;  // where a part's variables lie in its chunks and its screen's tiles
  };

  // The owner's optimizer: its slice of the state; the master replica 0 (read, and written with every
  // replica), or with mixed precision its own master slice (read and written; every replica gets it rounded).
  optimizer_apply<Optim, master_type, stored_type> apply_for(owner& o, towers_type& towers) const {
    return {o.replicas.view(), o.state(), static_cast<int>(towers.towers()), slots_, work_.constants,
            mixed ? o.master() : pointer_table<master_type>{}};
  }

  // Every tower's next work waits for every owner's writes (and reads of its gradients).
  void order_towers_after_owners(towers_type& towers) {
    for (auto& o : owners_) {
      const typename Executor::device_guard on(exec_, o->device());
      exec_.record(o->end(), o->owner_stream());
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      for (auto& o : owners_) exec_.wait(towers.stream(t), o->end());
    }
  }

  // The host waits for every owner's end event; each owner's span goes on the timeline. Returns the
  // slowest owner's seconds.
  double wait_for_owners(towers_type& towers, const char* span_name) {
    double slowest = 0.0;
    for (auto& o : owners_) {
      exec_.synchronize(o->end());
      slowest = std::max(slowest, exec_.seconds_between(o->start(), o->end()));
      towers.device_span(o->tower, o->start(), o->end(), span_name, "reduce (GPU) owner ", o->tower);
    }
    return slowest;
  }

  const Executor& exec_;
  towers_type& towers_;
  int slots_;
  const variable_set& variables_;
  std::map<std::size_t, typename Layout::template buffer<host_memory, master_type>> host_mirrors_;  // per state slot read
  typename Layout::template buffer<host_memory, master_type> master_mirror_;  // mixed precision
  std::vector<std::unique_ptr<owner>> owners_;  // one per tower with a non-empty slice
  bool reaches_every_tower_ = true;             // no owner copies a tower's slice (buckets_during_towers)
  step_work<master_type, Optim> work_;
};

// Device towers over the towers' devices in this process, or, given a process group (even of one
// process), across its processes.
template <class Optim, class Layout, class Executor>
using sharded_device_towers_reducer = one_of<sharded_device_reducer<Optim, Layout, Executor>, sharded_process_reducer<Optim, Layout, Executor>>;

template <class Optim, class Layout, class Executor>
struct sharded_device_towers_choice : sharded_device_towers_reducer<Optim, Layout, Executor> {
  explicit sharded_device_towers_choice(const reducer_setup<device_towers<Layout, Executor>, Optim>& setup)
      : sharded_device_towers_reducer<Optim, Layout, Executor>(
            setup.options.processes ? sharded_device_towers_reducer<Optim, Layout, Executor>::template make<1>(setup)
                                    : sharded_device_towers_reducer<Optim, Layout, Executor>::template make<0>(setup)) {}
};

}  // namespace detail

template <class Optim, class Layout, class Executor>
struct reducer_for<exec::on_devices<Executor>, reduce::sharded, Optim, Layout> {
  using type = detail::sharded_device_towers_choice<Optim, Layout, Executor>;
};

}  // namespace towerpipe
