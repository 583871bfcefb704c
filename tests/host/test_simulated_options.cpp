// What the device towers and reducers do besides averaging, on simulated devices (exec::simulated):
// poison_gradients (a fill and a find on each tower's stream), the timeline's device rows (each tower's
// compute and shard copy, device0's pass, p2p_tree's edges and pulls), and across processes a step
// refused after its batch was staged on the devices, the optimizer state gathered from every owner and
// set back, and a failed step after which the next one runs. test_simulated_reducers.cpp holds the
// bitwise runs.
#include <towerpipe/comm/thread_group.hpp>
#include <towerpipe/simulated.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "test_support.hpp"

using namespace towerpipe;

namespace {

const variable_set variables{{"w", {90, 100}}, {"b", {100}}};  // "w" spans several 4096-element chunks
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

std::shared_ptr<sim::machine> machine_of(int devices) {
  sim::machine_config config;
  config.devices = devices;
  config.seed = 3;
  for (int a = 0; a < devices; ++a)
    for (int b = 0; b < devices; ++b)
      if (a != b) config.peers.insert({a, b});
  return std::make_shared<sim::machine>(config);
}

pipeline_options on(const std::shared_ptr<sim::machine>& machine, std::size_t towers, int devices) {
  pipeline_options options;
  options.simulation = machine;
  for (std::size_t t = 0; t < towers; ++t) options.devices.push_back(static_cast<int>(t) % devices);
  return options;
}

// A tower function that writes every gradient element (tower t's value t + 1) but element `skipped` of
// "w" on tower `tower`.
struct writes_all_but {
  std::size_t tower, skipped;
  template <class Context>
  double operator()(Context& t) const {
    for (std::size_t v = 0; v < t.variables().count(); ++v) {
      const auto g = t.gradient(v);
      for (std::size_t i = 0; i < g.size(); ++i)
        if (v != 0 || t.tower() != tower || i != skipped) g[i] = static_cast<float>(t.tower() + 1);
    }
    return 0.0;
  }
};

template <class Pipeline>
step_stats step_on(Pipeline& p, const writes_all_but& tower_function) {
  const std::vector<float> x(2 * p.towers(), 1.0f);
  batch b;
  b.add("x", x.data(), x.size(), {1});
  return p.step(b, tower_function);
}

std::set<std::string> names_on_row(const std::vector<timeline::span>& spans, const std::string& row) {
  std::set<std::string> names;
  for (const timeline::span& s : spans)
    if (s.row == row) names.insert(s.name);
  return names;
}

}  // namespace

TEST_CASE("poison_gradients on simulated device towers names an unwritten element and changes nothing", "[simulated][contract]") {
  const auto machine = machine_of(2);
  pipeline_options options = on(machine, 3, 2);
  options.poison_gradients = true;
  pipeline<exec::simulated, reduce::device0, optim::sgd, layout::flat<float>> p(variables, inputs, 3, {}, options);
  step_on(p, {99, 0});  // every element written: fine
  const float before = p.parameter("w")[4321];
  REQUIRE_THROWS_WITH(step_on(p, {2, 4321}),
                      Catch::Contains("tower 2: element 4321 (index (43, 21)) of the gradient of variable 'w' [90, 100] was not written"));
  CHECK(p.steps_done() == 1);
  CHECK(p.parameter("w")[4321] == before);
  step_on(p, {99, 0});  // and the pipeline goes on
  CHECK(p.steps_done() == 2);
  // Two steps of sgd (learning rate 1e-3) on the towers' mean gradient (1 + 2 + 3) / 3 = 2 from zero.
  CHECK(p.parameter("w")[4321] == Approx(-0.004).epsilon(1e-5));
  machine->check();
}

TEST_CASE("device0 averages 6, 7 and 8 towers with the kernels unrolled for them, and refuses more than 64 towers",
          "[simulated][device0]") {
  for (std::size_t towers : {6, 7, 8}) {
    INFO(towers << " towers");
    for (nonfinite_policy policy : {nonfinite_policy::unchecked, nonfinite_policy::skip}) {  // the fused pass, the screen
      const auto machine = machine_of(2);
      pipeline_options options = on(machine, towers, 2);
      options.on_nonfinite = policy;
      pipeline<exec::simulated, reduce::device0, optim::sgd, layout::flat<float>> p(variables, inputs, towers, {}, options);
      step_on(p, {99, 0});
      // One sgd step (learning rate 1e-3) from zero on the mean of 1, ..., towers.
      const double mean = (static_cast<double>(towers) + 1) / 2;
      CHECK(p.parameter("w")[1234] == Approx(-1e-3 * mean).epsilon(1e-6));
      CHECK(p.parameter("b")[99] == Approx(-1e-3 * mean).epsilon(1e-6));
      machine->check();
    }
  }
  const auto machine = machine_of(1);
  using device0_trainer = pipeline<exec::simulated, reduce::device0, optim::sgd, layout::flat<float>>;
  CHECK_THROWS_WITH(device0_trainer(variables, inputs, 65, {}, on(machine, 65, 1)),
                    Catch::Contains("reduce::device0 takes at most 64 towers, 65 requested"));
}

TEST_CASE("the timeline of simulated device towers holds each tower's compute and copy and the reduction's device spans",
          "[simulated][timeline]") {
  const auto traced = [](auto reduce, std::size_t towers) {
    using R = decltype(reduce);
    const auto machine = machine_of(2);
    timeline trace;
    pipeline_options options = on(machine, towers, 2);
    options.trace = &trace;
    pipeline<exec::simulated, R, optim::sgd, layout::flat<float>> p(variables, inputs, towers, {}, options);
    step_on(p, {99, 0});
    step_on(p, {99, 0});
    machine->check();
    return trace.spans();
  };
  const std::vector<timeline::span> device0 = traced(reduce::device0{}, 3);
  for (std::size_t t = 0; t < 3; ++t) {
    INFO("tower " << t);
    CHECK(names_on_row(device0, "tower " + std::to_string(t) + " (GPU)").count("compute") == 1);
    CHECK(names_on_row(device0, "tower " + std::to_string(t) + " (GPU copy)").count("split copy (host to device)") == 1);
  }
  CHECK(names_on_row(device0, "reduce (GPU)").count("device0 average + screen") == 1);  // a checked step
  CHECK(names_on_row(device0, "reduce (GPU)").count("device0 apply + broadcast") == 1);
  // Four towers: edges (0, 1) and (2, 3), then the root's edge (0, 2) in its pass; towers 1 and 2 are the
  // root's children (its pass writes their parameters), tower 3 pulls from tower 2.
  const std::vector<timeline::span> tree = traced(reduce::p2p_tree{}, 4);
  CHECK(names_on_row(tree, "reduce (GPU)").count("p2p_tree root: last edge + apply") == 1);
  CHECK(names_on_row(tree, "tower 0 (GPU)").count("tree edge: + tower 1") == 1);
  CHECK(names_on_row(tree, "tower 2 (GPU)").count("tree edge: + tower 3") == 1);
  CHECK(names_on_row(tree, "tower 3 (GPU)").count("broadcast: pull from tower 2") == 1);
  CHECK(names_on_row(tree, "tower 1 (GPU)").count("broadcast: pull from tower 0") == 0);
}

// Adam's two slots after two steps of the same gradient g: m = (0.1 + 0.09) g, v = (0.001 + 0.000999) g^2,
// read through two views held at once. Returns what differs (nothing: ""); no Catch macros, as the ranks
// below call it from their threads.
template <class Pipeline>
std::string slots_held_together(Pipeline& p, float g) {
  const auto m = p.optimizer_state(0, 1), v = p.optimizer_state(1, 1);
  const double m_expected = 0.19 * g, v_expected = 0.001999 * g * g;
  for (std::size_t i = 0; i < m.size(); ++i)
    if (std::abs(m[i] - m_expected) > 1e-5 * m_expected || std::abs(v[i] - v_expected) > 1e-5 * v_expected)
      return detail::make_message("element ", i, ": m ", m[i], ", v ", v[i], " where Adam gives ", m_expected, ", ", v_expected);
  return "";
}

TEST_CASE("views of two optimizer state slots coexist on device towers and with reduce::sharded", "[simulated][state]") {
  const auto two_steps = [](auto reduce, auto exec) {
    using R = decltype(reduce);
    using E = decltype(exec);
    const auto machine = machine_of(2);
    pipeline<E, R, optim::adam, layout::flat<float>> p(variables, inputs, 3, {}, on(machine, 3, 2));
    step_on(p, {99, 0});
    step_on(p, {99, 0});
    CHECK(slots_held_together(p, 2.0f) == "");  // the towers' mean of 1, 2 and 3
  };
  two_steps(reduce::device0{}, exec::simulated{});
  two_steps(reduce::sharded{}, exec::simulated{});
  two_steps(reduce::sharded{}, exec::host{});
}

// Two ranks (threads over a thread_process_group), each with 2 simulated towers on 2 devices.
TEST_CASE("across processes on simulated devices: a refused step drops its staged batch, the state is gathered and set, "
          "a failed step leaves the next one to run",
          "[simulated][sharded][processes]") {
  const auto group = thread_process_group::create(2);
  const std::vector<std::string> errors = towerpipe_tests::on_every_rank(2, [&](std::size_t r) {
    const auto machine = machine_of(2);
    pipeline_options options = on(machine, 2, 2);
    options.processes = group[r];
    pipeline<exec::simulated, reduce::sharded, optim::adam, layout::flat<float>> p(variables, inputs, 2, {}, options);
    const std::size_t examples = 8;
    const batch_part part = p.process_part(examples);
    std::vector<float> x(examples);
    for (std::size_t e = 0; e < examples; ++e) x[e] = static_cast<float>(e);
    const auto step_with = [&](const float* data, const auto& f) {
      batch b;
      b.add("x", data, part.examples, {1});
      return p.step(b, f);
    };
    // Both ranks stage the same examples: refused on both, naming them; the batches staged on the devices go.
    try {
      step_with(x.data(), writes_all_but{99, 0});
      detail::fail("rank ", r, ": identical parts were not refused");
    } catch (const error& e) {
      if (std::string(e.what()).find("ranks 0 and 1 staged byte-identical parts") == std::string::npos) throw;
    }
    step_with(x.data() + part.first, writes_all_but{99, 0});
    step_with(x.data() + part.first, writes_all_but{99, 0});
    // Adam after two steps of the same gradient g: m / (1 - b1^2) = g and v / (1 - b2^2) = g^2 exactly in
    // real numbers, so each step moves by lr * g / (|g| + eps) = 1e-3 (to float rounding), down for g > 0.
    // The global towers 0-3 write 1, 2 (rank 0) and 1, 2 (rank 1): g = 1.5 everywhere.
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const auto m = p.optimizer_state(0, v), s = p.optimizer_state(1, v);  // gathered from both owners
      for (std::size_t i = 0; i < m.size(); ++i) {
        if (std::abs(m[i] - 0.285f) > 1e-6f || std::abs(s[i] - 0.0044977500f) > 1e-8f)
          detail::fail("rank ", r, ": variable ", v, " element ", i, ": state ", m[i], ", ", s[i], " is not Adam's after two steps");
      }
      if (std::abs(p.parameter(v)[0] + 0.002f) > 1e-6f) detail::fail("rank ", r, ": parameter ", p.parameter(v)[0]);
    }
    const std::string slots = slots_held_together(p, 1.5f);
    if (!slots.empty()) detail::fail("rank ", r, ": ", slots);
    // Set a slot on every rank alike, read it back (the gathered copy is refreshed).
    const std::vector<float> zeros(variables[1].size, 0.0f);
    p.set_optimizer_state(0, 1, zeros.data(), zeros.size());
    if (p.optimizer_state(0, 1)[7] != 0.0f) detail::fail("rank ", r, ": the state set is not read back");
    // A tower of rank 1 fails: the step fails on both ranks with its error and changes nothing (the
    // devices' queued work is abandoned); the next step runs.
    const float before = p.parameter(0)[5];
    std::string failure;
    try {
      step_with(x.data() + part.first, [&](auto& t) {
        if (r == 1 && t.tower() == 1) throw std::runtime_error("tower gave up");
        return writes_all_but{99, 0}(t);
      });
    } catch (const error& e) {
      failure = e.what();
    }
    if (failure.find("rank 1: ") == std::string::npos || failure.find("tower gave up") == std::string::npos)
      detail::fail("rank ", r, ": the failed step reported '", failure, "'");
    if (p.parameter(0)[5] != before) detail::fail("rank ", r, ": the failed step changed a parameter");
    step_with(x.data() + part.first, writes_all_but{99, 0});
    if (p.parameter(0)[5] == before) detail::fail("rank ", r, ": the step after the failure changed nothing");
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    if (!errors[r].empty()) UNSCOPED_INFO(errors[r]);
  }
}
