#pragma once
// reduce::sharded for GPU towers across processes (pipeline_options::processes): each process runs L
// GPU towers and owns one slice of the chunk table (programs/exchange_plan.hpp), with that slice's
// optimizer state on its towers' first device (1/R of it). Global tower index = rank-major. A step, on
// the device of the process's tower 0:
//   1. contributions (programs/process_agents.hpp): for every owner, this process's canonical partial of
//      w_t * g_t over its towers (L a power of two: a subtree of the global tree) or each tower's
//      w_t * g_t (other L: L times the bytes), into the send buffer;
//   2. the all-to-all: every owner gets every process's contributions to its slice;
//   3. the owner's pass: the canonical sum over the R (or R * L) rows, the optimizer with its state and
//      its slice of the parameters (a master copy of its own, which set_parameter keeps current: the
//      pipeline tells the reducer, parameter_set);
//   4. the gather: every process gets every slice, then copies the whole into each of its towers'
//      replicas.
// The element programs are those of one process, element for element, so the parameters are bitwise
// those of one process with all R * L towers (README.md, invariant 2), whatever the transport.
//
// The transport is the group's: a group that moves device memory itself (comm/nccl.cuh) keeps the
// exchange on the devices; any other (comm/mpi.hpp) is staged through pinned host memory
// (comm/device_collectives.cuh). Checked steps: the senders screen their raw gradients (under global
// tower indices), the owners screen their slice of the average and the tiles' sums are shared as for
// host towers (reduce/sharded/host_towers.hpp). Local towers whose devices tower 0's cannot address (no peer access,
// or pipeline_options::direct_device_access off) have their gradients copied in and their parameters
// copied out (cudaMemcpyPeerAsync), with a one-time warning through the log sink.

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/cuda/buffer_copy.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/comm/device_collectives.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/exchange_plan.hpp"
#include "towerpipe/programs/process_agents.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

// What reduce::sharded for GPU towers takes, in one process or several.
template <class T, class Policy>
constexpr bool check_sharded_gpu_types() {
  static_assert(std::is_same<T, master_type_t<T>>::value,
                "towerpipe: reduce::sharded with 16-bit GPU towers (mixed precision) is not supported yet; use reduce::device0");
  static_assert(Policy::chunk_elements % screen_tile_elements == 0,
                "towerpipe: reduce::sharded needs chunks of whole screen tiles, so that each tile has one owner");
  return true;
}

// A checked step's slice of the average (or running sum, with accumulation) and the screen of its tiles,
// on the owner's device; `chunks`: the slice's.
template <class T, class Policy>
struct sharded_checked_buffers {
  sharded_checked_buffers(const variable_set& variables, const owner_slice& slice, const std::vector<tensor_chunk>& chunks, int device)
      : storage(cuda_device_memory{device}.allocate<T>(slice.stored_elements, 256)),
        table(vector_pointer_table<Policy>(slice_pointers(slice, storage.get(), variables.count()), static_cast<int>(variables.count()),
                                           chunks, device, "reduce::sharded: a slice of the checked average")),
        screen(make_chunk_table(slice.ranges, screen_tile_elements), device) {}
  cuda_device_memory::owner<T> storage;
  device_pointer_table<T> table;  // role 0: the average, indexed as a whole variable
  device_screen screen;
};

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class sharded_process_reducer {
 public:
  using T = typename Layout::value_type;
  using hyper_parameters = typename Optim::hyper_parameters;
  using constants_type = typename Optim::template step_constants<T>;
  using device_buffer = typename cuda_towers<Layout>::device_buffer;
  static_assert(check_sharded_gpu_types<T, Policy>());

  // `span`: the processes, their configuration already compared (step/processes.hpp).
  sharded_process_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                          const pipeline_options& options, const processes& span)
      : variables_(variables),
        span_(span),
        device_(towers.device(0)),
        stream_(device_),
        start_(device_, true),
        end_(device_, true),
        table_(make_chunk_table(variables, Policy::chunk_elements)),
        plan_(table_, variables.count(), span.size(), span.rank(), is_power_of_two(towers.towers()) ? 1 : towers.towers()),
        slots_(Optim::state_slots(h)),
        my_chunk_list_(plan_.mine().chunk_list(table_)),
        all_chunks_(table_, device_),
        my_chunks_(my_chunk_list_, device_),
        padded_starts_(padded_flat_starts(variables)),
        send_(allocate(plan_.send_elements())),
        received_(allocate(plan_.receive_elements())),
        updated_(allocate(plan_.mine().stored_elements)),
        gathered_(allocate(plan_.total())),
        state_storage_(allocate(static_cast<std::size_t>(slots_) * plan_.mine().stored_elements)),  // zeros
        staged_gradients_(stage_where_needed(towers)),
        gradients_(gradient_pointers(towers), count(), device_),
        replicas_(direct_replica_pointers(towers), count(), device_),
        master_(vector_pointer_table<Policy>(slice_pointers(plan_.mine(), updated_.get(), variables.count()), count(), my_chunk_list_,
                                             device_, "reduce::sharded: this process's master slice")),
        state_(vector_pointer_table<Policy>(
            slice_row_pointers(plan_.mine(), state_storage_.get(), static_cast<std::size_t>(slots_), variables.count()), count(),
            my_chunk_list_, device_, "reduce::sharded: this process's slice of the optimizer state")),
        send_blocks_(plan_.send_blocks(sizeof(T))),
        receive_blocks_(plan_.receive_blocks(sizeof(T))),
        gather_blocks_(plan_.gather_blocks(sizeof(T))),
        received_rows_(vector_pointer_table<Policy>(plan_.received_row_pointers(received_.get()), count(), my_chunk_list_, device_,
                                                    "reduce::sharded: the rows this process receives")),
        gathered_flat_(vector_pointer_table<Policy>(padded_flat_pointers(gathered_.get(), variables), count(), table_, device_,
                                                    "reduce::sharded: the gathered parameters")),
        host_slice_(plan_.mine().stored_elements),
        host_state_(plan_.total()) {
    check_device_tower_count("reduce::sharded", towers.towers());
    for (int owner = 0; owner < plan_.processes(); ++owner) {
      if (plan_.slice(owner).empty()) continue;
      sends_.push_back(std::make_unique<send_rows>(plan_.slice(owner).chunk_list(table_),
                                                   plan_.send_row_pointers(owner, send_.get()), count(), device_));
    }
    if (auto* own = dynamic_cast<device_collectives*>(&span.group())) {
      if (own->device_of_buffers() >= 0 && own->device_of_buffers() != device_)
        fail("reduce::sharded over ", span.group().describe(), ": the group moves device ", own->device_of_buffers(),
             "'s memory, and this process's tower 0 is on device ", device_, " (give the group tower 0's device)");
      collectives_ = own;
    } else {
      staged_ = std::make_unique<staged_collectives>(span.group());
      collectives_ = staged_.get();
    }
    if (takes_checked_steps(options, false))
      checked_ = std::make_unique<checked_buffers>(variables, plan_.mine(), my_chunk_list_, device_);
  }

  void average_and_apply(cuda_towers<Layout>& towers, const std::vector<T>& weights, const constants_type& constants,
                         stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded across processes");
    device_guard on(device_);
    const auto start = std::chrono::steady_clock::now();
    wait_for_gradients(towers);
    send_contributions(weights, nullptr);
    if (!plan_.mine().empty())
      my_chunks_.launch<Policy>(rows_apply_agent<Optim, T>{{received_rows_.const_view(), plan_.rows()}, apply(constants)}, stream_);
    finish(towers, start, stages);
  }

  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<T>& weights, const accumulation<T>& step,
                                 stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded across processes: screen");
    device_guard on(device_);
    const auto start = std::chrono::steady_clock::now();
    checked_buffers& checked = checked_step();
    wait_for_gradients(towers);
    checked.screen.reset(stream_);
    send_contributions(weights, checked.screen.first_nonfinite());
    const accumulating_source<rows_sum_source<T>, T> source{{received_rows_.const_view(), plan_.rows()}, checked.table.view(), step};
    checked.screen.launch(source, checked.table.view(), stream_);
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    const screen_partials all = span_.share_screen(checked.screen.results());
    stages.reduce = seconds_since(start);
    return all;
  }

  void apply_averaged(cuda_towers<Layout>& towers, T scale, const constants_type& constants, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded across processes: apply");
    device_guard on(device_);
    const double screened = stages.reduce;
    const auto start = std::chrono::steady_clock::now();
    start_.record(stream_);
    if (!plan_.mine().empty())
      launch_fused_apply_for<Policy, 1>(my_chunks_, stream_, 1, checked_step().table.const_view(), std::vector<T>{scale},
                                        apply(constants));
    finish(towers, start, stages);
    stages.reduce += screened;
  }

  // The master copy of this process's slice follows the towers' parameters.
  void parameter_set(std::size_t index, const T* values) {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    for_my_part(index, [&](std::size_t offset, const element_range& r) {
      copy_to_device_now(updated_.get() + offset, values + r.begin, (r.end - r.begin) * sizeof(T));
    });
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(slots_); }
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    std::vector<std::size_t> bytes(towers, 0);
    bytes[0] = static_cast<std::size_t>(slots_) * plan_.mine().stored_elements * sizeof(T);
    return bytes;
  }

  // A collective, as for host towers (reduce/sharded/host_towers.hpp): every process's slice of the slot, gathered
  // once per slot between steps.
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    check_slot(slot);
    if (gathered_slot_ != static_cast<int>(slot)) {
      device_guard on(device_);
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
      TOWERPIPE_CUDA_CHECK(cudaMemcpy(host_slice_.data(), slot_base(slot), host_slice_.size() * sizeof(T), cudaMemcpyDeviceToHost));
      span_.group().all_gather_blocks(reinterpret_cast<const char*>(host_slice_.data()), reinterpret_cast<char*>(host_state_.data()),
                                      gather_blocks_.offsets, gather_blocks_.bytes, "gathering optimizer state");
      gathered_slot_ = static_cast<int>(slot);
    }
    return tensor_view<const T>(host_state_.data() + padded_starts_[index], variables_[index].shape);
  }
  // This process's part of the values (no communication).
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    check_slot(slot);
    gathered_slot_ = -1;
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    for_my_part(index, [&](std::size_t offset, const element_range& r) {
      copy_to_device_now(slot_base(slot) + offset, values + r.begin, (r.end - r.begin) * sizeof(T));
    });
  }

 private:
  // The rows this process sends one owner, over that owner's chunks.
  struct send_rows {
    send_rows(const std::vector<tensor_chunk>& chunks, const std::vector<T*>& rows, int variables, int device)
        : chunks(chunks, device),
          rows(vector_pointer_table<Policy>(rows, variables, chunks, device, "reduce::sharded: the rows sent to an owner")) {}
    device_chunk_table chunks;
    device_pointer_table<T> rows;
  };
  using checked_buffers = sharded_checked_buffers<T, Policy>;

  static bool is_power_of_two(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }
  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  int count() const { return static_cast<int>(variables_.count()); }
  cuda_device_memory::owner<T> allocate(std::size_t elements) const { return cuda_device_memory{device_}.allocate<T>(elements, 256); }
  T* slot_base(std::size_t slot) const { return state_storage_.get() + slot * plan_.mine().stored_elements; }
  void check_slot(std::size_t slot) const {
    if (slot >= static_cast<std::size_t>(slots_)) fail("reduce::sharded: state slot ", slot, " of ", slots_);
  }
  checked_buffers& checked_step() {
    if (!checked_) fail("reduce::sharded: a checked step on a pipeline built for unchecked steps");
    return *checked_;
  }

  // f(offset in the compact slice, range) for this process's ranges of variable `index`.
  template <class F>
  void for_my_part(std::size_t index, F&& f) const {
    plan_.mine().for_each_stored_range([&](const element_range& r, std::size_t offset) {
      if (r.variable == index) f(offset, r);
    });
  }

  // A whole copy of the gradients of each local tower tower 0's device cannot address; null elsewhere.
  std::vector<std::unique_ptr<device_buffer>> stage_where_needed(cuda_towers<Layout>& towers) const {
    std::vector<std::unique_ptr<device_buffer>> staged(towers.towers());
    const std::vector<char> copied = towers.access().copied_by(0);  // never tower 0
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (!copied[t]) continue;
      log_warning(make_message("reduce::sharded: device ", device_, " (tower 0) does not reach device ", towers.device(t),
                               " (tower ", t, ") directly; that tower's gradients and parameters are copied"));
      staged[t] = std::make_unique<device_buffer>(variables_, cuda_device_memory{device_});
    }
    return staged;
  }
  std::vector<T*> gradient_pointers(cuda_towers<Layout>& towers) const {
    std::vector<device_buffer*> roles;
    for (std::size_t t = 0; t < towers.towers(); ++t)
      roles.push_back(staged_gradients_[t] ? staged_gradients_[t].get() : &towers.gradients(t));
    return gather_pointers<T>(roles);
  }
  // The replicas the broadcast kernel writes: those of the towers it reaches.
  std::vector<T*> direct_replica_pointers(cuda_towers<Layout>& towers) {
    std::vector<device_buffer*> roles;
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (!staged_gradients_[t]) roles.push_back(&towers.replica(t));
    }
    direct_replicas_ = static_cast<int>(roles.size());
    std::vector<T*> pointers = gather_pointers<T>(roles);
    if (pointers.empty()) pointers.push_back(nullptr);  // a table needs one entry to allocate
    return pointers;
  }
  // The owner's optimizer reads and writes its master copy of the slice, which the gather then sends.
  optimizer_apply<Optim, T> apply(const constants_type& constants) { return {master_.view(), state_.view(), 1, slots_, constants, {}}; }

  void wait_for_gradients(cuda_towers<Layout>& towers) {
    for (std::size_t t = 0; t < towers.towers(); ++t) towers.gradients_ready(t).make_wait(stream_);
    start_.record(stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (staged_gradients_[t]) copy_buffer_async(*staged_gradients_[t], device_, towers.gradients(t), towers.device(t), stream_);
    }
  }

  // Steps 1 and 2 (see the top); first_nonfinite: where a checked step's senders note raw values.
  void send_contributions(const std::vector<T>& weights, nonfinite_key* first_nonfinite) {
    contribution_agent<T> agent{gradients_.const_view(), static_cast<int>(weights.size()), plan_.contributions() == 1, {},
                                static_cast<unsigned>(span_.global_tower(0)), {}, first_nonfinite};
    for (std::size_t t = 0; t < weights.size(); ++t) agent.weights.value[t] = weights[t];
    for (const auto& owner : sends_) {
      agent.rows = owner->rows.view();
      owner->chunks.template launch<Policy>(agent, stream_);
    }
    collectives_->all_to_all_on_device(send_.get(), send_blocks_.offsets, send_blocks_.bytes, received_.get(), receive_blocks_.offsets,
                                       receive_blocks_.bytes, stream_.get(), "sending gradients to their owners");
  }

  // Step 4, then every tower's next work waits for the new parameters.
  void finish(cuda_towers<Layout>& towers, std::chrono::steady_clock::time_point start, stage_seconds& stages) {
    gathered_slot_ = -1;
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    const auto reduced = std::chrono::steady_clock::now();
    collectives_->all_gather_blocks_on_device(updated_.get(), gathered_.get(), gather_blocks_.offsets, gather_blocks_.bytes,
                                              stream_.get(), "gathering parameters");
    if (direct_replicas_ > 0)
      all_chunks_.launch<Policy>(copy_agent<T>{gathered_flat_.const_view(), replicas_.view(), direct_replicas_}, stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (!staged_gradients_[t]) continue;
      for (std::size_t v = 0; v < variables_.count(); ++v) {
        TOWERPIPE_CUDA_CHECK(cudaMemcpyPeerAsync(towers.replica(t).data(v), towers.device(t), gathered_.get() + padded_starts_[v],
                                                 device_, variables_[v].size * sizeof(T), stream_.get()));
      }
    }
    end_.record(stream_);
    for (std::size_t t = 0; t < towers.towers(); ++t) end_.make_wait(towers.stream(t));
    end_.synchronize();
    towers.device_span(0, start_, end_, "sharded across processes", "reduce (GPU) process ", span_.rank());
    stages.reduce = std::chrono::duration<double>(reduced - start).count();
    stages.broadcast = seconds_since(reduced);
  }

  const variable_set& variables_;
  const processes& span_;
  int device_;
  cuda_stream stream_;
  cuda_event start_, end_;
  std::vector<tensor_chunk> table_;
  exchange_plan plan_;
  int slots_;
  std::vector<tensor_chunk> my_chunk_list_;  // this process's slice
  device_chunk_table all_chunks_, my_chunks_;
  std::vector<std::size_t> padded_starts_;  // where each variable lies in gathered_ and host_state_
  cuda_device_memory::owner<T> send_, received_, updated_, gathered_, state_storage_;
  std::vector<std::unique_ptr<device_buffer>> staged_gradients_;  // per local tower; null: read directly
  int direct_replicas_ = 0;                // towers the broadcast kernel writes (set by direct_replica_pointers)
  device_pointer_table<T> gradients_;      // role = local tower (or its copy)
  device_pointer_table<T> replicas_;       // role = local tower the broadcast reaches directly
  device_pointer_table<T> master_;         // role 0: this process's slice of the parameters
  device_pointer_table<T> state_;          // role = slot, indexed as whole variables
  exchange_plan::blocks send_blocks_, receive_blocks_, gather_blocks_;  // in bytes, the same every step
  device_pointer_table<T> received_rows_;  // role = global row
  device_pointer_table<T> gathered_flat_;  // role 0: every variable, end to end, padded
  std::vector<std::unique_ptr<send_rows>> sends_;  // one per owner with a non-empty slice
  device_collectives* collectives_ = nullptr;
  std::unique_ptr<staged_collectives> staged_;
  std::unique_ptr<checked_buffers> checked_;
  std::vector<T> host_slice_, host_state_;
  int gathered_slot_ = -1;  // the state slot host_state_ holds, -1: none or stale
};

}  // namespace detail
}  // namespace towerpipe
