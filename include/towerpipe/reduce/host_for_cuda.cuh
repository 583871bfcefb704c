#pragma once
// reduce::host with exec::cuda — the tutorial's CPU parameter server, done well. The master parameters
// live in pinned host memory; per step, every tower's gradients come down into pinned buffers, the CPU
// threads run the same fused pass as for host towers (canonical average + optimizer, reduce/host.hpp),
// and the new parameters go up into every replica. The variables are cut into transfer groups of about
// group_elements, so that group g+1 comes down while the CPU works on g and g-1 goes up: the PCIe
// transfers in both directions and the CPU overlap. A checked step (programs/screen.hpp) screens each
// group as it arrives, then applies and uploads group by group.
//
// What keeps the transfers at the link's speed as towers are added:
// - Downloads are issued group-major (group 0 of every tower, then group 1, ...): a copy engine serves
//   the streams of one device roughly in issue order, and tower-major issue would hold the CPU's first
//   group until nearly every tower's whole gradient had come down.
// - Towers that share a device share one upload: the new parameters go up once per device, into its
//   first tower's replica, and are copied on the device (HBM, ~50x PCIe) into the others.
// - layout::per_variable's groups span many separate allocations: they move in one
//   cudaMemcpyBatchAsync per group and direction, not one call per variable.
//
// Gradient buckets (reduce/overlapped_reduction.hpp): a bucket's gradients come down as soon as every
// tower's stream has passed the bucket's event, the CPU averages (and in an unchecked step applies) them
// and the bucket's parameters go up, all while the towers compute; what the towers left then goes through
// the same pipeline of transfer groups, and finishes the step. A bucket's host pass runs on a thread
// pool of the reducer's own: GPU tower functions only enqueue, so the towers' pool is mostly idle while
// their devices compute, but the main thread holds it until every tower function has returned.
//
// Mixed precision (bf16 or fp16 towers; every such step is a checked one): the 16-bit gradients come
// down and the pass widens them (reduce/host.hpp); the master, the state and the average are fp32 in
// host memory, and the pass writes the new parameters rounded to nearest even into a pinned 16-bit
// buffer, which goes up: both directions move 2 bytes a parameter.

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <type_traits>
#include <vector>

#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/nvtx.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/reduce/host.hpp"
#include "towerpipe/programs/agents.hpp"
#include "towerpipe/programs/copy_list.hpp"
#include "towerpipe/reduce/reducer_for.hpp"
#include "towerpipe/step/buckets.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

struct host_transfer_policy {
  static constexpr std::size_t group_elements = std::size_t(1) << 21;  // 8 MiB of float per group
};

template <class Optim, class Layout, class Policy = host_transfer_policy>
class cuda_host_reducer {
 public:
  using stored_type = typename Layout::value_type;  // what moves: the towers' gradients and parameters
  using T = master_type_t<stored_type>;             // the master, the state, the average
  static constexpr bool mixed = !std::is_same<stored_type, T>::value;
  using pinned_buffer = typename Layout::template buffer<cuda_pinned_memory>;
  // The master: the pinned buffer that goes up in full precision, host memory of its own with mixed.
  using master_buffer = std::conditional_t<mixed, typename Layout::template buffer<host_memory, T>, pinned_buffer>;
  using hyper_parameters = typename Optim::hyper_parameters;

  cuda_host_reducer(const variable_set& variables, const hyper_parameters& h, cuda_towers<Layout>& towers,
                    const pipeline_options& options)
      : bucket_pool_(host_thread_count(options)),
        pass_(variables, h),
        master_(variables),
        rounded_(variables_if(mixed, variables)),
        groups_(group_chunks(pass_.chunks(), Policy::group_elements)),
        by_variable_(pass_.chunks(), variables.count()) {
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      links_.push_back(std::make_unique<link>(variables, towers.device(t), groups_.size()));
      std::size_t leader = 0;
      while (towers.device(leader) != towers.device(t)) ++leader;
      upload_leader_.push_back(leader);
    }
  }

  std::size_t state_slots() const { return pass_.state_slots(); }
  tensor_view<const T> state_on_host(std::size_t slot, std::size_t index) { return pass_.state_view(slot, index); }
  void set_state(std::size_t slot, std::size_t index, const T* values) { pass_.set_state(slot, index, values); }
  void parameter_set(std::size_t index, const T* values) {
    std::copy(values, values + master_.view(index).size(), master_.data(index));
  }
  // Mixed precision: the fp32 master.
  tensor_view<const T> master_on_host(std::size_t index) const { return master_.view(index); }

  void average_and_apply(cuda_towers<Layout>& towers, const std::vector<T>& weights,
                         const typename Optim::template step_constants<T>& constants, stage_seconds& stages) {
    average_and_apply_groups(towers, groups_, no_bucket, towers.pool(), weights, constants, stages);
  }

  // A checked step, pass 1: the gradients come down group by group and are averaged and screened on the
  // CPU (programs/screen.hpp) while the next group is on its way.
  screen_partials screen_average(cuda_towers<Layout>& towers, const std::vector<T>& weights, const accumulation<T>& step,
                                 stage_seconds& stages) {
    screen_partials partials = begin_screen();
    screen_groups(towers, groups_, no_bucket, towers.pool(), weights, step, partials, stages);
    return partials;
  }

  // The same over a part of the step (see the top): a bucket on the reducer's pool, what the towers left
  // on theirs.
  bool overlaps_buckets() const { return true; }
  // After a failed step: the uploads of the buckets that went are waited for, and the towers' next work
  // ordered after them.
  void join_parts(cuda_towers<Layout>& towers) {
    stage_seconds ignored;
    finish_uploads(towers, std::chrono::steady_clock::now(), ignored);
  }
  void average_and_apply_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights,
                              const typename Optim::template step_constants<T>& constants, stage_seconds& stages) {
    average_and_apply_groups(towers, transfer_groups(part.variables), part.bucket, pool_for(towers, part), weights, constants,
                             stages);
  }
  screen_partials begin_screen() const {
    screen_partials partials;
    partials.tile_sums.assign(pass_.tile_count(), 0.0);
    return partials;
  }
  void screen_part(cuda_towers<Layout>& towers, const step_part& part, const std::vector<T>& weights, const accumulation<T>& step,
                   screen_partials& partials, stage_seconds& stages) {
    screen_groups(towers, transfer_groups(part.variables), part.bucket, pool_for(towers, part), weights, step, partials, stages);
  }

  // Pass 2: the optimizer on scale * average, group by group, each group going up as soon as it is done.
  void apply_averaged(cuda_towers<Layout>& towers, T scale, const typename Optim::template step_constants<T>& constants,
                      stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::host apply");
    const double screened = stages.reduce;
    const auto start = std::chrono::steady_clock::now();
    const std::vector<const buffer*> average{&pass_.averaged()};
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const std::vector<std::size_t> chunks = pass_.chunk_range(groups_[g].first, groups_[g].last);
      if constexpr (mixed) pass_.run(towers.pool(), chunks, average, master_, std::vector<T>{scale}, constants, &rounded_);
      else pass_.run(towers.pool(), chunks, average, master_, std::vector<T>{scale}, constants);
      upload_group(towers, groups_[g]);
    }
    finish_uploads(towers, start, stages);
    stages.reduce += screened;
  }

 private:
  using buffer = typename Layout::template buffer<host_memory, T>;

  // The fused pass over `groups`: each comes down, is averaged and applied on `runner`, goes up. bucket:
  // the gradient bucket they hold, whose events the downloads wait for, or no_bucket: what the towers
  // left, after their whole gradients; that finishes the step (the uploads waited for, stages filled).
  template <class Runner>
  void average_and_apply_groups(cuda_towers<Layout>& towers, const std::vector<chunk_group>& groups, std::size_t bucket,
                                Runner& runner, const std::vector<T>& weights,
                                const typename Optim::template step_constants<T>& constants, stage_seconds& stages) {
    if constexpr (mixed) {
      fail("reduce::host: a mixed-precision step is always a checked one");  // pipeline::checked_steps() says so
    } else {
      const nvtx_range range("towerpipe reduce::host");
      const auto start = std::chrono::steady_clock::now();
      download_gradients(towers, groups, bucket);
      const std::vector<const pinned_buffer*> gradients = tower_gradients();
      for (std::size_t g = 0; g < groups.size(); ++g) {
        wait_for_group(g);
        pass_.run(runner, pass_.chunk_range(groups[g].first, groups[g].last), gradients, master_, weights, constants);
        upload_group(towers, groups[g]);
      }
      if (bucket == no_bucket) finish_uploads(towers, start, stages);
    }
  }
  template <class Runner>
  void screen_groups(cuda_towers<Layout>& towers, const std::vector<chunk_group>& groups, std::size_t bucket, Runner& runner,
                     const std::vector<T>& weights, const accumulation<T>& step, screen_partials& partials, stage_seconds& stages) {
    const nvtx_range range("towerpipe reduce::host screen");
    const auto start = std::chrono::steady_clock::now();
    download_gradients(towers, groups, bucket);
    const std::vector<const pinned_buffer*> gradients = tower_gradients();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      wait_for_group(g);
      pass_.screen(runner, pass_.chunk_range(groups[g].first, groups[g].last), gradients, weights, step, partials);
    }
    if (bucket == no_bucket) stages.reduce = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  thread_pool& pool_for(cuda_towers<Layout>& towers, const step_part& part) {
    return part.during_towers() ? bucket_pool_ : towers.pool();
  }

  // A part's transfer groups: its runs of chunks, cut at about group_elements.
  std::vector<chunk_group> transfer_groups(const std::vector<std::size_t>& variables) const {
    std::vector<chunk_group> groups;
    for (const chunk_group& run : by_variable_.runs(variables)) {
      const std::vector<chunk_group> cut = group_chunks(pass_.chunks(), Policy::group_elements, run);
      groups.insert(groups.end(), cut.begin(), cut.end());
    }
    return groups;
  }

  // Every tower's gradients of `groups` into its pinned buffer on its down stream, issued group-major,
  // after the bucket's event on each tower (no_bucket: after its whole gradients).
  void download_gradients(cuda_towers<Layout>& towers, const std::vector<chunk_group>& groups, std::size_t bucket) {
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      link& own = *links_[t];
      device_guard on(towers.device(t));
      (bucket == no_bucket ? towers.gradients_ready(t) : towers.bucket_done(t, bucket)).make_wait(own.down);
      while (own.down_done.size() < groups.size()) own.down_done.emplace_back(towers.device(t));
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        link& own = *links_[t];
        device_guard on(towers.device(t));
        copy_group(own.gradients, towers.gradients(t), groups[g], own.down);
        own.down_done[g].record(own.down);
      }
    }
  }
  std::vector<const pinned_buffer*> tower_gradients() const {
    std::vector<const pinned_buffer*> gradients;
    for (const auto& own : links_) gradients.push_back(&own->gradients);
    return gradients;
  }
  void wait_for_group(std::size_t g) const {
    for (const auto& own : links_) own->down_done[g].synchronize();
  }
  // Group g of the new parameters (the master, or with mixed precision its rounded copy) up into each
  // device's first replica, then on the device into its other ones, all on the first tower's up stream.
  void upload_group(cuda_towers<Layout>& towers, const chunk_group& group) {
    const pinned_buffer& parameters = uploaded();
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      const std::size_t leader = upload_leader_[t];
      device_guard on(towers.device(t));
      if (leader == t) copy_group(towers.replica(t), parameters, group, links_[t]->up);
      else copy_group(towers.replica(t), towers.replica(leader), group, links_[leader]->up);
    }
  }
  // After the last upload was issued: the towers' next work waits for their parameters, the host for
  // the uploads. stages.reduce: from `start` to now (the CPU's work); broadcast: the uploads' tail.
  void finish_uploads(cuda_towers<Layout>& towers, std::chrono::steady_clock::time_point start, stage_seconds& stages) {
    const auto computed = std::chrono::steady_clock::now();
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      link& leader = *links_[upload_leader_[t]];
      device_guard on(towers.device(t));
      if (upload_leader_[t] == t) leader.up_done.record(leader.up);
      leader.up_done.make_wait(towers.stream(t));
    }
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (upload_leader_[t] == t) links_[t]->up_done.synchronize();
    }
    const auto end = std::chrono::steady_clock::now();
    stages.reduce = std::chrono::duration<double>(computed - start).count();
    stages.broadcast = std::chrono::duration<double>(end - computed).count();
  }

  // One tower's link to the host: pinned gradients and a stream each way, on the tower's device.
  struct link {
    link(const variable_set& variables, int device, std::size_t groups)
        : gradients(variables, cuda_pinned_memory{}), down(device), up(device), up_done(device) {
      for (std::size_t g = 0; g < groups; ++g) down_done.emplace_back(device);
    }
    pinned_buffer gradients;
    cuda_stream down, up;
    std::vector<cuda_event> down_done;  // per group of the pass in flight
    cuda_event up_done;
  };

  const pinned_buffer& uploaded() const {
    if constexpr (mixed) return rounded_;
    else return master_;
  }

  // Copies a group's elements of every variable it touches (either direction, or device to device):
  // in layout::flat one range, otherwise one batch of ranges.
  template <class Target, class Source>
  void copy_group(Target& target, const Source& source, const chunk_group& group, const cuda_stream& stream) const {
    const std::vector<element_range> ranges = group_ranges(pass_.chunks(), group);
    if constexpr (has_arena<Target>::value) {
      const stored_type* begin = source.data(ranges.front().variable) + ranges.front().begin;
      const stored_type* end = source.data(ranges.back().variable) + ranges.back().end;
      stored_type* to = target.data(ranges.front().variable) + ranges.front().begin;
      TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(to, begin, static_cast<std::size_t>(end - begin) * sizeof(stored_type), cudaMemcpyDefault,
                                           stream.get()));
    } else {
      std::vector<void*> to;
      std::vector<const void*> from;
      std::vector<std::size_t> bytes;
      for (const element_range& r : ranges) {
        to.push_back(target.data(r.variable) + r.begin);
        from.push_back(source.data(r.variable) + r.begin);
        bytes.push_back((r.end - r.begin) * sizeof(stored_type));
      }
      cudaMemcpyAttributes in_stream_order{};
      in_stream_order.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      std::size_t first_copy = 0;
      TOWERPIPE_CUDA_CHECK(cudaMemcpyBatchAsync(to.data(), from.data(), bytes.data(), to.size(), &in_stream_order,
                                                &first_copy, 1, stream.get()));
    }
  }

  thread_pool bucket_pool_;  // the host passes of buckets that go during the towers
  host_optimizer_pass<Optim, Layout> pass_;
  master_buffer master_;
  pinned_buffer rounded_;  // mixed precision: the new parameters rounded, for the uploads (else empty)
  std::vector<chunk_group> groups_;   // the whole step's transfer groups
  chunks_by_variable by_variable_;    // a part's chunks
  std::vector<std::unique_ptr<link>> links_;
  std::vector<std::size_t> upload_leader_;  // per tower: the first tower on its device, which uploads for it
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::cuda, reduce::host, Optim, Layout> {
  using type = detail::cuda_host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
