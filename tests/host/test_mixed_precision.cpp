// Mixed precision (layout::flat<bfloat16>, per_variable<float16>, ...): towers hold 16-bit gradients and
// parameters, the pipeline an fp32 master, fp32 optimizer state and an fp32 average. The master must
// equal an fp32 pipeline fed the same gradients widened, bit for bit; the towers' parameters must be the
// master rounded to nearest even (checked against a rounding written here with nearbyint).
#include <towerpipe/towerpipe.hpp>
#include <towerpipe/io/checkpoint.hpp>

#include <catch2/catch.hpp>

#include <cfenv>
#include <cmath>
#include <limits>
#include <unistd.h>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

namespace {

const variable_set variables{{"w", {30, 7}}, {"big", {5000}}, {"odd", {3}}};
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

// Round to nearest even with `bits` significant bits, for normal values: the reference rounding.
float round_to_significant_bits(float x, int bits) {
  if (x == 0.0f) return x;
  int exponent = 0;
  const double mantissa = std::frexp(static_cast<double>(x), &exponent);  // [0.5, 1)
  REQUIRE(std::fegetround() == FE_TONEAREST);
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(mantissa, bits)), exponent - bits));
}
constexpr int significant_bits(bfloat16*) { return 8; }
constexpr int significant_bits(float16*) { return 11; }

template <class Half>
using mixed_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<Half>>;
using float_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::per_variable<float>>;

// One step: each tower writes its 16-bit gradients; the fp32 twin gets the same values widened.
template <class Half>
void step_both(mixed_trainer<Half>& mixed, float_trainer& twin, random_source& random, std::size_t poisoned_tower = ~0u) {
  std::vector<std::vector<std::vector<Half>>> halves(mixed.towers());
  for (auto& tower : halves) {
    for (const variable& v : variables) {
      std::vector<Half> values;
      for (float x : random.normal(v.size, 0.01f)) values.push_back(Half(x));
      tower.push_back(values);
    }
  }
  if (poisoned_tower < halves.size()) halves[poisoned_tower][1][4321] = Half(std::numeric_limits<float>::infinity());
  const std::vector<float> x(2 * mixed.towers(), 1.0f);
  batch b;
  b.add("x", x, {1});
  mixed.step(b, [&](typename mixed_trainer<Half>::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const auto& g = halves[tower.tower()][v];
      tower.write_gradient(v, g.data(), g.size());
    }
    return 0.0;
  });
  twin.step(b, [&](float_trainer::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      auto g = tower.gradient(v);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(halves[tower.tower()][v][i]);
    }
    return 0.0;
  });
}

}  // namespace

TEMPLATE_TEST_CASE("mixed precision: the fp32 master equals an fp32 run on the widened gradients, replicas are it rounded",
                   "[mixed]", bfloat16, float16) {
  random_source random(100);
  for (std::size_t towers : {1u, 2u, 3u, 5u}) {
    CAPTURE(towers);
    optim::adam::hyper_parameters h;
    h.lr = 1e-3;
    pipeline_options options;
    options.max_grad_norm = 0.5;
    mixed_trainer<TestType> mixed(variables, inputs, towers, h, options);
    float_trainer twin(variables, inputs, towers, h, options);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const std::vector<float> initial = random.normal(variables[v].size);
      mixed.set_parameter(v, initial.data(), initial.size());
      twin.set_parameter(v, initial.data(), initial.size());
    }
    for (int step = 0; step < 4; ++step) step_both(mixed, twin, random);
    REQUIRE(mixed.steps_done() == 4);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      REQUIRE(first_bitwise_difference(mixed.parameter(v), twin.parameter(v)) == -1);
      for (std::size_t slot = 0; slot < 2; ++slot)
        REQUIRE(first_bitwise_difference(mixed.optimizer_state(slot, v), twin.optimizer_state(slot, v)) == -1);
      const auto replica = mixed.execution_space().shared_parameters().view(v);
      const auto master = mixed.parameter(v);
      for (std::size_t i = 0; i < replica.size(); ++i) {
        const float expected = round_to_significant_bits(master[i], significant_bits(static_cast<TestType*>(nullptr)));
        REQUIRE(static_cast<float>(replica[i]) == expected);
      }
    }
  }
}

TEMPLATE_TEST_CASE("mixed precision: an infinite 16-bit gradient skips the step and is named", "[mixed][nonfinite]",
                   bfloat16, float16) {
  random_source random(101);
  mixed_trainer<TestType> mixed(variables, inputs, 3, {});
  float_trainer twin(variables, inputs, 3, {});
  step_both(mixed, twin, random);
  const std::vector<float> before(mixed.parameter(1).begin(), mixed.parameter(1).end());
  // A step with tower 2's "big"[4321] = inf.
  {
    std::vector<std::vector<std::vector<TestType>>> halves(3);
    for (auto& tower : halves) {
      for (const variable& v : variables) tower.emplace_back(v.size, TestType(0.25f));
    }
    halves[2][1][4321] = TestType(std::numeric_limits<float>::infinity());
    const std::vector<float> x(6, 1.0f);
    batch b;
    b.add("x", x, {1});
    const step_stats stats = mixed.step(b, [&](typename mixed_trainer<TestType>::tower_context& tower) {
      for (std::size_t v = 0; v < variables.count(); ++v)
        tower.write_gradient(v, halves[tower.tower()][v].data(), halves[tower.tower()][v].size());
      return 0.0;
    });
    REQUIRE(stats.skipped);
    CHECK(stats.nonfinite->tower == std::optional<std::size_t>(2));
    CHECK(stats.nonfinite->variable_name == "big");
    CHECK(stats.nonfinite->element == 4321);
  }
  CHECK(mixed.steps_done() == 1);
  CHECK(first_bitwise_difference(mixed.parameter(1), before) == -1);
}

TEST_CASE("a mixed-precision checkpoint holds the fp32 master and resumes bitwise", "[mixed][checkpoint]") {
  const std::string path = "/tmp/towerpipe_test_" + std::to_string(::getpid()) + "_mixed.ckpt";
  random_source a(102), b(102);
  mixed_trainer<bfloat16> uninterrupted(variables, inputs, 2, {}), first(variables, inputs, 2, {}),
      resumed(variables, inputs, 2, {});
  float_trainer twin(variables, inputs, 2, {}), first_twin(variables, inputs, 2, {});
  for (int s = 0; s < 4; ++s) step_both(uninterrupted, twin, a);
  for (int s = 0; s < 2; ++s) step_both(first, first_twin, b);
  save_checkpoint(first, path);
  load_checkpoint(resumed, path);
  float_trainer as_float(variables, inputs, 2, {});  // the file holds the master in float: fp32 loads it
  load_checkpoint(as_float, path);
  for (std::size_t v = 0; v < variables.count(); ++v)
    CHECK(first_bitwise_difference(as_float.parameter(v), first.parameter(v)) == -1);
  for (int s = 2; s < 4; ++s) step_both(resumed, first_twin, b);
  for (std::size_t v = 0; v < variables.count(); ++v) {
    REQUIRE(first_bitwise_difference(resumed.parameter(v), uninterrupted.parameter(v)) == -1);
    const auto r = resumed.execution_space().shared_parameters().view(v);
    const auto u = uninterrupted.execution_space().shared_parameters().view(v);
    for (std::size_t i = 0; i < r.size(); ++i) REQUIRE(r[i].bits == u[i].bits);
  }
  std::remove(path.c_str());
}
