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
//
// Gradient buckets (reduce/overlapped_reduction.hpp): a bucket's contributions (step 1) go as soon as
// every local tower has marked it, while the towers go on; the exchange waits for the last bucket (see
// average_and_apply_part).
//
// Mixed precision (bf16/fp16 towers), as for host towers across processes (reduce/sharded/host_towers.hpp),
// so that GPU and host towers agree bitwise: every step is a checked one; the contributions are the
// widened gradients' products in fp32, the exchange and the owner's slices (master, state, average) are
// fp32; the gather brings every process the whole fp32 master (4 bytes a parameter), which master_on_host
// reads, and a narrowing copy rounds it to nearest even into each tower's replica — for the towers tower
// 0's device does not reach, into one rounded copy on that device, copied out from there
// (programs/exchange_buffers.hpp gathered_broadcast).

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/core/log.hpp"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/comm/device_collectives.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/cuda/multi_tensor_dispatch.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/peer_copies.cuh"
#include "towerpipe/cuda/screen_kernel.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/reduce/device_state.cuh"
#include "towerpipe/programs/copy_wiring.hpp"
#include "towerpipe/programs/exchange_buffers.hpp"
#include "towerpipe/programs/exchange_plan.hpp"
#include "towerpipe/programs/process_agents.hpp"
#include "towerpipe/reduce/sharded/gpu_owner.cuh"
#include "towerpipe/reduce/whole_step.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/processes.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

template <class Optim, class Layout, class Policy = multi_tensor_policy>
class sharded_process_reducer : public whole_step_as_one_part<sharded_process_reducer<Optim, Layout, Policy>> {
 public:
  using stored_type = typename Layout::value_type;  // the towers' gradients and replicas
  using T = master_type_t<stored_type>;              // contributions, exchange, master, state, average
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using constants_type = typename Optim::template step_constants<T>;
  using device_buffer = typename cuda_towers<Layout>::device_buffer;

  // `span`: the processes, their configuration already compared (step/processes.hpp).
  sharded_process_reducer(const variable_set& variables, const typename Optim::hyper_parameters& h, cuda_towers<Layout>& towers,
                          const pipeline_options& options, const processes& span)
      : whole_step_as_one_part<sharded_process_reducer>(variables.count()),
        variables_(variables),
        span_(span),
        device_(towers.device(0)),
        table_(make_chunk_table(variables, Policy::chunk_elements)),
        plan_(table_, variables.count(), span.size(), span.rank(), contributions_per_process(towers.towers())),
        owner_(variables, plan_.mine(), table_, Optim::state_slots(h), owner_keeps{takes_checked_steps(options, mixed), true}, device_),
        all_chunks_(table_, device_),
        padded_starts_(padded_flat_starts(variables)),
        buffers_(plan_, variables, cuda_device_memory{device_}),
        copies_(towers, 0, cuda_device_memory{device_}, false),
        gradients_(vector_pointer_table<Policy>(copies_.gradients(), count(), table_, device_, "reduce::sharded: the gradients it reads")),
        broadcast_(towers, copies_, buffers_.gathered.get(), variables, cuda_device_memory{device_}),
        replicas_(vector_pointer_table<Policy>(broadcast_.targets(), count(), table_, device_,
                                               "reduce::sharded: the replicas the gather writes")),
        send_blocks_(plan_.send_blocks(sizeof(T))),
        receive_blocks_(plan_.receive_blocks(sizeof(T))),
        gather_blocks_(plan_.gather_blocks(sizeof(T))),
        received_rows_(owner_.upload(buffers_.received_rows, variables, "reduce::sharded: the rows this process receives")),
        gathered_flat_(vector_pointer_table<Policy>(buffers_.gathered_flat, count(), table_, device_,
                                                    "reduce::sharded: the gathered parameters")),
        host_slice_(plan_.mine().stored_elements),
        host_state_(plan_.total()),
        host_master_(mixed ? plan_.total() : 0) {
    check_device_tower_count("reduce::sharded", towers.towers());
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (!copies_.copied(t)) continue;
      log_warning(make_message("reduce::sharded: device ", device_, " (tower 0) does not reach device ", towers.device(t),
                               " (tower ", t, ") directly; that tower's gradients and parameters are copied"));
    }
    for (int owner = 0; owner < plan_.processes(); ++owner) {
      if (plan_.slice(owner).empty()) continue;
      sends_.push_back(std::make_unique<send_rows>(plan_.slice(owner).chunk_list(table_),
                                                   buffers_.send_rows[static_cast<std::size_t>(owner)], count(), device_));
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
  }

  // Gradient buckets (reduce/overlapped_reduction.hpp): a bucket's contributions (step 1) over its
  // chunks, on the owner's stream after the bucket's event on every local tower, while the towers go on.
  // The exchange and everything after it wait for the last bucket: the all-to-all moves every owner's
  // rows at once (its blocks are fixed per step), and the owners' passes need every process's rows.
  // Off where local towers' gradients are copied whole to tower 0's device (no peer access).
  bool overlaps_buckets() const { return copies_.reached() == static_cast<int>(copies_.towers()); }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                              const constants_type& constants, stage_seconds& stages) {
    if constexpr (mixed) {
      fail("reduce::sharded: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    } else {
      const nvtx_range range("towerpipe reduce::sharded across processes: part");
      device_guard on(device_);
      const auto start = std::chrono::steady_clock::now();
      wait_for_part(towers, part);
      contribute(part, weights, nullptr);
      if (part.during_towers()) return;
      exchange();
      if (!plan_.mine().empty())
        owner_.chunks().template launch<Policy>(rows_apply_agent<Optim, T>{{received_rows_.const_view(), plan_.rows()}, apply(constants)},
                                                owner_.stream());
      finish(towers, start, stages);
    }
  }
  // After a failed step: the contributions enqueued on the owner's stream done, and the towers' next
  // work after them.
  void join_parts(cuda_towers<Layout>& towers) {
    device_guard on(device_);
    owner_.end().record(owner_.stream());
    for (std::size_t t = 0; t < towers.towers(); ++t) owner_.end().make_wait(towers.stream(t));
    owner_.end().synchronize();
  }
  // Before a checked step's parts: the key the senders lower.
  screen_partials begin_screen() {
    device_guard on(device_);
    owner_.screen().reset(owner_.stream());
    return {};
  }
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights, const accumulation<T>& step,
                   screen_partials& partials, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded across processes: screen part");
    device_guard on(device_);
    const auto start = std::chrono::steady_clock::now();
    const device_screen& screen = owner_.screen();
    wait_for_part(towers, part);
    contribute(part, weights, screen.first_nonfinite());
    if (part.during_towers()) return;
    exchange();
    const device_pointer_table<T>& average = owner_.average();
    const accumulating_source<rows_sum_source<T>, T> source{
        {received_rows_.const_view(), plan_.rows()}, average.view(), step};
    screen.launch(source, average.view(), owner_.stream());
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(owner_.stream().get()));
    partials = span_.share_screen(screen.results());
    stages.reduce = seconds_since(start);
  }

  void apply_averaged(cuda_towers<Layout>& towers, T scale, const constants_type& constants, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::sharded across processes: apply");
    device_guard on(device_);
    const double screened = stages.reduce;
    const auto start = std::chrono::steady_clock::now();
    owner_.start().record(owner_.stream());
    if (!plan_.mine().empty())
      launch_fused_apply_for<Policy, 1>(owner_.chunks(), owner_.stream(), 1, owner_.average().const_view(),
                                        std::vector<T>{scale}, apply(constants));
    finish(towers, start, stages);
    stages.reduce += screened;
  }

  // The master copy of this process's slice follows the towers' parameters; with mixed precision also the
  // whole fp32 master in the gathered buffer, which master_on_host reads (between steps).
  void parameter_set(std::size_t index, const T* values) {
    owner_.set_master(index, values);
    if constexpr (mixed) {
      device_guard on(device_);
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(owner_.stream().get()));
      copy_to_device_now(buffers_.gathered.get() + padded_starts_[index], values, variables_[index].size * sizeof(T));
    }
  }
  // Mixed precision: the whole fp32 master, as the last gather (or parameter_set) left it; no communication.
  tensor_view<const T> master_on_host(std::size_t index) {
    if (!mixed) fail("reduce::sharded: the master copy is the towers' parameters (no mixed precision)");
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(owner_.stream().get()));
    T* target = host_master_.data() + padded_starts_[index];
    TOWERPIPE_CUDA_CHECK(cudaMemcpy(target, buffers_.gathered.get() + padded_starts_[index], variables_[index].size * sizeof(T),
                                    cudaMemcpyDeviceToHost));
    return tensor_view<const T>(target, variables_[index].shape);
  }

  std::size_t state_slots() const { return static_cast<std::size_t>(owner_.slots()); }
  std::vector<std::size_t> state_bytes_per_tower(std::size_t towers) const {
    std::vector<std::size_t> bytes(towers, 0);
    bytes[0] = owner_.state_bytes();
    return bytes;
  }

  // A collective, as for host towers (reduce/sharded/host_towers.hpp): every process's slice of the slot, gathered
  // once per slot between steps.
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) {
    if (gathered_slot_ != static_cast<int>(slot)) {
      owner_.slot_to_host(slot, host_slice_.data());
      span_.group().all_gather_blocks(reinterpret_cast<const char*>(host_slice_.data()), reinterpret_cast<char*>(host_state_.data()),
                                      gather_blocks_.offsets, gather_blocks_.bytes, "gathering optimizer state");
      gathered_slot_ = static_cast<int>(slot);
    }
    return tensor_view<const T>(host_state_.data() + padded_starts_[index], variables_[index].shape);
  }
  // This process's part of the values (no communication).
  void set_state(std::size_t slot, std::size_t index, const T* values) {
    owner_.set_state(slot, index, values);  // checks the slot first: a refused call leaves the gathered slot valid
    gathered_slot_ = -1;
  }

 private:
  // The rows this process sends one owner, over that owner's chunks.
  struct send_rows {
    send_rows(const std::vector<tensor_chunk>& chunks, const std::vector<T*>& rows, int variables, int device)
        : chunks(chunks, device),
          rows(vector_pointer_table<Policy>(rows, variables, chunks, device, "reduce::sharded: the rows sent to an owner")),
          runs(chunks, static_cast<std::size_t>(variables)) {}
    device_chunk_table chunks;
    device_pointer_table<T> rows;
    chunks_by_variable runs;  // where a part's variables lie in chunks
  };

  static double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  int count() const { return static_cast<int>(variables_.count()); }

  // The owner's optimizer reads and writes its master copy of the slice, which the gather then sends.
  optimizer_apply<Optim, T> apply(const constants_type& constants) {
    return {owner_.master(), owner_.state(), 1, owner_.slots(), constants, {}};
  }

  // On the owner's stream: a bucket's contributions after the bucket's event on every local tower; what
  // the towers left after their whole gradients (the timing starts there), with the copies of the
  // towers tower 0's device does not reach.
  void wait_for_part(cuda_towers<Layout>& towers, const step_part& part) {
    if (part.during_towers()) {
      for (std::size_t t = 0; t < towers.towers(); ++t) towers.bucket_done(t, part.bucket).make_wait(owner_.stream());
      return;
    }
    owner_.wait_for_gradients(towers);
    run_copies_async(copies_.gradients_in(), owner_.stream());
  }

  // Step 1 (see the top) over the part's chunks of every owner's slice; first_nonfinite: where a checked
  // step's senders note raw values.
  void contribute(const step_part& part, const std::vector<T>& weights, nonfinite_key* first_nonfinite) {
    contribution_agent<T, stored_type> agent{gradients_.const_view(), static_cast<int>(weights.size()), plan_.contributions() == 1, {},
                                          static_cast<unsigned>(span_.global_tower(0)), {}, first_nonfinite};
    for (std::size_t t = 0; t < weights.size(); ++t) agent.weights.value[t] = weights[t];
    for (const auto& owner : sends_) {
      agent.rows = owner->rows.view();
      for (const chunk_group& run : owner->runs.runs(part.variables)) owner->chunks.template launch<Policy>(agent, owner_.stream(), run);
    }
  }
  // Step 2: every owner gets every process's rows of its slice.
  void exchange() {
    collectives_->all_to_all_on_device(buffers_.send.get(), send_blocks_.offsets, send_blocks_.bytes, buffers_.received.get(),
                                       receive_blocks_.offsets, receive_blocks_.bytes, owner_.stream().get(),
                                       "sending gradients to their owners");
  }

  // Step 4, then every tower's next work waits for the new parameters.
  void finish(cuda_towers<Layout>& towers, std::chrono::steady_clock::time_point start, stage_seconds& stages) {
    gathered_slot_ = -1;
    const cuda_stream& stream = owner_.stream();
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    const auto reduced = std::chrono::steady_clock::now();
    collectives_->all_gather_blocks_on_device(owner_.master_storage(), buffers_.gathered.get(), gather_blocks_.offsets,
                                              gather_blocks_.bytes, stream.get(), "gathering parameters");
    if (broadcast_.target_count() > 0)
      all_chunks_.launch<Policy>(copy_agent<T, stored_type>{gathered_flat_.const_view(), replicas_.view(), broadcast_.target_count()},
                                 stream);
    run_copies_async(broadcast_.copies(), stream);
    owner_.end().record(stream);
    for (std::size_t t = 0; t < towers.towers(); ++t) owner_.end().make_wait(towers.stream(t));
    owner_.end().synchronize();
    towers.device_span(0, owner_.start(), owner_.end(), "sharded across processes", "reduce (GPU) process ", span_.rank());
    stages.reduce = std::chrono::duration<double>(reduced - start).count();
    stages.broadcast = seconds_since(reduced);
  }

  const variable_set& variables_;
  const processes& span_;
  int device_;
  std::vector<tensor_chunk> table_;
  exchange_plan plan_;
  gpu_owner<T, Policy> owner_;  // this process's slice, its state, master and checked average
  device_chunk_table all_chunks_;
  std::vector<std::size_t> padded_starts_;  // where each variable lies in the gathered buffer and host_state_
  exchange_buffers<T, cuda_device_memory> buffers_;  // mixed precision: the gathered buffer is the whole fp32 master
  tower_copies<device_buffer> copies_;      // the local towers tower 0's device does not reach: their gradients
  device_pointer_table<stored_type> gradients_;  // role = local tower (or its copy)
  gathered_broadcast<stored_type, T, cuda_device_memory> broadcast_;  // the gathered parameters into every replica
  device_pointer_table<stored_type> replicas_;   // the copy agent's targets: broadcast_.targets()
  exchange_plan::blocks send_blocks_, receive_blocks_, gather_blocks_;  // in bytes, the same every step
  device_pointer_table<T> received_rows_;  // role = global row
  device_pointer_table<T> gathered_flat_;  // role 0: every variable, end to end, padded
  std::vector<std::unique_ptr<send_rows>> sends_;    // one per owner with a non-empty slice
  device_collectives* collectives_ = nullptr;
  std::unique_ptr<staged_collectives> staged_;
  std::vector<T> host_slice_, host_state_;
  std::vector<T> host_master_;  // mixed precision: master_on_host's copies, laid out as the gathered buffer
  int gathered_slot_ = -1;  // the state slot host_state_ holds, -1: none or stale
};

}  // namespace detail
}  // namespace towerpipe
