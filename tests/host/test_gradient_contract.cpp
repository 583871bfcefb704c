// The gradient contract (exec/tower_context.hpp) and the input surface: zeroed_gradient for
// accumulating towers, the poison option catching a partial write by tower, variable and element,
// contiguous ranges for batches, indexing views by shape.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <limits>
#include <vector>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::random_source;

namespace {

using sgd_trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::per_variable<float>>;

}  // namespace

TEST_CASE("an accumulating tower with zeroed_gradient gets plain SGD on the mean gradient, step after step",
          "[contract]") {
  random_source random(90);
  INFO("seed " << random.seed());
  constexpr std::size_t examples = 10, size = 6;
  const std::vector<float> x = random.normal(examples * size);
  optim::sgd::hyper_parameters h;
  h.lr = 0.25;
  sgd_trainer p({{"w", {2, 3}}}, {{"x", dtype::float32, {size}}}, 3, h);
  batch b;
  b.add("x", x, {size});
  // Reference in double: the loss sum_e x_e . w has gradient mean_e x_e, whatever w is.
  std::vector<double> expected(size, 0.0);
  for (int step = 1; step <= 3; ++step) {
    p.step(b, [](sgd_trainer::tower_context& tower) {
      const auto shard = tower.input<float>("x");
      const auto g = tower.zeroed_gradient("w");
      for (std::size_t e = 0; e < shard.examples(); ++e) {
        for (std::size_t i = 0; i < g.size(); ++i) g[i] += shard(e, i) / static_cast<float>(shard.examples());
      }
      return 0.0;
    });
    for (std::size_t i = 0; i < size; ++i) {
      double mean = 0;
      for (std::size_t e = 0; e < examples; ++e) mean += x[e * size + i];
      expected[i] -= 0.25 * mean / examples;
    }
    INFO("step " << step);
    for (std::size_t i = 0; i < size; ++i) REQUIRE(p.parameter("w")[i] == Approx(expected[i]).epsilon(1e-5));
  }
}

TEST_CASE("poison_gradients names the tower, variable and element a tower left unwritten, and changes nothing",
          "[contract]") {
  pipeline_options options;
  options.poison_gradients = true;
  sgd_trainer p({{"b", {3}}, {"w", {4, 3}}}, {{"x", dtype::float32, {1}}}, 3, optim::sgd::hyper_parameters{}, options);
  const std::vector<float> x{1, 2, 3, 4, 5, 6};
  batch b;
  b.add("x", x, {1});
  const auto writes_all_but = [](std::size_t tower, std::size_t skipped) {
    return [=](sgd_trainer::tower_context& t) {
      t.gradient("b")[0] = t.gradient("b")[1] = t.gradient("b")[2] = 1.0f;
      const auto w = t.gradient("w");
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (t.tower() != tower || i != skipped) w[i] = 0.5f;
      }
      return 0.0;
    };
  };
  p.step(b, writes_all_but(99, 0));  // every element written: fine
  const float before = p.parameter("w")[5];
  REQUIRE_THROWS_WITH(p.step(b, writes_all_but(1, 5)),
                      Catch::Contains("tower 1: element 5 (index (1, 2)) of the gradient of variable 'w' [4, 3] was not written"));
  CHECK(p.steps_done() == 1);
  CHECK(p.parameter("w")[5] == before);
  p.step(b, writes_all_but(99, 0));  // and the pipeline goes on
  CHECK(p.steps_done() == 2);
}

TEST_CASE("poison_gradients does not mistake a NaN the tower computed for an unwritten element", "[contract]") {
  pipeline_options options;
  options.poison_gradients = true;
  sgd_trainer p({{"w", {2}}}, {{"x", dtype::float32, {1}}}, 2, optim::sgd::hyper_parameters{}, options);
  const std::vector<float> x{1, 2};
  batch b;
  b.add("x", x, {1});
  const float zero = static_cast<float>(x[0] - 1.0f);
  // No "not written" error: the step is only skipped for its NaN (a checked step), naming it.
  const step_stats stats = p.step(b, [&](sgd_trainer::tower_context& t) {
    const auto g = t.gradient("w");
    g[0] = zero / zero;  // a computed (quiet) NaN
    g[1] = std::numeric_limits<float>::signaling_NaN();
    return 0.0;
  });
  CHECK(stats.skipped);
  REQUIRE(stats.nonfinite.has_value());
  CHECK(stats.nonfinite->element == 0);
  CHECK(stats.nonfinite->tower == std::optional<std::size_t>(0));
}

TEST_CASE("batches take contiguous ranges and count their examples, and bad sizes are named", "[contract][batch]") {
  const std::vector<float> x(12, 1.0f);
  const std::array<std::int32_t, 4> labels{0, 1, 2, 3};
  batch b;
  b.add("x", x, {3}).add("label", labels, {});
  CHECK(b.examples() == 4);
  CHECK(b.input<float>("x").features() == 3);
  batch c;
  REQUIRE_THROWS_WITH(c.add("x", x, {5}), Catch::Contains("batch input 'x': 12 values are not a whole number of examples of shape [5]"));
  REQUIRE_THROWS_WITH(c.add("x", x, 5, {3}), Catch::Contains("5 examples of shape [3] need 15 values, the range holds 12"));
}

TEST_CASE("views index by shape, and at() checks rank and bounds", "[contract]") {
  std::vector<float> values(24);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const shape dims{2, 3, 4};
  const tensor_view<float> view(values.data(), dims);
  CHECK(view(1, 2, 3) == 23.0f);  // (1 * 3 + 2) * 4 + 3
  CHECK(view(0, 1, 0) == 4.0f);
  CHECK(view.at(1, 0, 2) == 14.0f);
  REQUIRE_THROWS_WITH(view.at(1, 3, 0), Catch::Contains("index 3 of dimension 1 is out of range for shape [2, 3, 4]"));
  REQUIRE_THROWS_WITH(view.at(1, 2), Catch::Contains("tensor of shape [2, 3, 4] indexed with 2 index(es)"));
}
