// The host pipeline end to end: what a step reports, and bad input — each a towerpipe::error naming
// the problem, with parameters, optimizer state and step count untouched and the pipeline still usable.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

namespace {

using trainer = pipeline<exec::host, reduce::host, optim::adam, layout::per_variable<float>>;

const variable_set model_variables{{"w", {4, 3}}, {"b", {4}}};
const std::vector<input_spec> model_inputs{{"x", dtype::float32, {3}}};

// Every tower writes gradient = its tower index + 1 + its first input value, and returns loss = tower index.
float honest_tower(trainer::tower_context& tower) {
  const float value = static_cast<float>(tower.tower() + 1) + tower.input<float>("x")(0, 0);
  for (std::size_t v = 0; v < tower.variables().count(); ++v) {
    for (float& g : tower.gradient(v)) g = value;
  }
  return static_cast<float>(tower.tower());
}

struct snapshot {
  std::vector<std::vector<float>> parameters, first_moments;
  std::int64_t steps;
};

snapshot take_snapshot(const trainer& p) {
  snapshot s{{}, {}, p.steps_done()};
  for (std::size_t v = 0; v < p.variables().count(); ++v) {
    s.parameters.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
    s.first_moments.emplace_back(p.optimizer_state(0, v).begin(), p.optimizer_state(0, v).end());
  }
  return s;
}

void require_unchanged(const trainer& p, const snapshot& before) {
  const snapshot after = take_snapshot(p);
  REQUIRE(after.steps == before.steps);
  for (std::size_t v = 0; v < before.parameters.size(); ++v) {
    REQUIRE(first_bitwise_difference(after.parameters[v], before.parameters[v]) == -1);
    REQUIRE(first_bitwise_difference(after.first_moments[v], before.first_moments[v]) == -1);
  }
}

struct fixture {
  random_source random{40};
  std::vector<float> x = random.normal(6 * 3);
  batch good;
  trainer p{model_variables, model_inputs, 3, optim::adam::hyper_parameters{}};
  fixture() {
    good.add("x", x.data(), 6, {3});
    const std::vector<float> w = random.normal(12);
    p.set_parameter("w", w.data(), w.size());
    p.step(good, honest_tower);  // a step of history, so that optimizer state is non-zero
  }
};

// After a failed step the pipeline must be exactly where it was: one more good step equals the same
// step taken by a twin pipeline that never saw the error.
void check_failure_changed_nothing(fixture& f, const std::function<void()>& failing_step,
                                   const std::string& expected_message) {
  const snapshot before = take_snapshot(f.p);
  REQUIRE_THROWS_AS(failing_step(), towerpipe::error);
  CHECK_THROWS_WITH(failing_step(), Catch::Contains(expected_message));
  require_unchanged(f.p, before);

  fixture twin;
  twin.p.step(twin.good, honest_tower);
  f.p.step(f.good, honest_tower);
  const snapshot ours = take_snapshot(f.p), theirs = take_snapshot(twin.p);
  CHECK(ours.steps == 2);
  for (std::size_t v = 0; v < ours.parameters.size(); ++v)
    CHECK(first_bitwise_difference(ours.parameters[v], theirs.parameters[v]) == -1);
}

}  // namespace

TEST_CASE("a step reports losses, examples and its stages", "[pipeline]") {
  const std::vector<float> x(10 * 3, 0.5f);
  batch b;
  b.add("x", x.data(), 10, {3});
  trainer p(model_variables, model_inputs, 4, optim::adam::hyper_parameters{});
  const step_stats stats = p.step(b, honest_tower);
  CHECK(stats.step == 1);
  CHECK(stats.examples == 10);
  REQUIRE(stats.tower_loss == std::vector<double>{0, 1, 2, 3});
  // Shards of 3, 3, 2, 2 examples: the batch loss is 0.3*0 + 0.3*1 + 0.2*2 + 0.2*3.
  CHECK(stats.loss == Approx(1.3).epsilon(1e-12));
  CHECK(stats.seconds > 0);
  CHECK(stats.examples_per_second > 0);
  CHECK(stats.stages.split > 0);
  CHECK(stats.stages.towers >= 0);
  CHECK(stats.stages.reduce >= 0);
  CHECK(stats.stages.split + stats.stages.towers + stats.stages.reduce <= stats.seconds);
  CHECK(p.steps_done() == 1);
  CHECK(stats.scaled_loss == stats.loss);      // no loss scaling: the scale is 1
  CHECK(stats.gradient_norm.has_value());        // a checked step (on_nonfinite = skip by default)
}

TEST_CASE("sibling accessors and fields have one type", "[pipeline]") {
  using names = std::pair<decltype(std::declval<const trainer&>().backend_name()), decltype(std::declval<const trainer&>().backend_reason())>;
  STATIC_REQUIRE(std::is_same<names::first_type, std::string>::value);
  STATIC_REQUIRE(std::is_same<names::second_type, std::string>::value);
  STATIC_REQUIRE(std::is_same<decltype(step_stats::step), decltype(std::declval<const trainer&>().steps_done())>::value);
  STATIC_REQUIRE(std::is_same<decltype(step_stats::examples), std::size_t>::value);
  STATIC_REQUIRE(std::is_same<decltype(step_stats::micro_batch), decltype(std::declval<const trainer&>().micro_batches_pending())>::value);
}

TEST_CASE("towers see their shard, weight and the shared parameters", "[pipeline]") {
  std::vector<float> x(7 * 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  batch b;
  b.add("x", x.data(), 7, {3});
  trainer p(model_variables, model_inputs, 3, optim::adam::hyper_parameters{});
  const std::vector<float> w{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  p.set_parameter("w", w.data(), w.size());
  // Catch's assertions are not thread-safe: towers record what they see, the test checks it after.
  struct seen {
    std::size_t towers, examples;
    double weight;
    float first_input, last_parameter;
    shape parameter_shape;
  };
  std::vector<seen> views(3);
  p.step(b, [&](trainer::tower_context& tower) {
    views[tower.tower()] = {tower.towers(), tower.examples(), tower.weight(), tower.input<float>("x")(0, 1),
                            tower.parameter("w")[11], tower.parameter("w").shape()};
    for (std::size_t v = 0; v < 2; ++v) {
      for (float& g : tower.gradient(v)) g = 1.0f;
    }
    return 0.0;
  });
  // Shards of 3, 2, 2 examples starting at 0, 3, 5.
  const std::size_t sizes[] = {3, 2, 2}, firsts[] = {0, 3, 5};
  for (std::size_t t = 0; t < 3; ++t) {
    INFO("tower " << t);
    CHECK(views[t].towers == 3);
    CHECK(views[t].examples == sizes[t]);
    CHECK(views[t].weight == Approx(static_cast<double>(sizes[t]) / 7.0));
    CHECK(views[t].first_input == static_cast<float>(firsts[t] * 3 + 1));
    CHECK(views[t].last_parameter == 12.0f);
    CHECK(views[t].parameter_shape == shape{4, 3});
  }
}

TEST_CASE("a pipeline needs towers, variables and valid hyper-parameters", "[pipeline][errors]") {
  CHECK_THROWS_WITH(trainer(model_variables, model_inputs, 0, optim::adam::hyper_parameters{}),
                    Catch::Contains("at least one tower"));
  CHECK_THROWS_WITH(trainer(variable_set{}, model_inputs, 2, optim::adam::hyper_parameters{}),
                    Catch::Contains("at least one variable"));
  optim::adam::hyper_parameters nan_lr;
  nan_lr.lr = std::nan("");
  CHECK_THROWS_WITH(trainer(model_variables, model_inputs, 2, nan_lr), Catch::Contains("adam: invalid learning rate nan"));

  fixture f;
  const snapshot before = take_snapshot(f.p);
  CHECK_THROWS_WITH(f.p.set_hyper(nan_lr), Catch::Contains("invalid learning rate nan"));
  CHECK(std::isfinite(f.p.hyper().lr));
  require_unchanged(f.p, before);
}

TEST_CASE("sgd cannot switch momentum on after construction", "[pipeline][errors]") {
  using sgd_trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
  sgd_trainer p(model_variables, model_inputs, 1, optim::sgd::hyper_parameters{});
  optim::sgd::hyper_parameters with_momentum;
  with_momentum.momentum = 0.9;
  CHECK_THROWS_WITH(p.set_hyper(with_momentum), Catch::Contains("need 1 optimizer state slot(s)"));
  CHECK_THROWS_WITH(p.optimizer_state(0, 0), Catch::Contains("sgd has 0 state slot(s) here"));
}

TEST_CASE("a batch that does not match the declared inputs changes nothing", "[pipeline][errors]") {
  fixture f;
  const std::vector<float> wide(6 * 4, 1.0f);
  batch wrong;
  wrong.add("x", wide.data(), 6, {4});
  check_failure_changed_nothing(f, [&] { f.p.step(wrong, honest_tower); },
                                "input 'x' has example shape [4], declared [3]");
}

TEST_CASE("a batch smaller than the tower count changes nothing", "[pipeline][errors]") {
  fixture f;
  batch small;
  small.add("x", f.x.data(), 2, {3});
  check_failure_changed_nothing(f, [&] { f.p.step(small, honest_tower); },
                                "a batch of 2 examples cannot be split across 3 towers");
}

TEST_CASE("a gradient written with the wrong size names tower and variable, and changes nothing",
          "[pipeline][errors]") {
  fixture f;
  const std::vector<float> short_gradient(11, 1.0f);
  check_failure_changed_nothing(
      f,
      [&] {
        f.p.step(f.good, [&](trainer::tower_context& tower) {
          honest_tower(tower);
          if (tower.tower() == 2) tower.write_gradient("w", short_gradient.data(), short_gradient.size());
          return 0.0;
        });
      },
      "tower 2: gradient of variable 'w' written with 11 elements; its shape [4, 3] holds 12");
}

TEST_CASE("a gradient left unwritten names tower and variable, and changes nothing", "[pipeline][errors]") {
  fixture f;
  check_failure_changed_nothing(
      f,
      [&] {
        f.p.step(f.good, [&](trainer::tower_context& tower) {
          if (tower.tower() != 1) return honest_tower(tower);
          for (float& g : tower.gradient("w")) g = 1.0f;
          return 0.0f;
        });
      },
      "tower 1 did not write the gradient of variable 'b'");
}

TEST_CASE("a throwing tower is reported with its index, and changes nothing", "[pipeline][errors]") {
  fixture f;
  check_failure_changed_nothing(
      f,
      [&] {
        f.p.step(f.good, [&](trainer::tower_context& tower) -> double {
          honest_tower(tower);
          if (tower.tower() >= 1) throw std::runtime_error("out of memory in layer 3");
          return 0.0;
        });
      },
      "tower 1 threw: out of memory in layer 3 (1 more tower(s) failed too)");
}

TEST_CASE("an unknown variable inside a tower names the tower", "[pipeline][errors]") {
  fixture f;
  check_failure_changed_nothing(
      f, [&] { f.p.step(f.good, [&](trainer::tower_context& tower) { return tower.parameter("bias")[0]; }); },
      "tower 0: no variable named 'bias'");
}

TEST_CASE("an input read as the wrong type inside a tower names the tower", "[pipeline][errors]") {
  fixture f;
  check_failure_changed_nothing(
      f,
      [&] {
        f.p.step(f.good, [&](trainer::tower_context& tower) { return tower.input<std::int32_t>("x")(0, 0); });
      },
      "tower 0: input 'x' holds float32, read as int32");
}

TEST_CASE("set_parameter checks the size against the variable's shape", "[pipeline][errors]") {
  fixture f;
  const std::vector<float> values(5);
  CHECK_THROWS_WITH(f.p.set_parameter("b", values.data(), values.size()),
                    Catch::Contains("parameter 'b' set with 5 values; its shape [4] holds 4"));
  CHECK_THROWS_WITH(f.p.parameter(7), Catch::Contains("variable index 7 is out of range (2 variables)"));
  CHECK_THROWS_WITH(f.p.set_optimizer_state(1, f.p.variables().index_of("b"), values.data(), values.size()),
                    Catch::Contains("adam state slot 1 of 'b' set with 5 values; it holds 4"));
}

TEST_CASE("staged batches are stepped in order, at most two wait, a failed step consumes its batch",
          "[pipeline][staging]") {
  std::vector<float> first(6 * 3, 1.0f), second(6 * 3, 2.0f), third(6 * 3, 3.0f);
  batch b1, b2, b3;
  b1.add("x", first.data(), 6, {3});
  b2.add("x", second.data(), 6, {3});
  b3.add("x", third.data(), 6, {3});
  trainer p(model_variables, model_inputs, 2, optim::adam::hyper_parameters{});
  std::vector<float> seen;
  const auto record = [&](trainer::tower_context& tower) {
    if (tower.tower() == 0) seen.push_back(tower.input<float>("x")(0, 0));
    return honest_tower(tower);
  };
  CHECK_THROWS_WITH(p.step(record), Catch::Contains("needs a staged batch"));
  p.stage(b1);
  p.stage(b2);
  CHECK_THROWS_WITH(p.stage(b3), Catch::Contains("two batches are staged already"));
  CHECK(p.step(record).stages.split > 0);  // stage(b1)'s time, reported by the step that used b1
  // step(batch, fn) trains on its batch: with b2 waiting it would run b2, so it is refused, staging nothing.
  CHECK_THROWS_WITH(p.step(b3, record), Catch::Contains("with a batch staged already would run on that one"));
  p.step(record);  // b2
  CHECK_THROWS_AS(p.step(b3, [](trainer::tower_context&) -> double { throw std::runtime_error("boom"); }), towerpipe::error);
  CHECK(p.steps_done() == 2);
  CHECK_THROWS_WITH(p.step(record), Catch::Contains("needs a staged batch"));  // the failed step took b3
  CHECK(seen == std::vector<float>{1.0f, 2.0f});
}
