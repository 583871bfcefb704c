#pragma once
// reduce::sharded for device towers across processes: each process owns one slice of the chunk table (plan/exchange_plan.hpp)
// and its optimizer state on its tower 0's device; bitwise one process with all R * L towers (docs/guide.md, invariant 2).
// Why: docs/design-notes.md#reduce-sharded-device_towers_across_processes

#include <cstddef>
#include <exception>
#include <map>
#include <memory>
#include <vector>

#include "towerpipe/comm/device_collectives.hpp"
#include "towerpipe/core/log.hpp"
#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"
#include "towerpipe/wiring/exchange_buffers.hpp"
#include "towerpipe/plan/exchange_plan.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/kernels/process_agents.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/device_state.hpp"
#include "towerpipe/reduce/sharded/device_owner.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Executor, class Policy = multi_tensor_policy>
class sharded_process_reducer {
 public:
  using towers_type = device_towers<Layout, Executor>;
  using stored_type = typename precision<Layout>::stored_type;  // the towers' gradients and replicas
  using master_type = typename precision<Layout>::master_type;  // contributions, exchange, master, state, average
  static constexpr bool mixed = precision<Layout>::mixed;
  using device_buffer = typename towers_type::device_buffer;
  using stream = typename Executor::stream;
  static constexpr reducer_capabilities capabilities{true, true};

  // setup.span: the processes, their configuration already compared (step/processes.hpp).
  explicit sharded_process_reducer(const reducer_setup<towers_type, Optim>& setup)
      : exec_(setup.towers.executor()),
        towers_(setup.towers),
        variables_(setup.variables),
        span_(setup.span),
        device_(setup.towers.device(0)),
        table_(make_chunk_table(setup.variables, Policy::chunk_elements)),
        plan_(table_, setup.variables.count(), span_.size(), span_.rank(), contributions_per_process(setup.towers.towers())),
        owner_(exec_, setup.variables, plan_.mine(), table_, Optim::state_slots(setup.hyper),
               owner_keeps{takes_checked_steps(setup.options, mixed), true}, device_),
        all_chunks_(exec_, table_, device_),
        padded_starts_(padded_flat_starts(setup.variables)),
        buffers_(plan_, setup.variables, exec_.device_memory(device_)),
        copies_(setup.towers, 0, exec_.device_memory(device_), false),
        gradients_(vector_pointer_table<Policy>(exec_, copies_.gradients(), count(), table_, device_,
                                                "reduce::sharded: the gradients it reads")),
        broadcast_(setup.towers, copies_, buffers_.gathered.get(), setup.variables, exec_.device_memory(device_)),
        replicas_(vector_pointer_table<Policy>(exec_, broadcast_.targets(), count(), table_, device_,
                                               "reduce::sharded: the replicas the gather writes")),
        send_blocks_(plan_.send_blocks(sizeof(master_type))),
        receive_blocks_(plan_.receive_blocks(sizeof(master_type))),
        gather_blocks_(plan_.gather_blocks(sizeof(master_type))),
        received_rows_(owner_.upload(buffers_.received_rows, setup.variables, "reduce::sharded: the rows this process receives")),
        gathered_flat_(vector_pointer_table<Policy>(exec_, buffers_.gathered_flat, count(), table_, device_,
                                                    "reduce::sharded: the gathered parameters")),
        host_slice_(plan_.mine().stored_elements),
        host_master_(mixed ? plan_.total() : 0) {
    check_device_tower_count("reduce::sharded", setup.towers.towers());
    for (std::size_t t = 0; t < setup.towers.towers(); ++t) {
      if (!copies_.copied(t)) continue;
      log_warning(make_message("reduce::sharded: device ", device_, " (tower 0) does not reach device ", setup.towers.device(t), " (tower ", t,
                               ") directly; that tower's gradients and parameters are copied"));
    }
    for (int owner = 0; owner < plan_.processes(); ++owner) {
      if (plan_.slice(owner).empty()) continue;
      sends_.push_back(std::make_unique<send_rows>(exec_, plan_.slice(owner).chunk_list(table_),
                                                   buffers_.send_rows[static_cast<std::size_t>(owner)], count(), device_));
    }
    if (auto* own = dynamic_cast<device_collectives<stream>*>(&span_.group())) {
      if (own->device_of_buffers() >= 0 && own->device_of_buffers() != device_)
        fail("reduce::sharded over ", span_.group().describe(), ": the group moves device ", own->device_of_buffers(),
             "'s memory, and this process's tower 0 is on device ", device_, " (give the group tower 0's device)");
      collectives_ = own;
    } else {
      staged_ = std::make_unique<staged_collectives<Executor>>(exec_, span_.group());
      collectives_ = staged_.get();
    }
  }

  backend_choice choice() const { return named_by_type("sharded"); }
  // Off where local towers' gradients are copied whole to tower 0's device (no peer access).
  bool buckets_during_towers() const { return copies_.reached() == static_cast<int>(copies_.towers()); }

  // Before the step's parts: a checked step's key, which the senders lower.
  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (!work_.checked) return;
    const typename Executor::device_guard on(exec_, device_);
    owner_.screen().reset(owner_.owner_stream());
  }
  // Step 1 over the part's chunks of every owner's slice, on the owner's stream after the part's
  // gradients; after the towers, step 2: the exchange — on every process, also where its towers or the
  // contributions failed, whose error then follows it.
  void reduce_part(towers_type& towers, const step_part& part) {
    const typename Executor::range range(exec_, "towerpipe reduce::sharded across processes: part");
    const typename Executor::device_guard on(exec_, device_);
    if (!part.during_towers()) rest_started_ = step_clock::now();
    std::exception_ptr failure;
    try {
      owner_.wait_for_part(towers, part, copies_.gradients_in());
      contribute(part);
    } catch (...) {
      if (part.during_towers()) throw;
      failure = std::current_exception();
    }
    if (part.during_towers()) return;
    collectives_->all_to_all_on_device(buffers_.send.get(), send_blocks_.offsets, send_blocks_.bytes, buffers_.received.get(),
                                       receive_blocks_.offsets, receive_blocks_.bytes, owner_.owner_stream(),
                                       "sending gradients to their owners");
    if (failure) std::rethrow_exception(failure);
  }
  // Once the processes agreed on the towers: the owner's screen of its slice, shared; or its pass and step 4.
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    const typename Executor::device_guard on(exec_, device_);
    if (work_.checked) {
      const auto& screen = owner_.screen();
      const auto& average = owner_.average();
      const accumulating_source<rows_sum_source<master_type>, master_type> source{
          {received_rows_.const_view(), plan_.rows()}, average.view(), work_.window};
      screen.launch(source, average.view(), owner_.owner_stream());
      exec_.synchronize(owner_.owner_stream());
      const screen_partials partials = span_.share_screen(screen.results());
      stages.reduce = seconds_since(rest_started_);
      return partials;
    }
    if constexpr (!mixed) {
      if (!plan_.mine().empty())
        owner_.chunks().template launch<Policy>(
            rows_apply_agent<Optim, master_type>{{received_rows_.const_view(), plan_.rows()}, apply()}, owner_.owner_stream());
      gather_and_broadcast(towers, stages);
    }
    return {};
  }
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::sharded across processes: apply");
    const typename Executor::device_guard on(exec_, device_);
    const double screened = stages.reduce;
    rest_started_ = step_clock::now();
    exec_.record(owner_.start(), owner_.owner_stream());
    if (!plan_.mine().empty())
      launch_fused_apply_for<Policy, 1>(owner_.chunks(), owner_.owner_stream(), 1, owner_.average().const_view(),
                                        std::vector<master_type>{scale}, apply());
    gather_and_broadcast(towers, stages);
    stages.reduce += screened;
  }
  // After a failed step: the contributions enqueued on the owner's stream done, and the towers' next
  // work after them.
  void abandon(towers_type& towers) {
    const typename Executor::device_guard on(exec_, device_);
    exec_.record(owner_.end(), owner_.owner_stream());
    for (std::size_t t = 0; t < towers.towers(); ++t) exec_.wait(towers.stream(t), owner_.end());
    exec_.synchronize(owner_.end());
  }

  // The master copy of this process's slice follows the towers' parameters; with mixed precision also the
  // whole master in the gathered buffer, which master() reads (between steps).
  void set_master(std::size_t index, const master_type* values) {
    owner_.set_master(index, values);
    if constexpr (mixed) {
      const typename Executor::device_guard on(exec_, device_);
      exec_.synchronize(owner_.owner_stream());
      exec_.copy_to_device_now(buffers_.gathered.get() + padded_starts_[index], values, variables_[index].size * sizeof(master_type));
    }
  }
  // Mixed precision: the whole master, as the last gather (or set_master) left it; no communication.
  tensor_view<const master_type> master(std::size_t index) {
    if constexpr (!mixed) {
      return towers_.parameter_on_host(index);
    } else {
      const typename Executor::device_guard on(exec_, device_);
      exec_.synchronize(owner_.owner_stream());
      master_type* target = host_master_.data() + padded_starts_[index];
      exec_.copy_to_host_now(target, buffers_.gathered.get() + padded_starts_[index], variables_[index].size * sizeof(master_type));
      return tensor_view<const master_type>(target, variables_[index].shape);
    }
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(owner_.parts().slots()); }
  std::vector<std::size_t> state_bytes_per_tower() const {
    std::vector<std::size_t> bytes(towers_.towers(), 0);
    bytes[0] = owner_.state_bytes();
    return bytes;
  }
  // A collective, as for host towers (reduce/sharded/host_towers.hpp): every process's slice of the slot,
  // gathered once per slot between steps, into the slot's own copy (views of two slots coexist).
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) {
    const auto [gathered, fresh] = gathered_states_.try_emplace(slot);
    if (fresh) {
      gathered->second.resize(plan_.total());
      owner_.slot_to_host(slot, host_slice_.data());
      span_.group().all_gather_blocks(reinterpret_cast<const char*>(host_slice_.data()), reinterpret_cast<char*>(gathered->second.data()),
                                      gather_blocks_.offsets, gather_blocks_.bytes, "gathering optimizer state");
    }
    return tensor_view<const master_type>(gathered->second.data() + padded_starts_[index], variables_[index].shape);
  }
  // This process's part of the values (no communication).
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    owner_.set_state(slot, index, values);  // checks the slot first: a refused call leaves the gathered slots valid
    gathered_states_.clear();
  }

 private:
  // The rows this process sends one owner, over that owner's chunks.
  struct send_rows {
    send_rows(const Executor& exec, const std::vector<tensor_chunk>& owned, const std::vector<master_type*>& row_pointers, int variables,
              int device)
        : chunks(exec, owned, device),
          rows(vector_pointer_table<Policy>(exec, row_pointers, variables, owned, device, "reduce::sharded: the rows sent to an owner")),
          runs(owned, static_cast<std::size_t>(variables)) {}
    typename Executor::chunk_table chunks;
    typename Executor::template pointer_table<master_type> rows;
    chunks_by_variable runs;  // where a part's variables lie in chunks
  };

  int count() const { return static_cast<int>(variables_.count()); }

  // The owner's optimizer reads and writes its master copy of the slice, which the gather then sends.
  optimizer_apply<Optim, master_type> apply() const {
    return {owner_.master(), owner_.state(), 1, owner_.parts().slots(), work_.constants, {}};
  }

  // Step 1 (see the top) over the part's chunks of every owner's slice; a checked step's senders note raw values.
  void contribute(const step_part& part) {
    nonfinite_key* first_nonfinite = work_.checked ? owner_.screen().first_nonfinite() : nullptr;
    contribution_agent<master_type, stored_type> agent{gradients_.const_view(), static_cast<int>(work_.weights.size()), plan_.contributions() == 1,
                                                       {}, static_cast<unsigned>(span_.global_tower(0)), {}, first_nonfinite};
    for (std::size_t t = 0; t < work_.weights.size(); ++t) agent.weights.value[t] = work_.weights[t];
    for (const auto& owner : sends_) {
      agent.rows = owner->rows.view();
      for (const chunk_group& run : owner->runs.runs(part.variables)) owner->chunks.template launch<Policy>(agent, owner_.owner_stream(), run);
    }
  }

  // Step 4, then every tower's next work waits for the new parameters.
  void gather_and_broadcast(towers_type& towers, stage_seconds& stages) {
    gathered_states_.clear();
    const stream& s = owner_.owner_stream();
    exec_.synchronize(s);
    const auto reduced = step_clock::now();
    collectives_->all_gather_blocks_on_device(owner_.parts().master_storage(), buffers_.gathered.get(), gather_blocks_.offsets,
                                              gather_blocks_.bytes, s, "gathering parameters");
    if (broadcast_.target_count() > 0)
      all_chunks_.template launch<Policy>(
          copy_agent<master_type, stored_type>{gathered_flat_.const_view(), replicas_.view(), broadcast_.target_count()}, s);
    run_copies_async(exec_, broadcast_.copies(), s);
    exec_.record(owner_.end(), s);
    for (std::size_t t = 0; t < towers.towers(); ++t) exec_.wait(towers.stream(t), owner_.end());
    exec_.synchronize(owner_.end());
    towers.device_span(0, owner_.start(), owner_.end(), "sharded across processes", "reduce (GPU) process ", span_.rank());
    stages.reduce = std::chrono::duration<double>(reduced - rest_started_).count();
    stages.broadcast = seconds_since(reduced);
  }

  const Executor& exec_;
  towers_type& towers_;
  const variable_set& variables_;
  const processes& span_;
  int device_;
  std::vector<tensor_chunk> table_;
  exchange_plan plan_;
  device_owner<master_type, Policy, Executor> owner_;  // this process's slice, its state, master and checked average
  typename Executor::chunk_table all_chunks_;
  std::vector<std::size_t> padded_starts_;  // where each variable lies in the gathered buffer and gathered_states_
  exchange_buffers<master_type, device_memory_of<Executor>> buffers_;  // mixed precision: the gathered buffer is the whole master
  tower_copies<device_buffer> copies_;  // the local towers tower 0's device does not reach: their gradients
  typename Executor::template pointer_table<stored_type> gradients_;  // role = local tower (or its copy)
  gathered_broadcast<stored_type, master_type, device_memory_of<Executor>> broadcast_;  // the gathered parameters into every replica
  typename Executor::template pointer_table<stored_type> replicas_;  // the copy agent's targets: broadcast_.targets()
  exchange_plan::blocks send_blocks_, receive_blocks_, gather_blocks_;  // in bytes, the same every step
  typename Executor::template pointer_table<master_type> received_rows_;  // role = global row
  typename Executor::template pointer_table<master_type> gathered_flat_;  // role 0: every variable, end to end, padded
  std::vector<std::unique_ptr<send_rows>> sends_;  // one per owner with a non-empty slice
  device_collectives<stream>* collectives_ = nullptr;
  std::unique_ptr<staged_collectives<Executor>> staged_;
  std::vector<master_type> host_slice_;
  std::vector<master_type> host_master_;  // mixed precision: master()'s copies, laid out as the gathered buffer
  std::map<std::size_t, std::vector<master_type>> gathered_states_;  // per state slot read since the last step or set
  step_work<master_type, Optim> work_;
  step_clock::time_point rest_started_;
};

}  // namespace detail
}  // namespace towerpipe
