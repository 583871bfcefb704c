#pragma once
// reduce::host — the parameter server on the CPU, done well: one pass over memory that averages the
// towers' gradients in the canonical order, applies the optimizer and writes the parameters, spread
// over the thread pool. The pass itself: reduce/common/host_pass.hpp (bitwise reproducible run to run).
// Why: docs/design-notes.md#reduce-common-host_pass

#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/core/policy_kinds.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/host.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/layout/precision.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/reduce/common/backend_traits.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/reduce/common/host_pass.hpp"
#include "towerpipe/reduce/common/reducer_for.hpp"
#include "towerpipe/step/stats.hpp"

namespace towerpipe {
namespace detail {

// reduce::host with exec::host (the reducer contract: reduce/common/contract.hpp). Mixed precision (a
// bf16 or fp16 layout): the towers' shared parameters are the rounded copy of a master in the master
// type that this reducer keeps, and every step is a checked one (the screen widens the gradients).
template <class Optim, class Layout>
class host_reducer {
 public:
  using towers_type = host_towers<Layout>;
  using master_type = typename precision<Layout>::master_type;
  static constexpr bool mixed = precision<Layout>::mixed;
  using tower_buffer = typename Layout::template buffer<host_memory>;
  using buffer = typename Layout::template buffer<host_memory, master_type>;
  static constexpr reducer_capabilities capabilities{};

  explicit host_reducer(const reducer_setup<towers_type, Optim>& setup)
      : towers_(setup.towers), pass_(setup.variables, setup.hyper), master_(variables_if(mixed, setup.variables)) {}

  backend_choice choice() const { return named_by_type("host"); }
  // A bucket goes on the calling thread, what the towers left on the pool (run_part_on).
  bool buckets_during_towers() const { return true; }

  void begin_step(towers_type&, const step_work<master_type, Optim>& work) {
    work_ = work;
    if (work_.checked) partials_ = pass_.fresh_partials();
  }
  // The fused pass over the part's chunks, in the towers' shared parameters (nothing to broadcast); a
  // checked step's average and screen (kernels/screen.hpp).
  void reduce_part(towers_type& towers, const step_part& part) {
    if (!part.during_towers()) rest_started_ = step_clock::now();
    run_part_on(towers.pool(), part, [&](auto& runner) {
      const std::vector<std::size_t> chunks = pass_.by_variable().list(part.variables);
      if (work_.checked) {
        pass_.screen(runner, chunks, gradient_buffers(towers), work_.weights, work_.window, partials_);
      } else if constexpr (!mixed) {
        pass_.run(runner, chunks, gradient_buffers(towers), towers.shared_parameters(), work_.weights, work_.constants);
      }
    });
  }
  screen_partials finish(towers_type&, stage_seconds& stages) {
    stages.reduce = seconds_since(rest_started_);
    return work_.checked ? std::move(partials_) : screen_partials{};
  }
  // A checked step's second pass: the optimizer on scale * the average, over every chunk.
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    const auto start = step_clock::now();
    const std::vector<const buffer*> average{&pass_.averaged()};
    const std::vector<std::size_t> chunks = pass_.chunk_range(0, pass_.chunks().size());
    if constexpr (mixed) {
      pass_.run(towers.pool(), chunks, average, master_, std::vector<master_type>{scale}, work_.constants, &towers.shared_parameters());
    } else {
      pass_.run(towers.pool(), chunks, average, towers.shared_parameters(), std::vector<master_type>{scale}, work_.constants);
    }
    stages.reduce += seconds_since(start);
  }
  // Every pass ran on the calling thread or the pool, which are done: nothing is in flight.
  void abandon(towers_type&) {}

  std::size_t state_slots() const { return pass_.state_slots(); }
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) const { return pass_.state_view(slot, index); }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) { pass_.set_state(slot, index, values); }
  tensor_view<const master_type> master(std::size_t index) const {
    if constexpr (mixed) return master_.view(index);
    else return towers_.parameter_on_host(index);
  }
  void set_master(std::size_t index, const master_type* values) {
    if constexpr (mixed) std::copy(values, values + master_.view(index).size(), master_.data(index));
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return std::vector<std::size_t>(towers_.towers(), 0); }  // host memory

 private:
  static std::vector<const tower_buffer*> gradient_buffers(towers_type& towers) {
    std::vector<const tower_buffer*> gradients;
    for (std::size_t t = 0; t < towers.towers(); ++t) gradients.push_back(&towers.gradients(t));
    return gradients;
  }

  towers_type& towers_;
  host_optimizer_pass<Optim, Layout> pass_;
  buffer master_;  // mixed precision only (else empty)
  step_work<master_type, Optim> work_;
  screen_partials partials_;  // a checked step's screen as its parts go
  step_clock::time_point rest_started_;
};

}  // namespace detail

namespace reduce {

// Average + optimizer on the CPU (see the top of this header).
struct host {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "host";
  // GPU towers on one device, in device-memory bytes: the gradients down and the parameters up over PCIe
  // (77x slower than device memory on the H200 machine), and the host pass (38x slower).
  static double one_device_bytes(std::size_t towers, std::size_t element_bytes) {
    const double e = static_cast<double>(element_bytes), n = static_cast<double>(towers);
    return 77 * (n + 1) * e + 38 * (n * e + 24 + e);
  }
  // GPU towers on several devices: every tower's gradient down and its parameters up over its own device's link.
  static double busiest_link_elements(const std::vector<int>& devices) {
    std::map<int, double> load;
    for (const auto& [device, towers] : detail::towers_per_device(devices)) load[device] = static_cast<double>(towers);
    return detail::busiest(load);
  }
  static constexpr backend_traits traits{
      name, true, true, false, 1.0, &one_device_bytes, &busiest_link_elements, true,
      "one pass over host memory (reduce::sharded took 1.5-5.1x its time in one process)"};
};

}  // namespace reduce

template <class Optim, class Layout>
struct reducer_for<exec::host, reduce::host, Optim, Layout> {
  using type = detail::host_reducer<Optim, Layout>;
};

}  // namespace towerpipe
