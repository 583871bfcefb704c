#pragma once
// device_towers<Layout, Executor> — towers on devices, written once against an executor
// (docs/architecture.md, "The executor"): exec::cuda runs them on CUDA GPUs (exec/cuda.cuh), exec::simulated on simulated
// devices in host memory (exec/simulated.hpp). Tower i runs on pipeline_options::devices[i % size]
// (several towers may share a device) with its own stream, parameter replica and gradient buffers.
//
// Per step and tower: the shard is staged (exec/device_staging.hpp); the tower's stream waits for its
// copy and for the new parameters of the last step, then the tower function enqueues its forward and
// backward on tower_context::stream(). The library orders stages with events only — no device-wide
// synchronisation inside a step; a step ends by waiting on each tower's final event.
//
// Peer access is enabled between every pair of the towers' distinct devices where the executor allows;
// the reduction backends fall back to staged copies elsewhere and say so once through the log sink
// (core/log.hpp). With one device, towers share it and peer access is never needed.

#include <algorithm>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/gradient_poison.hpp"
#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/device_staging.hpp"
#include "towerpipe/exec/device_tower_context.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/executor/thread_pool.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/wiring/copy_wiring.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/data/split.hpp"
#include "towerpipe/trace/tracer.hpp"

namespace towerpipe {
namespace detail {

// The towers of a device execution space (the towers interface: exec/towers_contract.hpp).
template <class Layout, class Executor>
class device_towers {
 public:
  using value_type = typename Layout::value_type;
  using device_memory = decltype(std::declval<const Executor&>().device_memory(0));
  using device_buffer = typename Layout::template buffer<device_memory>;
  using context = device_tower_context<Layout, Executor>;
  using event_type = typename Executor::event;

  device_towers(const variable_set& variables, std::size_t towers, const pipeline_options& options)
      : exec_(options),
        devices_(assign_devices(towers, options.devices, exec_.device_count())),
        access_(devices_, exec_.enable_peer_access(devices_), options.direct_device_access),
        pool_(host_thread_count(options)),
        tracer_(options.trace),
        poison_(options.poison_gradients),
        host_mirror_(variables),
        written_(towers, std::vector<char>(variables.count(), 0)),
        ready_(towers, std::vector<char>(variables.count(), 0)),
        losses_(exec_.pinned_memory().template allocate<float>(towers)) {
    for (std::size_t t = 0; t < towers; ++t) towers_.push_back(std::make_unique<tower>(exec_, variables, devices_[t], tracer_.on()));
  }

  const Executor& executor() const { return exec_; }
  const tracer& trace() const { return tracer_; }

  // Records [start, end), timing events of tower t's device, on the row named by row_parts, while tracing.
  template <class... RowParts>
  void device_span(std::size_t t, const event_type& start, const event_type& end, const std::string& name, const RowParts&... row_parts) const {
    if (!tracer_.on()) return;
    const auto& clock = *towers_[t]->clock;
    tracer_.span(name, clock.host_time(start), clock.host_time(end), current_step_, row_parts...);
  }

  // After a step has completed, while tracing: each tower's compute as the device ran it, on rows
  // "tower i (GPU)", and the copy of its shard (made when the batch was staged, usually during the step
  // before) on rows "tower i (GPU copy)".
  void finish_step(std::int64_t) const {
    if (!tracer_.on()) return;
    for (std::size_t t = 0; t < towers_.size(); ++t) {
      const tower& own = *towers_[t];
      device_span(t, own.compute_start[0], own.compute_end[0], "compute", "tower ", t, " (GPU)");
      device_span(t, own.input.copy_start(last_slot_), own.input.copy_end(last_slot_), "split copy (host to device)", "tower ", t,
                  " (GPU copy)");
    }
  }

  std::size_t towers() const { return towers_.size(); }
  int device(std::size_t t) const { return devices_[t]; }
  // Which towers' buffers a kernel on one tower's stream uses in place (wiring/copy_wiring.hpp).
  const tower_access& access() const { return access_; }
  thread_pool& pool() { return pool_; }

  const typename Executor::stream& stream(std::size_t t) const { return towers_[t]->stream; }
  device_buffer& replica(std::size_t t) { return towers_[t]->replica; }
  device_buffer& gradients(std::size_t t) { return towers_[t]->gradients; }
  // Recorded on the tower's stream when its gradients are complete. The reduction makes each tower's
  // stream wait for the tower's new parameters before the next step's work.
  const event_type& gradients_ready(std::size_t t) const { return towers_[t]->gradients_ready; }

  // Where gradient_ready marks go (the step's parts: pipeline/step_parts.hpp), or nowhere (null).
  void set_ready_listener(tower_ready_listener* listener) { listener_ = listener; }
  // Events for gradient buckets (plan/buckets.hpp), one per tower and bucket: recorded on the tower's
  // stream when it has marked the whole bucket (record_bucket_done, from the tower's thread), so that a
  // reduction of the bucket waits for exactly the work that wrote its gradients.
  void prepare_bucket_events(std::size_t buckets) {
    for (auto& own : towers_) {
      own->bucket_done.clear();
      for (std::size_t b = 0; b < buckets; ++b) own->bucket_done.emplace_back(exec_, own->device);
    }
  }
  void record_bucket_done(std::size_t t, std::size_t bucket) {
    const typename Executor::device_guard on(exec_, towers_[t]->device);
    exec_.record(towers_[t]->bucket_done.at(bucket), towers_[t]->stream);
  }
  const event_type& bucket_done(std::size_t t, std::size_t bucket) const { return towers_[t]->bucket_done.at(bucket); }

  // Reads variable `index` of tower 0's replica (all replicas are equal between steps).
  tensor_view<const value_type> parameter_on_host(std::size_t index) {
    synchronize_all();
    const typename Executor::device_guard on(exec_, devices_[0]);
    const tensor_view<value_type> target = host_mirror_.view(index);
    exec_.copy_to_host_now(target.data(), towers_[0]->replica.data(index), target.size() * sizeof(value_type));
    return target;
  }

  void set_parameter(std::size_t index, const value_type* values) {
    synchronize_all();
    for (auto& t : towers_) {
      const typename Executor::device_guard on(exec_, t->device);
      exec_.copy_to_device_now(t->replica.data(index), values, t->replica.view(index).size() * sizeof(value_type));
    }
  }

  // Packs each tower's shard into pinned memory and starts its copy to the tower's device, in the
  // staging slot after the last one used (exec/device_staging.hpp).
  void stage(const towerpipe::batch& whole, const std::vector<shard>& shards) {
    const int slot = next_slot_;
    std::vector<towerpipe::batch> device_shards(towers());
    for (std::size_t t = 0; t < towers(); ++t) {
      tower& own = *towers_[t];
      device_shards[t] = own.input.stage(slot, whole.slice(shards[t].first, shards[t].examples), own.stream);
    }
    staged_.push_back({slot, std::move(device_shards), shards});
    next_slot_ = (next_slot_ + 1) % shard_stager<Executor>::slots;
  }
  std::size_t staged() const { return staged_.size(); }
  const std::vector<shard>& next_shards() const { return staged_.front().shards; }
  // Drops the oldest staged batch without running it (a step refused before its towers ran): its slot
  // may be refilled once its copies have landed, as after a run.
  void discard_next() {
    const int slot = staged_.front().slot;
    staged_.pop_front();
    for (auto& own : towers_) {
      const typename Executor::device_guard on(exec_, own->device);
      own->input.wait_for_copy(slot, own->stream);
      own->input.release(slot, own->stream);
    }
  }

  // Runs fn(context&) for every tower, each on a pool thread with its device current, on the oldest
  // staged batch (consumed whatever the outcome). A function returning a number gives the loss; one
  // returning nothing writes it to context::device_loss(). Throws if a tower threw or left a gradient
  // unwritten, naming the tower; no reduction then follows, so the parameters stay as they were.
  template <class TowerFn>
  std::vector<double> run(TowerFn& fn, std::int64_t step) {
    static_assert(std::is_invocable_v<TowerFn&, context&>,
                  "towerpipe: a tower function for GPU towers is called as fn(trainer::tower_context&)");
    using result = std::invoke_result_t<TowerFn&, context&>;
    static_assert(std::is_void_v<result> || std::is_convertible_v<result, double>,
                  "towerpipe: a tower function for GPU towers returns its shard's mean loss (a number), or nothing "
                  "and leaves the loss in tower.device_loss()");
    current_step_ = step;
    const staged_batch current = std::move(staged_.front());
    staged_.pop_front();
    last_slot_ = current.slot;
    for (std::vector<char>& flags : written_) std::fill(flags.begin(), flags.end(), 0);
    for (std::vector<char>& flags : ready_) std::fill(flags.begin(), flags.end(), 0);
    std::vector<double> losses(towers(), 0.0);
    std::vector<std::exception_ptr> failures = pool_.run(towers(), [&](std::size_t t) {
      tower& own = *towers_[t];
      const typename Executor::device_guard on(exec_, own.device);
      const typename Executor::range range(exec_, "towerpipe tower compute");
      own.input.wait_for_copy(current.slot, own.stream);
      if (tracer_.on()) exec_.record(own.compute_start[0], own.stream);
      exec_.memset_async(own.device_loss.get(), 0, sizeof(float), own.stream);
      if (poison_) poison_gradients(own);
      context ctx(exec_, own.device, own.stream, own.device_loss.get(), t, towers(), current.device_shards[t], current.shards[t].weight,
                  &own.replica, &own.gradients, &written_[t], &ready_[t], listener_);
      // Recorded whatever the tower function does, so that later steps order after its work.
      const auto record_done = [&] {
        if (tracer_.on()) exec_.record(own.compute_end[0], own.stream);
        exec_.record(own.gradients_ready, own.stream);
        own.input.release(current.slot, own.stream);
      };
      const auto start = timeline::clock::now();
      try {
        if constexpr (std::is_void_v<result>) {
          fn(ctx);
          exec_.copy_async(&losses_[t], own.device_loss.get(), sizeof(float), own.stream);
        } else {
          losses[t] = static_cast<double>(fn(ctx));
        }
        exec_.check_user_launches();  // a launch the tower function made with bad arguments
        if (poison_) check_written(own, written_[t]);
        if (listener_ != nullptr) listener_->tower_returned(t, ready_[t]);
      } catch (...) {
        record_done();
        throw;
      }
      record_done();
      tracer_.span("enqueue compute", start, timeline::clock::now(), step, "tower ", t);
    });
    throw_tower_failures(failures, written_, host_mirror_.variables());
    if constexpr (std::is_void_v<result>) {
      for (std::size_t t = 0; t < towers(); ++t) {
        exec_.synchronize(towers_[t]->gradients_ready);
        exec_.host_reads(&losses_[t], sizeof(float));
        losses[t] = losses_[t];
      }
    }
    return losses;
  }

  // Waits for all of every tower's work (between steps, before host access to replicas).
  void synchronize_all() const {
    for (const auto& t : towers_) {
      exec_.synchronize(t->stream);
      exec_.synchronize(t->input.copy_stream());
    }
  }

 private:
  struct tower {
    // `timed`: with a timeline, also the timing events and the device clock.
    tower(const Executor& exec, const variable_set& variables, int device_id, bool timed)
        : device(device_id),
          stream(exec, device_id, "tower"),
          replica(variables, exec.device_memory(device_id)),
          gradients(variables, exec.device_memory(device_id)),
          gradients_ready(exec, device_id),
          input(exec, device_id, timed),
          device_loss(exec.device_memory(device_id).template allocate<float>(1, 256)),
          find_scratch(exec, device_id) {
      if (!timed) return;
      compute_start.emplace_back(exec, device_id, true);
      compute_end.emplace_back(exec, device_id, true);
      clock.emplace(exec, device_id, stream);
    }

    int device;
    typename Executor::stream stream;
    device_buffer replica, gradients;
    typename Executor::event gradients_ready;
    shard_stager<Executor> input;
    typename device_memory::template owner<float> device_loss;
    typename Executor::find_scratch find_scratch;  // poison_gradients' search
    std::vector<typename Executor::event> compute_start, compute_end;  // one each while tracing, else none
    std::vector<typename Executor::event> bucket_done;                // per gradient bucket (prepare_bucket_events)
    std::optional<typename Executor::clock> clock;                    // while tracing
  };

  struct staged_batch {
    int slot;
    std::vector<towerpipe::batch> device_shards;
    std::vector<shard> shards;
  };

  // Which device each tower runs on; checks the ids against the visible devices.
  static std::vector<int> assign_devices(std::size_t towers, const std::vector<int>& requested, int visible) {
    if (visible == 0) fail("exec::", Executor::name, " needs a ", Executor::device_kind, " device, and none is visible");
    std::vector<int> devices(towers);
    for (std::size_t t = 0; t < towers; ++t) {
      const int device = requested.empty() ? static_cast<int>(t) % visible : requested[t % requested.size()];
      if (device < 0 || device >= visible)
        fail("tower ", t, ": ", Executor::device_kind, " device ", device, " does not exist (", visible, " device(s) visible)");
      devices[t] = device;
    }
    return devices;
  }

  // pipeline_options::poison_gradients (core/gradient_poison.hpp has the pattern): the fill and the scan
  // on the tower's stream, over the gradients' bits.
  using poison_bits = typename gradient_poison<value_type>::bits_type;
  void poison_gradients(tower& own) const {
    for (std::size_t v = 0; v < own.gradients.variables().count(); ++v) {
      auto* bits = reinterpret_cast<poison_bits*>(own.gradients.data(v));
      exec_.fill_async(bits, own.gradients.view(v).size(), gradient_poison<value_type>::bits, own.stream);
    }
  }
  // After the tower's work on its stream: throws if a written gradient still holds the poison somewhere.
  void check_written(tower& own, const std::vector<char>& written) const {
    for (std::size_t v = 0; v < own.gradients.variables().count(); ++v) {
      if (!written[v]) continue;  // reported with the tower by throw_tower_failures
      const auto* bits = reinterpret_cast<const poison_bits*>(own.gradients.data(v));
      const std::size_t size = own.gradients.view(v).size();
      const std::size_t found = exec_.find_first(bits, size, gradient_poison<value_type>::bits, own.stream, own.find_scratch);
      if (found != size) fail_unwritten_element(own.gradients.variables()[v], found);
    }
  }

  Executor exec_;
  std::vector<int> devices_;
  tower_access access_;
  thread_pool pool_;
  tracer tracer_;
  bool poison_;
  typename Layout::template buffer<host_memory> host_mirror_;
  std::vector<std::unique_ptr<tower>> towers_;
  std::vector<std::vector<char>> written_;
  std::vector<std::vector<char>> ready_;  // [tower][variable]: marked by gradient_ready this step
  tower_ready_listener* listener_ = nullptr;
  typename decltype(std::declval<const Executor&>().pinned_memory())::template owner<float> losses_;
  std::deque<staged_batch> staged_;
  int next_slot_ = 0;
  int last_slot_ = 0;  // the staging slot of the batch run() last consumed
  std::int64_t current_step_ = 0;
};

}  // namespace detail

namespace exec {

// Towers on devices driven by Executor (see the top of this header): exec::cuda, exec::simulated.
template <class Executor>
struct on_devices {
  using policy_kind = detail::exec_policy_kind;
  static constexpr const char* name = Executor::name;
  static constexpr bool device_towers = true;
  template <class Layout>
  using towers = detail::device_towers<Layout, Executor>;
};

}  // namespace exec
}  // namespace towerpipe
