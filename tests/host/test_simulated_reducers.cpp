// The library's own device reducers — reduce::device0, p2p_tree, sharded (in one process and across
// processes), host with device towers, and reduce::automatic over them — run on simulated devices
// (exec::simulated: the executor that checks stream order, peer access, alignment and bounds), against
// the exec::host pipeline: after every step the parameters, the optimizer state and the step's report
// (loss, norm, skip, clip, the first non-finite element) must be bitwise the host's, under several
// interleaving seeds, over 1-16 towers on 1-4 devices with and without peer access, fp32, bf16 and fp16,
// both layouts, buckets marked during the towers or not, checked and unchecked steps, accumulation,
// NaN and infinity steps, clipping, loss scaling and checkpoints.
//
// The tower functions run on the host "as" their stream (exec/device_tower_context.hpp): each writes its
// gradients from the test's plan with write_gradient, a copy on its stream, and marks them ready in
// backward order. The reference towers take the same calls.
#include <towerpipe/comm/thread_group.hpp>
#include <towerpipe/io/checkpoint.hpp>
#include <towerpipe/simulated.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "reference_runs.hpp"
#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::clipped;
using towerpipe_tests::compare_with_host;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::plan_tower;
using towerpipe_tests::random_source;
using towerpipe_tests::run_case;
using towerpipe_tests::run_step;
using towerpipe_tests::small_buckets;
using towerpipe_tests::step_gradients;
using towerpipe_tests::unchecked;

namespace {

// "w" spans several 4096-element chunks (the real chunk size: slices and tiles end where a GPU's do);
// "odd" ends inside a vector group; "s" is one element.
const variable_set sim_variables{{"w", {90, 100}}, {"b", {100}}, {"s", {}}, {"odd", {5003}}};
const std::vector<input_spec> sim_inputs{{"x", dtype::float32, {1}}};

// A simulated machine: `devices` devices, towers round-robin over them; `peers`: every pair reaches the other.
struct machine_case {
  std::size_t towers = 2;
  int devices = 1;
  bool peers = true;
  bool direct = true;  // pipeline_options::direct_device_access
  std::uint64_t seed = 1;
};

std::string describe(const machine_case& m) {
  return std::to_string(m.towers) + " towers on " + std::to_string(m.devices) + " device(s)" + (m.peers ? "" : ", no peer access") +
         (m.direct ? "" : ", direct access off") + ", interleaving seed " + std::to_string(m.seed);
}

std::shared_ptr<sim::machine> make_machine(const machine_case& m) {
  sim::machine_config config;
  config.devices = m.devices;
  config.seed = m.seed;
  if (m.peers)
    for (int a = 0; a < m.devices; ++a)
      for (int b = 0; b < m.devices; ++b)
        if (a != b) config.peers.insert({a, b});
  return std::make_shared<sim::machine>(config);
}

pipeline_options on_machine(pipeline_options options, const machine_case& m, const std::shared_ptr<sim::machine>& machine) {
  options.simulation = machine;
  options.direct_device_access = m.direct;
  options.devices.clear();
  for (std::size_t t = 0; t < m.towers; ++t) options.devices.push_back(static_cast<int>(t % static_cast<std::size_t>(m.devices)));
  return options;
}

template <class Stored>
std::vector<step_gradients<Stored>> draw_plan(random_source& random, std::size_t towers, int steps) {
  return towerpipe_tests::draw_plan<Stored>(random, sim_variables, towers, steps);
}

template <class Reduce, class Layout, class Optim = optim::adam>
void check_simulated(const machine_case& m, const run_case& c, std::uint64_t salt) {
  random_source random(salt);
  INFO(Reduce::name << " " << Layout::name << " " << sizeof(typename Layout::value_type) << "-byte values, " << describe(m)
                    << ", seed " << random.seed());
  const auto machine = make_machine(m);
  using simulated_trainer = pipeline<exec::simulated, Reduce, Optim, Layout>;
  const auto make = [&] {
    return std::make_unique<simulated_trainer>(sim_variables, sim_inputs, m.towers, typename Optim::hyper_parameters{},
                                               on_machine(c.options, m, machine));
  };
  compare_with_host<Layout, Optim>(sim_variables, sim_inputs, m.towers, c, random, make, [](int, simulated_trainer&) {});
  machine->check();  // nothing found while freeing
}

// The cases every backend runs, fp32, with the seeds given.
template <class Reduce>
void check_backend_fp32(std::uint64_t salt) {
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    check_simulated<Reduce, layout::flat<float>>({4, 1, true, true, seed}, {small_buckets(unchecked())}, salt + seed);
    check_simulated<Reduce, layout::per_variable<float>>({3, 2, true, true, seed}, {clipped(small_buckets({})), true, 4, 2}, salt + 20 + seed);
  }
  // Towers on several devices without peer access, and one device with direct access off: the copying paths.
  check_simulated<Reduce, layout::flat<float>>({4, 4, false, true, 3}, {small_buckets(unchecked())}, salt + 40);
  check_simulated<Reduce, layout::per_variable<float>>({5, 1, true, false, 4}, {clipped({}), false, 4, 1}, salt + 41);
  check_simulated<Reduce, layout::flat<float>>({2, 2, true, false, 5}, {small_buckets({}), true}, salt + 42);
  // Up to 16 towers (the kernels whose tower count is a run-time value past 8), and one.
  check_simulated<Reduce, layout::flat<float>>({16, 4, true, true, 6}, {clipped(small_buckets({})), true, 3, 1}, salt + 43);
  check_simulated<Reduce, layout::flat<float>>({9, 3, false, true, 7}, {unchecked(), false, 3}, salt + 44);
  check_simulated<Reduce, layout::flat<float>>({1, 1, true, true, 8}, {clipped({}), true, 3, 1}, salt + 45);
}

TEST_CASE("device0 on simulated devices equals the host pipeline bitwise", "[simulated][device0]") {
  check_backend_fp32<reduce::device0>(100);
}
TEST_CASE("p2p_tree on simulated devices equals the host pipeline bitwise", "[simulated][p2p_tree]") {
  check_backend_fp32<reduce::p2p_tree>(200);
}
TEST_CASE("sharded on simulated devices equals the host pipeline bitwise", "[simulated][sharded]") {
  check_backend_fp32<reduce::sharded>(300);
}
TEST_CASE("reduce::host with simulated device towers equals the host pipeline bitwise", "[simulated][host]") {
  check_backend_fp32<reduce::host>(400);
}

TEST_CASE("every backend on simulated devices with bf16 and fp16 towers equals the host's mixed pipeline bitwise",
          "[simulated][mixed]") {
  pipeline_options scaled;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  scaled.loss_scale.initial_scale = 1024;
  const auto both = [&](auto reduce, std::uint64_t salt) {
    using R = decltype(reduce);
    check_simulated<R, layout::flat<bfloat16>>({4, 2, true, true, 1}, {small_buckets(clipped({})), true, 4, 2}, salt);
    check_simulated<R, layout::per_variable<float16>>({3, 3, false, true, 2}, {scaled, true, 4, 1}, salt + 1);
    check_simulated<R, layout::flat<bfloat16>>({2, 1, true, false, 3}, {small_buckets({}), false, 3}, salt + 2);
  };
  both(reduce::device0{}, 500);
  both(reduce::p2p_tree{}, 510);
  both(reduce::sharded{}, 520);
  both(reduce::host{}, 530);
}

TEST_CASE("accumulation, throw_error and checkpoints on simulated devices, bitwise the host's", "[simulated][steps]") {
  pipeline_options accumulating = small_buckets({});
  accumulating.accumulation_steps = 3;
  pipeline_options throwing;
  throwing.on_nonfinite = nonfinite_policy::throw_error;
  const auto each = [&](auto reduce, std::uint64_t salt) {
    using R = decltype(reduce);
    check_simulated<R, layout::flat<float>>({3, 2, true, true, 2}, {accumulating, true, 7, 4}, salt);
    check_simulated<R, layout::per_variable<float>>({2, 2, false, true, 3}, {unchecked(), true, 4, -1, true}, salt + 1);
    check_simulated<R, layout::flat<bfloat16>>({4, 1, true, true, 4}, {clipped({}), true, 4, -1, true}, salt + 2);
    // throw_error: the NaN step throws on both, naming the same element; both change nothing.
    const machine_case m{3, 3, true, true, 5};
    const auto machine = make_machine(m);
    pipeline<exec::simulated, R, optim::adam, layout::flat<float>> simulated(sim_variables, sim_inputs, 3, {}, on_machine(throwing, m, machine));
    random_source random(salt + 3);
    auto plan = draw_plan<float>(random, 3, 1);
    plan[0][1][3][17] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(run_step(simulated, plan[0], 8, true),
                      Catch::Contains("non-finite averaged gradient at element 17") && Catch::Contains("tower 1's gradient"));
    CHECK(simulated.steps_done() == 0);
  };
  each(reduce::device0{}, 600);
  each(reduce::p2p_tree{}, 610);
  each(reduce::sharded{}, 620);
  each(reduce::host{}, 630);
}

TEST_CASE("reduce::automatic on simulated devices picks a backend and trains bitwise, and timing them changes no bit",
          "[simulated][automatic]") {
  check_simulated<reduce::automatic, layout::flat<float>>({4, 1, true, true, 1}, {small_buckets({})}, 700);
  check_simulated<reduce::automatic, layout::flat<float>>({4, 4, true, true, 2}, {unchecked()}, 701);
  check_simulated<reduce::automatic, layout::flat<bfloat16>>({2, 2, false, true, 4}, {clipped({}), true, 3}, 702);
  pipeline_options timed = clipped({});
  timed.time_backends = 2;
  check_simulated<reduce::automatic, layout::flat<float>>({3, 2, true, true, 3}, {timed, true, 3}, 703);
  timed = unchecked();
  timed.time_backends = 2;
  check_simulated<reduce::automatic, layout::per_variable<float>>({3, 1, true, true, 5}, {timed, true, 3}, 704);
}

// reduce::sharded across processes: R ranks (threads with a thread_process_group), each with simulated
// device towers, against one host pipeline with all R * L towers.
template <class Layout>
void check_across_processes(int ranks, std::size_t local, const run_case& c, std::uint64_t salt) {
  using stored = typename Layout::value_type;
  random_source random(salt);
  const std::size_t towers = local * static_cast<std::size_t>(ranks);
  INFO(ranks << " processes x " << local << " simulated towers, " << Layout::name << ", seed " << random.seed());
  const auto plan = draw_plan<stored>(random, towers, c.steps);
  std::vector<std::vector<float>> initial;
  for (const variable& v : sim_variables) initial.push_back(random.normal(v.size));
  const std::size_t examples = 3 * towers - 1;
  pipeline<exec::host, reduce::host, optim::adam, Layout> reference(sim_variables, sim_inputs, towers, {}, c.options);
  for (std::size_t v = 0; v < initial.size(); ++v) reference.set_parameter(v, initial[v].data(), initial[v].size());
  std::vector<step_stats> expected;
  for (int s = 0; s < c.steps; ++s) expected.push_back(run_step(reference, plan[static_cast<std::size_t>(s)], examples, c.mark));
  const auto group = thread_process_group::create(ranks);
  std::vector<std::vector<std::vector<float>>> parameters(static_cast<std::size_t>(ranks));
  const std::vector<std::string> errors = towerpipe_tests::on_every_rank(static_cast<std::size_t>(ranks), [&](std::size_t r) {
    const machine_case m{local, 2, r % 2 == 0, true, salt + r};
    const auto machine = make_machine(m);
    pipeline_options options = on_machine(c.options, m, machine);
    options.processes = group[r];
    pipeline<exec::simulated, reduce::sharded, optim::adam, Layout> p(sim_variables, sim_inputs, local, {}, options);
    for (std::size_t v = 0; v < initial.size(); ++v) p.set_parameter(v, initial[v].data(), initial[v].size());
    const batch_part part = p.process_part(examples);
    std::vector<float> x(examples);
    for (std::size_t e = 0; e < examples; ++e) x[e] = static_cast<float>(e);  // each rank's part its own
    for (int s = 0; s < c.steps; ++s) {
      batch b;
      b.add("x", x.data() + part.first, part.examples, {1});
      std::vector<std::vector<std::vector<stored>>> mine(plan[static_cast<std::size_t>(s)].begin() + static_cast<std::ptrdiff_t>(r * local),
                                                          plan[static_cast<std::size_t>(s)].begin() + static_cast<std::ptrdiff_t>((r + 1) * local));
      const step_stats stats = p.step(b, plan_tower<stored>{&mine, c.mark});
      if (stats.skipped != expected[static_cast<std::size_t>(s)].skipped) detail::fail("rank ", r, " step ", s + 1, ": skipped differs");
    }
    for (std::size_t v = 0; v < sim_variables.count(); ++v) parameters[r].emplace_back(p.parameter(v).begin(), p.parameter(v).end());
    machine->check();
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    if (!errors[static_cast<std::size_t>(r)].empty()) UNSCOPED_INFO(errors[static_cast<std::size_t>(r)]);
    for (std::size_t v = 0; v < sim_variables.count() && errors[static_cast<std::size_t>(r)].empty(); ++v)
      CHECK(first_bitwise_difference(parameters[static_cast<std::size_t>(r)][v], reference.parameter(v)) == -1);
  }
}

TEST_CASE("sharded across processes on simulated devices equals one host pipeline with every tower bitwise",
          "[simulated][sharded][processes]") {
  check_across_processes<layout::flat<float>>(2, 2, {small_buckets(unchecked())}, 800);
  check_across_processes<layout::per_variable<float>>(3, 3, {clipped({}), true, 4, 1}, 801);
  check_across_processes<layout::flat<bfloat16>>(2, 4, {small_buckets({}), true, 3}, 802);
  check_across_processes<layout::flat<float>>(4, 1, {{}, false, 3}, 803);
  // More processes than chunks: some owners hold no chunk and no screen tile (their tables are empty, and
  // nothing may be copied from or to them).
  check_across_processes<layout::flat<float>>(8, 1, {{}, false, 2}, 804);
}

}  // namespace

namespace {

// One step through a reducer as the pipeline drives it (reduce/common/contract.hpp), every variable as
// one part: the work the executor was given, counted by the simulated machine.
template <class Reduce>
sim::op_counts one_step_counts(bool checked) {
  using layout_type = layout::flat<float>;
  using towers_type = exec::simulated::towers<layout_type>;
  using reducer_type = typename reducer_for<exec::simulated, Reduce, optim::adam, layout_type>::type;
  const machine_case m{4, 1, true, true, 1};
  const auto machine = make_machine(m);
  pipeline_options options = on_machine(checked ? pipeline_options{} : unchecked(), m, machine);
  const detail::processes one_process(options, checked, m.towers, {});
  towers_type towers(sim_variables, m.towers, options);
  reducer_type reducer(detail::reducer_setup<towers_type, optim::adam>{sim_variables, {}, towers, options, one_process});
  detail::step_work<float, optim::adam> work;
  work.weights.assign(m.towers, 0.25f);
  work.checked = checked;
  work.constants = optim::adam::constants<float>({}, 1);
  const std::vector<std::size_t> every_variable = detail::every_variable(sim_variables.count());
  machine->reset_counts();
  stage_seconds stages;
  reducer.begin_step(towers, work);
  reducer.reduce_part(towers, detail::step_part{every_variable, detail::no_bucket});
  reducer.finish(towers, stages);
  if (checked) reducer.apply(towers, 1.0f, stages);
  return machine->counts();
}

}  // namespace

// What a GPU runs per step must not grow: the launches, copies and memsets of one step of each backend
// (4 towers on one device, every tower reached in place), as read off the reducers of 61d708b, which
// the GPU benchmark measured. device0: one fused pass (checked: the screen and the apply; the key read
// twice, the tile sums once; the key reset). p2p_tree: the round of edges (0, 1) and (2, 3), the root's
// edge, the pull of tower 3 (towers 1 and 2 are the root's children: its pass writes them); checked, the
// root's edge is the screen (its key read twice, the tile sums once), every node's key reset and read,
// the screen's reset, and the apply's pass and pull. sharded: a
// pass per owner (checked: per owner a screen, its key read twice and its tile sums once, a reset and
// an apply). host: each tower's gradients down in one copy (layout::flat, one transfer group), the
// parameters up once into tower 0's replica and copied on the device into the three others.
TEST_CASE("a step launches, copies and sets no more than the reducers of 61d708b did", "[simulated][budget]") {
  const auto check = [](sim::op_counts c, std::size_t launches, std::size_t copies, std::size_t memsets) {
    CHECK(c.launches == launches);
    CHECK(c.copies == copies);
    CHECK(c.memsets == memsets);
  };
  check(one_step_counts<reduce::device0>(false), 1, 0, 0);
  check(one_step_counts<reduce::device0>(true), 2, 3, 1);
  check(one_step_counts<reduce::p2p_tree>(false), 4, 0, 0);
  check(one_step_counts<reduce::p2p_tree>(true), 5, 7, 5);
  check(one_step_counts<reduce::sharded>(false), 4, 0, 0);
  check(one_step_counts<reduce::sharded>(true), 8, 12, 4);
  check(one_step_counts<reduce::host>(false), 0, 8, 0);
  check(one_step_counts<reduce::host>(true), 0, 8, 0);
}
