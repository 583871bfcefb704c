#pragma once
// reduce::host with device towers (exec::cuda, exec::simulated): the master parameters in pinned host memory; gradients
// come down, the CPU runs host towers' fused pass and parameters go up, in transfer groups that overlap both ways.
// Why: docs/design-notes.md#reduce-host-device_towers

// Written once against an executor (docs/architecture.md, "The executor"); the host pass declares its pinned reads and writes.

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/exec/device_towers.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/host/host_towers.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {

struct host_transfer_policy {
  static constexpr std::size_t group_elements = std::size_t(1) << 21;  // 8 MiB of float per group
};

namespace detail {

template <class Optim, class Layout, class Executor, class Policy = host_transfer_policy>
class host_reducer_for_devices {
 public:
  using towers_type = device_towers<Layout, Executor>;
  using stored_type = typename precision<Layout>::stored_type;  // what moves: the towers' gradients and parameters
  using master_type = typename precision<Layout>::master_type;  // the master, the state, the average
  static constexpr bool mixed = precision<Layout>::mixed;
  using pinned_memory = decltype(std::declval<const Executor&>().pinned_memory());
  using pinned_buffer = typename Layout::template buffer<pinned_memory>;
  // The master: the pinned buffer that goes up in full precision, host memory of its own with mixed.
  using master_buffer = std::conditional_t<mixed, typename Layout::template buffer<host_memory, master_type>, pinned_buffer>;
  using stream = typename Executor::stream;
  using event = typename Executor::event;
  static constexpr reducer_capabilities capabilities{};

  explicit host_reducer_for_devices(const reducer_setup<towers_type, Optim>& setup)
      : exec_(setup.towers.executor()),
        towers_(setup.towers),
        bucket_pool_(host_thread_count(setup.options)),
        pass_(setup.variables, setup.hyper),
        master_(setup.variables, master_memory()),
        rounded_(variables_if(mixed, setup.variables), exec_.pinned_memory()),
        groups_(group_chunks(pass_.chunks(), Policy::group_elements)) {
    for (std::size_t t = 0; t < setup.towers.towers(); ++t) {
      links_.push_back(std::make_unique<link>(exec_, setup.variables, setup.towers.device(t)));
      std::size_t leader = 0;
      while (setup.towers.device(leader) != setup.towers.device(t)) ++leader;
      upload_leader_.push_back(leader);
    }
  }

  backend_choice choice() const { return named_by_type("host"); }
  // A bucket's pass goes on the reducer's own pool: the towers' pool's threads are held until every tower
  // function has returned.
  bool buckets_during_towers() const { return true; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (work_.checked) partials_ = pass_.fresh_partials();
  }
  // The part's transfer groups come down, are averaged (and applied, going up again, in an unchecked
  // step) on a pool while the next group is on its way: a bucket on the reducer's pool, the rest on the
  // towers'.
  void reduce_part(towers_type& towers, const step_part& part) {
    if (!part.during_towers()) rest_started_ = step_clock::now();
    const typename Executor::range range(exec_, "towerpipe reduce::host part");
    thread_pool& runner = part.during_towers() ? bucket_pool_ : towers.pool();
    const std::vector<chunk_group> groups = transfer_groups(part.variables);
    download_gradients(towers, groups, part.bucket);
    std::vector<const pinned_buffer*> gradients;
    for (const auto& own : links_) gradients.push_back(&own->gradients);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (const auto& own : links_) {
        exec_.synchronize(own->down_done[g]);
        declare_group(own->gradients, groups[g], false);
      }
      const std::vector<std::size_t> chunks = pass_.chunk_range(groups[g].first, groups[g].last);
      if (work_.checked) {
        pass_.screen(runner, chunks, gradients, work_.weights, work_.window, partials_);
      } else if constexpr (!mixed) {
        declare_group(master_, groups[g], true);
        pass_.run(runner, chunks, gradients, master_, work_.weights, work_.constants);
        upload_group(towers, groups[g]);
      }
    }
  }
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    if (work_.checked) {
      stages.reduce = seconds_since(rest_started_);
      return std::move(partials_);
    }
    finish_uploads(towers, stages);
    return {};
  }
  // Pass 2: the optimizer on scale * average, group by group, each group going up as soon as it is done.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const typename Executor::range range(exec_, "towerpipe reduce::host apply");
    const double screened = stages.reduce;
    rest_started_ = step_clock::now();
    const std::vector<const buffer*> average{&pass_.averaged()};
    for (const chunk_group& group : groups_) {
      const std::vector<std::size_t> chunks = pass_.chunk_range(group.first, group.last);
      declare_group(uploaded(), group, true);
      pass_.run(towers.pool(), chunks, average, master_, std::vector<master_type>{scale}, work_.constants,
                mixed ? &rounded_ : nullptr);
      upload_group(towers, group);
    }
    finish_uploads(towers, stages);
    stages.reduce += screened;
  }
  // After a failed step: the uploads of the buckets that went are waited for, and the towers' next work
  // ordered after them.
  void abandon(towers_type& towers) {
    stage_seconds ignored;
    finish_uploads(towers, ignored);
  }

  std::size_t state_slots() const { return pass_.state_slots(); }
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) const { return pass_.state_view(slot, index); }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) { pass_.set_state(slot, index, values); }
  // The master in host memory (with mixed precision the fp32 one; else the pinned buffer that goes up).
  tensor_view<const master_type> master(std::size_t index) const {
    exec_.host_reads(master_.data(index), master_.view(index).size() * sizeof(master_type));
    return master_.view(index);
  }
  void set_master(std::size_t index, const master_type* values) {
    exec_.host_writes(master_.data(index), master_.view(index).size() * sizeof(master_type));
    std::copy(values, values + master_.view(index).size(), master_.data(index));
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return std::vector<std::size_t>(towers_.towers(), 0); }  // host memory

 private:
  using buffer = typename Layout::template buffer<host_memory, master_type>;

  auto master_memory() const {
    if constexpr (mixed) return host_memory{};
    else return exec_.pinned_memory();
  }

  // A part's transfer groups: its runs of chunks, cut at about group_elements.
  std::vector<chunk_group> transfer_groups(const std::vector<std::size_t>& variables) const {
    std::vector<chunk_group> groups;
    for (const chunk_group& run : pass_.by_variable().runs(variables)) {
      const std::vector<chunk_group> cut = group_chunks(pass_.chunks(), Policy::group_elements, run);
      groups.insert(groups.end(), cut.begin(), cut.end());
    }
    return groups;
  }

  // Every tower's gradients of `groups` into its pinned buffer on its down stream, issued group-major,
  // after the bucket's event on each tower (no_bucket: after its whole gradients).
  void download_gradients(towers_type& towers, const std::vector<chunk_group>& groups, std::size_t bucket) {
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      link& own = *links_[t];
      const typename Executor::device_guard on(exec_, towers.device(t));
      exec_.wait(own.down, bucket == no_bucket ? towers.gradients_ready(t) : towers.bucket_done(t, bucket));
      while (own.down_done.size() < groups.size()) own.down_done.emplace_back(exec_, towers.device(t));
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        link& own = *links_[t];
        const typename Executor::device_guard on(exec_, towers.device(t));
        copy_group(own.gradients, towers.gradients(t), groups[g], own.down);
        exec_.record(own.down_done[g], own.down);
      }
    }
  }
  // Group g of the new parameters (the master, or with mixed precision its rounded copy) up into each
  // device's first replica, then on the device into its other ones, all on the first tower's up stream.
  void upload_group(towers_type& towers, const chunk_group& group) {
    const pinned_buffer& parameters = uploaded();
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      const std::size_t leader = upload_leader_[t];
      const typename Executor::device_guard on(exec_, towers.device(t));
      if (leader == t) copy_group(towers.replica(t), parameters, group, links_[t]->up);
      else copy_group(towers.replica(t), towers.replica(leader), group, links_[leader]->up);
    }
  }
  // After the last upload was issued: the towers' next work waits for their parameters, the host for
  // the uploads. stages.reduce: from the rest's start to now (the CPU's work); broadcast: the uploads' tail.
  void finish_uploads(towers_type& towers, stage_seconds& stages) {
    const auto computed = step_clock::now();
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      link& leader = *links_[upload_leader_[t]];
      const typename Executor::device_guard on(exec_, towers.device(t));
      if (upload_leader_[t] == t) exec_.record(leader.up_done, leader.up);
      exec_.wait(towers.stream(t), leader.up_done);
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (upload_leader_[t] == t) exec_.synchronize(links_[t]->up_done);
    }
    stages.reduce = std::chrono::duration<double>(computed - rest_started_).count();
    stages.broadcast = seconds_since(computed);
  }

  // One tower's link to the host: pinned gradients and a stream each way, on the tower's device.
  struct link {
    link(const Executor& exec, const variable_set& variables, int device)
        : gradients(variables, exec.pinned_memory()), down(exec, device, "host download"), up(exec, device, "host upload"),
          up_done(exec, device) {}
    pinned_buffer gradients;
    stream down, up;
    std::vector<event> down_done;  // per group of the pass in flight (download_gradients adds what a part needs)
    event up_done;
  };

  const pinned_buffer& uploaded() const {
    if constexpr (mixed) return rounded_;
    else return master_;
  }

  // The host pass reads (downloaded gradients) or writes (the parameters that go up) a group of a pinned
  // buffer: declared to the executor, which the simulation checks against the copies.
  template <class Buffer>
  void declare_group(const Buffer& pinned, const chunk_group& group, bool writes) const {
    for (const element_range& r : group_ranges(pass_.chunks(), group)) {
      auto* first = pinned.data(r.variable) + r.begin;
      const std::size_t bytes = (r.end - r.begin) * sizeof(*first);
      if (writes) exec_.host_writes(first, bytes);
      else exec_.host_reads(first, bytes);
    }
  }

  // Copies a group's elements of every variable it touches (either direction, or device to device):
  // in layout::flat one range, otherwise one batch of ranges.
  template <class Target, class Source>
  void copy_group(Target& target, const Source& source, const chunk_group& group, const stream& s) const {
    const std::vector<element_range> ranges = group_ranges(pass_.chunks(), group);
    if constexpr (has_arena<Target>::value) {
      const stored_type* begin = source.data(ranges.front().variable) + ranges.front().begin;
      const stored_type* end = source.data(ranges.back().variable) + ranges.back().end;
      stored_type* to = target.data(ranges.front().variable) + ranges.front().begin;
      exec_.copy_async(to, begin, static_cast<std::size_t>(end - begin) * sizeof(stored_type), s);
    } else {
      std::vector<void*> to;
      std::vector<const void*> from;
      std::vector<std::size_t> bytes;
      for (const element_range& r : ranges) {
        to.push_back(target.data(r.variable) + r.begin);
        from.push_back(source.data(r.variable) + r.begin);
        bytes.push_back((r.end - r.begin) * sizeof(stored_type));
      }
      exec_.copy_batch_async(to.data(), from.data(), bytes.data(), to.size(), s);
    }
  }

  const Executor& exec_;
  towers_type& towers_;
  thread_pool bucket_pool_;  // the host passes of buckets that go during the towers
  host_optimizer_pass<Optim, Layout> pass_;
  master_buffer master_;
  pinned_buffer rounded_;  // mixed precision: the new parameters rounded, for the uploads (else empty)
  std::vector<chunk_group> groups_;  // the whole step's transfer groups
  std::vector<std::unique_ptr<link>> links_;
  std::vector<std::size_t> upload_leader_;  // per tower: the first tower on its device, which uploads for it
  step_work<master_type, Optim> work_;
  screen_partials partials_;  // a checked step's screen as its parts go
  step_clock::time_point rest_started_;
};

}  // namespace detail

template <class Optim, class Layout, class Executor>
struct reducer_for<exec::on_devices<Executor>, reduce::host, Optim, Layout> {
  using type = detail::host_reducer_for_devices<Optim, Layout, Executor>;
};

}  // namespace towerpipe
