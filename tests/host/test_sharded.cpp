// reduce::sharded in one process (no pipeline_options::processes): bitwise reduce::host, its
// optimizer state whole, and what it refuses. Across processes: tests/mpi/ (ctest mpi.*).

#include <catch2/catch.hpp>

#include <towerpipe/towerpipe.hpp>

#include <vector>

#include "test_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

variable_set awkward_variables() {
  variable_set v;
  v.add("w", {17, 9});
  v.add("b", {17});
  v.add("tail", {40000});  // more than one task of the thread pool
  return v;
}

// Each tower's gradient: a fixed function of the tower, the step's batch and the parameters.
template <class Context>
double tower_gradient(Context& tower) {
  const auto x = tower.template input<float>("x");
  float mean = 0;
  for (std::size_t e = 0; e < x.examples(); ++e) mean += x(e, 0);
  mean /= static_cast<float>(x.examples());
  for (std::size_t v = 0; v < 3; ++v) {
    const auto p = tower.parameter(v);
    auto g = tower.gradient(v);
    for (std::size_t i = 0; i < g.size(); ++i) g.data()[i] = 0.5f * p.data()[i] + mean * static_cast<float>(i % 7);
  }
  return static_cast<double>(mean);
}

template <class Layout, class Optim>
void same_as_reduce_host(std::size_t towers, const typename Optim::hyper_parameters& h) {
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  pipeline<exec::host, reduce::host, Optim, Layout> host(awkward_variables(), {{"x", dtype::float32, {1}}}, towers, h, options);
  pipeline<exec::host, reduce::sharded, Optim, Layout> sharded(awkward_variables(), {{"x", dtype::float32, {1}}}, towers, h,
                                                               options);
  random_source random(towers);
  INFO("seed " << random.seed());
  for (std::size_t v = 0; v < 3; ++v) {
    const std::vector<float> values = random.wide(host.variables()[v].size);
    host.set_parameter(v, values.data(), values.size());
    sharded.set_parameter(v, values.data(), values.size());
  }
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = random.normal(4 * towers + 1);  // uneven
    batch b;
    b.add("x", x.data(), x.size(), {1});
    const step_stats a = host.step(b, [](auto& tower) { return tower_gradient(tower); });
    const step_stats s = sharded.step(b, [](auto& tower) { return tower_gradient(tower); });
    CHECK(a.loss == s.loss);
    CHECK(a.examples == s.examples);
  }
  for (std::size_t v = 0; v < 3; ++v) {
    INFO("variable " << v);
    CHECK(first_bitwise_difference(host.parameter(v), sharded.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < host.optimizer_state_slots(); ++slot)
      CHECK(first_bitwise_difference(host.optimizer_state(slot, v), sharded.optimizer_state(slot, v)) == -1);
  }
}

}  // namespace

TEST_CASE("reduce::sharded in one process equals reduce::host bitwise", "[sharded]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  optim::sgd::hyper_parameters momentum;
  momentum.lr = 0.1;
  momentum.momentum = 0.9;
  for (std::size_t towers : {1, 2, 3, 4, 6}) {  // 3 and 6: raw gradients, not local partials
    INFO(towers << " towers");
    same_as_reduce_host<layout::flat<float>, optim::adam>(towers, adam);
    same_as_reduce_host<layout::per_variable<float>, optim::sgd>(towers, momentum);
  }
}

TEST_CASE("reduce::sharded refuses checked steps, naming the option", "[sharded][errors]") {
  pipeline_options options;  // on_nonfinite = skip: a checked step
  using sharded = pipeline<exec::host, reduce::sharded, optim::adam, layout::flat<float>>;
  CHECK_THROWS_WITH((sharded(awkward_variables(), {{"x", dtype::float32, {1}}}, 2, {}, options)),
                    Catch::Contains("reduce::sharded does not take checked steps yet") &&
                        Catch::Contains("on_nonfinite = nonfinite_policy::unchecked"));
}

TEST_CASE("optimizers describe their hyper-parameters exactly", "[sharded][optimizers]") {
  optim::adam::hyper_parameters h;
  h.lr = 0.1;  // not exact in binary: 17 digits name it
  CHECK(optim::adam::describe(h) == "lr=0.10000000000000001 beta1=0.90000000000000002 beta2=0.999 eps=1e-08 weight_decay=0");
  optim::sgd::hyper_parameters s;
  s.nesterov = true;
  s.momentum = 0.5;
  CHECK(optim::sgd::describe(s) == "lr=0.001 momentum=0.5 dampening=0 nesterov=1 weight_decay=0");
}
