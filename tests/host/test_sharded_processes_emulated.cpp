// reduce::sharded for GPU towers across processes (reduce/sharded/gpu_towers_across_processes.cuh) run on
// the host with its own wiring: the exchange plan and buffers (plan/exchange_plan.hpp,
// wiring/exchange_buffers.hpp), each process's owner (wiring/owner_wiring.hpp), its copies of the
// local towers tower 0's device does not reach (wiring/copy_wiring.hpp), the per-element programs
// (kernels/process_agents.hpp) through the host dispatch; the transport done by copies of the plan's
// blocks. Every process's replicas must equal one process with all towers, bitwise; with 16-bit towers
// (mixed precision) the fp32 master too, and the replicas' 16-bit patterns its rounded copy.
#include <towerpipe/wiring/copy_wiring.hpp>
#include <towerpipe/wiring/exchange_buffers.hpp>
#include <towerpipe/plan/exchange_plan.hpp>
#include <towerpipe/programs/host_dispatch.hpp>
#include <towerpipe/wiring/owner_wiring.hpp>
#include <towerpipe/kernels/process_agents.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <deque>

#include "emulated_towers.hpp"
#include "test_support.hpp"

using namespace towerpipe;
using namespace towerpipe::detail;
using namespace towerpipe_tests;

namespace {

// One process: its towers, and the reducer's plan, owner, buffers and copies over them.
template <class Optim, class Layout>
struct emulated_process {
  using stored_type = typename Layout::value_type;
  static constexpr bool mixed = !std::is_same<stored_type, float>::value;

  emulated_process(const variable_set& variables, int processes, int rank, std::size_t local_towers,
                   const typename Optim::hyper_parameters& h, bool checked, topology links)
      : towers(variables, local_towers, h, screen_tile_elements, links),
        plan(towers.chunks(), variables.count(), processes, rank, contributions_per_process(local_towers)),
        owner(plan.mine(), towers.chunks(), variables.count(), Optim::state_slots(h), owner_keeps{checked, true}, host_memory{}),
        buffers(plan, variables, host_memory{}),
        copies(towers, 0, nan_filled_memory{}, false),
        broadcast(towers, copies, buffers.gathered.get(), variables, nan_filled_memory{}),
        starts(padded_flat_starts(variables)) {}

  // The pipeline's set_parameter, as the reducer hears it (parameter_set): its slice of the master copy;
  // with mixed precision also the whole master in the gathered buffer, which master_on_host reads.
  void parameter_set(std::size_t v, const std::vector<float>& values) {
    set_master_slice(owner, v, values);
    if (mixed) std::copy(values.begin(), values.end(), buffers.gathered.get() + starts[v]);
  }
  tensor_view<const float> master(std::size_t v) const {
    return tensor_view<const float>(buffers.gathered.get() + starts[v], towers.variables()[v].shape);
  }
  // The owner's optimizer: its master copy of the slice, which the gather sends.
  optimizer_apply<Optim, float> apply(const typename Optim::template step_constants<float>& c) {
    return {table(owner.master(), count()), table(owner.state(), count()), 1, owner.slots(), c, {}};
  }
  rows_sum_source<float> rows() const { return {const_table(buffers.received_rows, count()), plan.rows()}; }
  int count() const { return towers.count(); }

  emulated_towers<Optim, Layout> towers;
  exchange_plan plan;
  slice_owner<float, host_memory> owner;
  exchange_buffers<float, host_memory> buffers;
  tower_copies<typename emulated_towers<Optim, Layout>::copy_buffer> copies;
  gathered_broadcast<stored_type, float, nan_filled_memory> broadcast;
  std::vector<std::size_t> starts;  // padded_flat_starts
};

char* bytes_at(float* buffer, std::size_t byte_offset) { return reinterpret_cast<char*>(buffer) + byte_offset; }

// One step of every process: contributions, the all-to-all, each owner's pass(es), the gather and the
// local broadcast. Checked: the screen over every owner's tiles in owner order, and the first non-finite
// key over the senders' raw screens and the owners' sums; skipped steps stop there.
template <class Optim, class Layout>
screen_partials emulated_process_step(std::deque<emulated_process<Optim, Layout>>& processes, const std::vector<float>& weights,
                                      bool checked, double max_norm, const typename Optim::template step_constants<float>& c) {
  screen_partials partials;
  for (std::size_t p = 0; p < processes.size(); ++p) {
    auto& sender = processes[p];
    const int towers = static_cast<int>(sender.towers.towers());
    run_copies_on_host(sender.copies.gradients_in());
    contribution_agent<float, typename emulated_process<Optim, Layout>::stored_type> agent{const_table(sender.copies.gradients(), sender.count()), towers, sender.plan.contributions() == 1, {},
                                    static_cast<unsigned>(p) * static_cast<unsigned>(towers), {},
                                    checked ? &partials.first_nonfinite : nullptr};
    std::copy(weights.begin() + static_cast<std::ptrdiff_t>(p) * towers, weights.begin() + static_cast<std::ptrdiff_t>(p + 1) * towers,
              agent.weights.value);
    for (int owner = 0; owner < sender.plan.processes(); ++owner) {
      agent.rows = table(sender.buffers.send_rows[static_cast<std::size_t>(owner)], sender.count());
      run_agent_on_host(agent, sender.plan.slice(owner).chunk_list(sender.towers.chunks()));
    }
  }
  for (std::size_t owner = 0; owner < processes.size(); ++owner) {
    for (std::size_t p = 0; p < processes.size(); ++p) {
      const auto out = processes[p].plan.send_blocks(sizeof(float));
      const auto in = processes[owner].plan.receive_blocks(sizeof(float));
      REQUIRE(out.bytes[owner] == in.bytes[p]);
      std::memcpy(bytes_at(processes[owner].buffers.received.get(), in.offsets[p]),
                  bytes_at(processes[p].buffers.send.get(), out.offsets[owner]), in.bytes[p]);
    }
  }
  float coefficient = 1.0f;
  if (checked) {
    for (auto& owner : processes) {
      const pointer_table<float> averaged = table(owner.owner.average(), owner.count());
      const accumulating_source<rows_sum_source<float>, float> source{owner.rows(), averaged, {}};
      screen_tiles(source, averaged, make_chunk_table(owner.plan.mine().ranges, screen_tile_elements), partials);
    }
    if (partials.first_nonfinite != no_nonfinite) return partials;
    coefficient = clip_coefficient(partials, max_norm);
  }
  for (auto& owner : processes) {
    if (checked) {
      const pointer_table<const float> average = const_table(owner.owner.average(), owner.count());
      run_agent_on_host(fused_apply_agent<Optim, float, 1>{average, 1, {coefficient}, owner.apply(c)}, owner.owner.chunks());
    } else {
      run_agent_on_host(rows_apply_agent<Optim, float>{owner.rows(), owner.apply(c)}, owner.owner.chunks());
    }
  }
  for (auto& process : processes) {
    const auto blocks = process.plan.gather_blocks(sizeof(float));
    for (std::size_t owner = 0; owner < processes.size(); ++owner)
      std::memcpy(bytes_at(process.buffers.gathered.get(), blocks.offsets[owner]), processes[owner].owner.master_storage(),
                  blocks.bytes[owner]);
    if (process.broadcast.target_count() > 0)
      run_agent_on_host(copy_agent<float, typename emulated_process<Optim, Layout>::stored_type>{
                            const_table(process.buffers.gathered_flat, process.count()), table(process.broadcast.targets(), process.count()),
                            process.broadcast.target_count()},
                        process.towers.chunks());
    run_copies_on_host(process.broadcast.copies());
  }
  return partials;
}

// Layout's 16-bit types (mixed precision, checked steps only) against the host's mixed pipeline.
template <class Optim, class Layout>
void check_emulated_processes(const typename Optim::hyper_parameters& h, bool checked, topology links, std::uint64_t salt) {
  using stored_type = typename Layout::value_type;
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<stored_type>>;
  constexpr bool mixed = !std::is_same<stored_type, float>::value;
  // "tail" spans five screen tiles (the chunks here), the last one partial: slices cut through it.
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {9001}}};
  random_source random(salt);
  for (int count = 1; count <= 3; ++count) {
    for (std::size_t towers = 1; towers <= 4; ++towers) {
      INFO(Optim::name << " " << Layout::name << (checked ? ", checked" : "") << ", topology " << static_cast<int>(links) << ", "
                       << count << " processes x " << towers << " towers, seed " << random.seed());
      const std::size_t all = towers * static_cast<std::size_t>(count), examples = 3 * all - 1;
      pipeline_options options;
      if (checked) options.max_grad_norm = 3.0;
      else options.on_nonfinite = nonfinite_policy::unchecked;
      trainer reference(variables, {{"x", dtype::float32, {1}}}, all, h, options);
      std::deque<emulated_process<Optim, Layout>> processes;  // never moved: the wiring points into each one's towers
      for (int r = 0; r < count; ++r) processes.emplace_back(variables, count, r, towers, h, checked, links);
      std::vector<float> weights;
      for (const shard& s : plan_split(examples, all, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
      for (std::size_t v = 0; v < variables.count(); ++v) {
        const std::vector<float> initial = random.normal(variables[v].size);
        reference.set_parameter(v, initial.data(), initial.size());
        for (auto& p : processes) {
          for (std::size_t t = 0; t < towers; ++t) set_replica(p.towers, t, v, initial);
          p.parameter_set(v, initial);
        }
      }
      const std::vector<float> x(examples, 1.0f);
      batch b;
      b.add("x", x.data(), examples, {1});
      std::int64_t done = 0;
      for (int step = 1; step <= 5; ++step) {
        INFO("step " << step);
        auto grads = draw_gradients<stored_type>(random, variables, all);
        if (checked && step == 3) grads[all - 1][3][7000] = quiet_nan<stored_type>();
        const step_stats stats = reference_step(reference, b, grads);
        for (std::size_t g = 0; g < all; ++g) {
          for (std::size_t v = 0; v < variables.count(); ++v)
            std::copy(grads[g][v].begin(), grads[g][v].end(), processes[g / towers].towers.gradients(g % towers).data(v));
        }
        for (auto& p : processes) p.towers.poison_replicas();
        const auto constants = Optim::template constants<float>(h, done + 1);
        const screen_partials partials = emulated_process_step(processes, weights, checked, options.max_grad_norm, constants);
        if (stats.skipped) {
          check_same_nonfinite(partials, stats);
          // The skipped step wrote nothing; the replicas the test poisoned get the reference's values back.
          for (auto& p : processes) {
            for (std::size_t t = 1; t < towers; ++t) {
              for (std::size_t v = 0; v < variables.count(); ++v) {
                const auto expected = reference.execution_space().shared_parameters().view(v);
                std::copy(expected.begin(), expected.end(), p.towers.replica(t).data(v));
              }
            }
          }
          continue;
        }
        ++done;
        if (checked) CHECK(std::sqrt(partials.sum_of_squares()) == *stats.gradient_norm);
        for (auto& p : processes) {
          for (std::size_t v = 0; v < variables.count(); ++v) {
            if (mixed) REQUIRE(first_bitwise_difference(p.master(v), reference.parameter(v)) == -1);
            for (std::size_t t = 0; t < towers; ++t)
              REQUIRE(first_bitwise_difference(p.towers.replica(t).view(v), reference.execution_space().shared_parameters().view(v)) == -1);
          }
        }
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated GPU towers across processes (contributions, exchange, owners, gather) equal one process "
                   "bitwise",
                   "[multi_tensor][sharded]", layout::flat<float>, layout::per_variable<float>) {
  for (topology links : {topology::one_device, topology::one_device_no_direct_access}) {
    for (bool checked : {false, true}) {
      for_each_optimizer(81, [&](auto optimizer, const auto& h, std::uint64_t salt) {
        check_emulated_processes<typename decltype(optimizer)::type, TestType>(h, checked, links, salt);
      });
    }
  }
}

TEMPLATE_TEST_CASE("emulated GPU towers across processes with bf16 and fp16 towers equal one process's mixed-precision pipeline "
                   "bitwise (fp32 master gathered, replicas rounded)",
                   "[multi_tensor][sharded][mixed]", layout::flat<bfloat16>, layout::per_variable<float16>) {
  for (topology links : {topology::one_device, topology::one_device_no_direct_access}) {
    for_each_optimizer(91, [&](auto optimizer, const auto& h, std::uint64_t salt) {
      check_emulated_processes<typename decltype(optimizer)::type, TestType>(h, true, links, salt);  // mixed: checked steps
    });
  }
}
