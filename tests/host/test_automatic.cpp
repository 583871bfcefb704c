// reduce::automatic on host towers: it names the backend it runs and trains bitwise as that backend
// does; pipeline_options::time_backends trains bitwise as not timing (the step applied once, the
// tower functions run once), and a candidate that disagrees stops the step naming both backends and
// the variable, changing nothing.

#include <catch2/catch.hpp>

#include <towerpipe/towerpipe.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

// "tail" spans more than one task of the thread pool.
variable_set some_variables() { return variable_set{{"w", {11, 5}}, {"b", {11}}, {"tail", {36000}}}; }

std::atomic<int> tower_calls{0};
bool poison_this_step = false;  // tower 1 writes a NaN into b[3]

// Each tower's gradient: a fixed function of the tower's shard and the parameters.
template <class Context>
double tower_gradient(Context& tower) {
  using G = typename Context::value_type;
  ++tower_calls;
  const float mean = towerpipe_tests::shard_mean(tower, "x");
  for (std::size_t v = 0; v < 3; ++v) {
    const auto p = tower.parameter(v);
    auto g = tower.gradient(v);
    for (std::size_t i = 0; i < g.size(); ++i)
      g.data()[i] = G(0.5f * static_cast<float>(p.data()[i]) + mean * static_cast<float>(i % 7) + 0.01f * static_cast<float>(tower.tower()));
  }
  if (poison_this_step && tower.tower() == 1) tower.gradient(1).data()[3] = G(std::nanf(""));
  return static_cast<double>(mean);
}

// Trains `a` and `b` side by side from the same start for `steps` steps and checks that they end
// bitwise equal: parameters, optimizer state, steps done, losses.
template <class A, class B>
void train_alike(A& a, B& b, int steps, std::uint64_t salt, int poisoned_step = -1) {
  random_source random(salt);
  INFO("seed " << random.seed());
  for (std::size_t v = 0; v < a.variables().count(); ++v) {
    const std::vector<float> values = random.wide(a.variables()[v].size);
    a.set_parameter(v, values.data(), values.size());
    b.set_parameter(v, values.data(), values.size());
  }
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> x = random.normal(4 * a.towers() + 1);  // uneven
    batch examples;
    examples.add("x", x.data(), x.size(), {1});
    poison_this_step = step == poisoned_step;
    const step_stats sa = a.step(examples, [](auto& tower) { return tower_gradient(tower); });
    const step_stats sb = b.step(examples, [](auto& tower) { return tower_gradient(tower); });
    poison_this_step = false;
    CHECK(sa.loss == sb.loss);
    CHECK(sa.step == sb.step);
    CHECK(sa.skipped == sb.skipped);
    CHECK(sa.skipped == (step == poisoned_step));
  }
  CHECK(a.steps_done() == b.steps_done());
  for (std::size_t v = 0; v < a.variables().count(); ++v) {
    INFO("variable " << a.variables()[v].name);
    CHECK(first_bitwise_difference(a.parameter(v), b.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < a.optimizer_state_slots(); ++slot)
      CHECK(first_bitwise_difference(a.optimizer_state(slot, v), b.optimizer_state(slot, v)) == -1);
  }
}

template <class Reduce, class Layout = layout::flat<float>>
using trainer = pipeline<exec::host, Reduce, optim::adam, Layout>;

const std::vector<input_spec> inputs = {{"x", dtype::float32, {1}}};

struct captured_log {
  std::vector<std::string> lines;
  captured_log() {
    set_log_sink([this](const std::string& line) { lines.push_back(line); });
  }
  ~captured_log() { set_log_sink(nullptr); }
  bool has(const std::string& words) const {
    for (const std::string& line : lines)
      if (line.find(words) != std::string::npos) return true;
    return false;
  }
};

pipeline_options unchecked() {
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  return options;
}

TEST_CASE("reduce::automatic on host towers runs reduce::host, says so, and trains bitwise as it", "[automatic]") {
  const captured_log log;
  for (const pipeline_options& options : {unchecked(), pipeline_options{}}) {
    trainer<reduce::automatic> automatic(some_variables(), inputs, 3, {}, options);
    trainer<reduce::host> host(some_variables(), inputs, 3, {}, options);
    CHECK(std::string(automatic.backend_name()) == "host");
    CHECK(automatic.backend_reason().find("3 host tower(s) in one process") != std::string::npos);
    CHECK(std::string(host.backend_name()) == "host");
    train_alike(automatic, host, 4, 1);
  }
  CHECK(log.has("towerpipe: reduce::automatic chose reduce::host: 3 host tower(s)"));
}

TEST_CASE("reduce::automatic with bf16 towers and per-variable layout trains bitwise as reduce::host, timed or not",
          "[automatic]") {
  trainer<reduce::automatic, layout::per_variable<bfloat16>> automatic(some_variables(), inputs, 2, {});
  trainer<reduce::host, layout::per_variable<bfloat16>> host(some_variables(), inputs, 2, {});
  train_alike(automatic, host, 3, 2);
  // Timing snapshots and restores the fp32 master copy beside the bf16 replicas, and compares it.
  pipeline_options timed_options;
  timed_options.time_backends = 2;
  trainer<reduce::automatic, layout::per_variable<bfloat16>> timed(some_variables(), inputs, 2, {}, timed_options);
  trainer<reduce::host, layout::per_variable<bfloat16>> untimed(some_variables(), inputs, 2, {});
  train_alike(timed, untimed, 3, 7);
  CHECK(timed.backend_reason().find("timed on this machine's first step (median of 2; bitwise equal)") != std::string::npos);
}

TEST_CASE("reduce::automatic hands optimizer state set on it to the backend it runs", "[automatic]") {
  trainer<reduce::automatic> automatic(some_variables(), inputs, 2, {});
  const std::vector<float> values(automatic.variables()[0].size, 0.25f);
  automatic.set_optimizer_state(1, 0, values.data(), values.size());
  CHECK(first_bitwise_difference(automatic.optimizer_state(1, 0), values) == -1);
}

TEST_CASE("time_backends: the fastest candidate kept, training bitwise as without timing", "[automatic]") {
  for (const pipeline_options& base : {unchecked(), pipeline_options{}}) {
    pipeline_options timed_options = base;
    timed_options.time_backends = 3;
    const captured_log log;
    trainer<reduce::automatic> timed(some_variables(), inputs, 2, {}, timed_options);
    trainer<reduce::automatic> plain(some_variables(), inputs, 2, {}, base);
    CHECK(log.has("timing all 2 candidates on the first step (time_backends = 3)"));
    tower_calls = 0;
    train_alike(timed, plain, 3, 3);
    // Three steps of two pipelines with two towers each: the timing ran no tower function again.
    CHECK(tower_calls == 3 * 2 * 2);
    CHECK(timed.steps_done() == 3);
    const std::string kept = timed.backend_name();
    CHECK((kept == "host" || kept == "sharded"));
    CHECK(timed.backend_reason().find("timed on this machine's first step (median of 3; bitwise equal): host ") != std::string::npos);
    CHECK(log.has("reduce::automatic kept reduce::" + kept));
  }
}

TEST_CASE("time_backends: a skipped first step times again at the next, bitwise as without timing", "[automatic]") {
  pipeline_options timed_options;  // checked: a NaN skips the step
  timed_options.time_backends = 2;
  trainer<reduce::automatic> timed(some_variables(), inputs, 2, {}, timed_options);
  trainer<reduce::automatic> plain(some_variables(), inputs, 2, {});
  train_alike(timed, plain, 1, 5, 0);
  CHECK(timed.steps_done() == 0);
  CHECK(timed.backend_reason().find("timed on") == std::string::npos);  // the rule's still
  train_alike(timed, plain, 2, 6);
  CHECK(timed.steps_done() == 2);
  CHECK(timed.backend_reason().find("timed on this machine's first step (median of 2") != std::string::npos);
}

TEST_CASE("time_backends is refused where it cannot time", "[automatic]") {
  pipeline_options options;
  options.time_backends = 2;
  CHECK_THROWS_WITH(trainer<reduce::host>(some_variables(), inputs, 2, {}, options),
                    Catch::Contains("time_backends times reduce::automatic's candidates; this pipeline runs reduce::host"));
  options.accumulation_steps = 2;
  CHECK_THROWS_WITH(trainer<reduce::automatic>(some_variables(), inputs, 2, {}, options),
                    Catch::Contains("does not take accumulation_steps > 1"));
}

// A candidate that breaks invariant 2: reduce::host's step, then one bit of b[2] flipped.
template <class Optim, class Layout>
struct bit_flipping_reducer : detail::host_reducer<Optim, Layout> {
  using detail::host_reducer<Optim, Layout>::host_reducer;
  template <class Towers>
  detail::screen_partials finish(Towers& towers, stage_seconds& stages) {
    detail::screen_partials screen = detail::host_reducer<Optim, Layout>::finish(towers, stages);
    float& b2 = towers.shared_parameters().data(1)[2];
    std::uint32_t bits;
    std::memcpy(&bits, &b2, sizeof bits);
    bits ^= 1u;
    std::memcpy(&b2, &bits, sizeof bits);
    return screen;
  }
};
// It runs as reduce::sharded would, under that name.
struct broken_sharded {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "sharded";
  static constexpr backend_traits traits = reduce::sharded::traits;
};
struct automatic_with_a_broken_candidate {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "automatic_with_a_broken_candidate";
};

}  // namespace

namespace towerpipe {
template <class Optim, class Layout>
struct reducer_for<exec::host, broken_sharded, Optim, Layout> {
  using type = bit_flipping_reducer<Optim, Layout>;
};
template <class Optim, class Layout>
struct reducer_for<exec::host, automatic_with_a_broken_candidate, Optim, Layout> {
  using type = detail::automatic_reducer<exec::host, Optim, Layout, reduce::host, broken_sharded>;
};
}  // namespace towerpipe

namespace {

TEST_CASE("time_backends: candidates that disagree stop the step, naming both and the variable", "[automatic]") {
  pipeline_options options = unchecked();
  options.time_backends = 2;
  trainer<automatic_with_a_broken_candidate> p(some_variables(), inputs, 2, {}, options);
  random_source random(4);
  for (std::size_t v = 0; v < 3; ++v) {
    const std::vector<float> values = random.normal(p.variables()[v].size);
    p.set_parameter(v, values.data(), values.size());
  }
  std::vector<std::vector<float>> before;
  for (std::size_t v = 0; v < 3; ++v) before.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
  const std::vector<float> x = random.normal(8);
  batch examples;
  examples.add("x", x.data(), x.size(), {1});
  CHECK_THROWS_WITH(p.step(examples, [](auto& tower) { return tower_gradient(tower); }),
                    Catch::Contains("reduce::host and reduce::sharded gave different parameters for variable 'b' (first at element 2)") &&
                        Catch::Contains("the step changed nothing"));
  CHECK(p.steps_done() == 0);
  for (std::size_t v = 0; v < 3; ++v) {
    CHECK(first_bitwise_difference(p.parameter(v), before[v]) == -1);
    for (float m : p.optimizer_state(0, v)) CHECK(m == 0.0f);
  }
}

}  // namespace

namespace {

// Puts the process's log sink back to none when a test ends, however it ends.
struct no_sink_afterwards {
  ~no_sink_afterwards() { set_log_sink(nullptr); }
};

}  // namespace

TEST_CASE("time_backends above 100 is refused at construction with the bound, and 100 is taken", "[automatic]") {
  // 2^64 - 1 trials never returned, 10^6 took many minutes.
  for (const std::size_t trials : {std::size_t(101), std::size_t(1000000), ~std::size_t(0)}) {
    INFO("time_backends = " << trials);
    pipeline_options options;
    options.time_backends = trials;
    CHECK_THROWS_WITH(trainer<reduce::automatic>(some_variables(), inputs, 2, {}, options),
                      Catch::Contains("pipeline_options::time_backends is " + std::to_string(trials) + ": at most 100 trials"));
  }
  pipeline_options options;
  options.time_backends = 100;
  CHECK_NOTHROW(trainer<reduce::automatic>(some_variables(), inputs, 2, {}, options));
}

TEST_CASE("a log sink that throws does not throw through a step: time_backends' note after the step changes nothing",
          "[automatic][log]") {
  const no_sink_afterwards reset;
  pipeline_options options;
  options.time_backends = 2;  // reduce::automatic's "kept ..." note, sent once the first step is applied
  random_source random(9);
  INFO("seed " << random.seed());
  std::vector<std::vector<float>> start;
  for (const variable& v : some_variables()) start.push_back(random.wide(v.size));
  const std::vector<float> x1 = random.normal(9), x2 = random.normal(9);
  const auto prepare = [&](auto& p) {
    for (std::size_t v = 0; v < start.size(); ++v) p.set_parameter(v, start[v].data(), start[v].size());
  };
  const auto step = [](auto& p, const std::vector<float>& x) {
    batch examples;
    examples.add("x", x.data(), x.size(), {1});
    return p.step(examples, [](auto& tower) { return tower_gradient(tower); });
  };

  // The reference: the same two steps with a sink that takes every line.
  std::vector<std::string> taken;
  set_log_sink([&](const std::string& line) { taken.push_back(line); });
  trainer<reduce::automatic> reference(some_variables(), inputs, 2, {}, options);
  prepare(reference);
  step(reference, x1);
  bool kept_note = false;
  for (const std::string& line : taken) kept_note = kept_note || line.find("reduce::automatic kept reduce::") != std::string::npos;
  REQUIRE(kept_note);  // the note this test is about was sent during the first step
  step(reference, x2);
  REQUIRE(reference.steps_done() == 2);

  // A sink that throws on every line, installed once the pipeline is built: the first step returns
  // normally and counts, and the second continues bitwise as the reference does.
  trainer<reduce::automatic> p(some_variables(), inputs, 2, {}, options);
  prepare(p);
  set_log_sink([](const std::string&) { throw std::runtime_error("the log's disk is full"); });
  bool first_threw = false;
  try {
    const step_stats first = step(p, x1);
    CHECK(first.step == 1);
  } catch (const std::exception& e) {
    first_threw = true;
    FAIL_CHECK("the first step threw: " << e.what());
  }
  CHECK_FALSE(first_threw);
  CHECK(p.steps_done() == 1);
  step(p, x2);
  CHECK(p.steps_done() == 2);
  for (std::size_t v = 0; v < start.size(); ++v) {
    INFO("variable " << p.variables()[v].name);
    CHECK(first_bitwise_difference(p.parameter(v), reference.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < p.optimizer_state_slots(); ++slot)
      CHECK(first_bitwise_difference(p.optimizer_state(slot, v), reference.optimizer_state(slot, v)) == -1);
  }
  // Nor through a constructor (its "chose ..." note).
  CHECK_NOTHROW(trainer<reduce::automatic>(some_variables(), inputs, 2, {}, options));
}

TEST_CASE("the lines a throwing log sink did not take are kept for the program, the last 100", "[log]") {
  const no_sink_afterwards reset;
  take_undelivered_log_lines();  // whatever earlier tests left
  set_log_sink([](const std::string&) { throw 42; });  // not even a std::exception
  pipeline_options options;
  options.time_backends = 2;
  trainer<reduce::automatic> p(some_variables(), inputs, 2, {}, options);
  const std::vector<float> x(6, 0.5f);
  batch examples;
  examples.add("x", x.data(), x.size(), {1});
  p.step(examples, [](auto& tower) { return tower_gradient(tower); });
  set_log_sink(nullptr);
  std::vector<std::string> lines = take_undelivered_log_lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind("towerpipe: reduce::automatic chose reduce::", 0) == 0);
  CHECK(lines[1].rfind("towerpipe: reduce::automatic kept reduce::", 0) == 0);
  CHECK(take_undelivered_log_lines().empty());  // taken once

  set_log_sink([](const std::string&) { throw std::runtime_error("full"); });
  for (int i = 0; i < 105; ++i) log_warning("line " + std::to_string(i));
  std::vector<std::string> working;
  set_log_sink([&](const std::string& line) { working.push_back(line); });
  log_note("delivered");
  set_log_sink(nullptr);
  CHECK(working == std::vector<std::string>{"towerpipe: delivered"});
  lines = take_undelivered_log_lines();
  REQUIRE(lines.size() == 101);
  CHECK(lines[0] == "towerpipe: 5 older undelivered log line(s) dropped");
  CHECK(lines[1] == "towerpipe warning: line 5");
  CHECK(lines[100] == "towerpipe warning: line 104");
}
