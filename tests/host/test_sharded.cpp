// reduce::sharded in one process (no pipeline_options::processes): bitwise reduce::host — its
// parameters, optimizer state, and on checked steps the norm, the clipping and the skipped step's
// report. Across processes: tests/mpi/ (ctest mpi.*).

#include <catch2/catch.hpp>

#include <towerpipe/towerpipe.hpp>

#include <cmath>
#include <cstring>
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

// Each tower's gradient: a fixed function of the tower, the step's batch and the parameters; in the
// step `poisoned_step` (counting from 0), tower 1 writes a NaN into element 40 of "tail".
int poisoned_step = -1;
bool poison_this_step = false;
// G: the towers' value type (float, or bfloat16/float16 with mixed precision).
template <class Context>
double tower_gradient(Context& tower) {
  using G = typename Context::value_type;
  const float mean = towerpipe_tests::shard_mean(tower, "x");
  for (std::size_t v = 0; v < 3; ++v) {
    const auto p = tower.parameter(v);
    auto g = tower.gradient(v);
    for (std::size_t i = 0; i < g.size(); ++i) g.data()[i] = G(0.5f * static_cast<float>(p.data()[i]) + mean * static_cast<float>(i % 7));
  }
  if (poison_this_step && tower.tower() == 1) tower.gradient(2).data()[40] = G(std::nanf(""));
  return static_cast<double>(mean);
}

pipeline_options unchecked() {
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  return options;
}

template <class Layout, class Optim>
void same_as_reduce_host(std::size_t towers, const typename Optim::hyper_parameters& h,
                         const pipeline_options& options = unchecked()) {
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
    poison_this_step = step == poisoned_step;
    const step_stats a = host.step(b, [](auto& tower) { return tower_gradient(tower); });
    const step_stats s = sharded.step(b, [](auto& tower) { return tower_gradient(tower); });
    CHECK(a.loss == s.loss);
    CHECK(a.examples == s.examples);
    CHECK(a.skipped == s.skipped);
    CHECK(a.accumulating == s.accumulating);
    // The norm of a step with a NaN is NaN in both: compare bits.
    REQUIRE(a.gradient_norm.has_value() == s.gradient_norm.has_value());
    if (a.gradient_norm) CHECK(std::memcmp(&*a.gradient_norm, &*s.gradient_norm, sizeof(double)) == 0);
    CHECK(a.clip_coefficient == s.clip_coefficient);
    CHECK(a.loss_scale == s.loss_scale);
    CHECK(s.nonfinite.has_value() == poison_this_step);  // the NaN is seen (in the poisoned step, the end of a window)
    REQUIRE(a.nonfinite.has_value() == s.nonfinite.has_value());
    if (a.nonfinite) {
      CHECK(a.nonfinite->variable == s.nonfinite->variable);
      CHECK(a.nonfinite->element == s.nonfinite->element);
      CHECK(a.nonfinite->tower == s.nonfinite->tower);
    }
  }
  CHECK(host.steps_done() == sharded.steps_done());
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

TEST_CASE("reduce::sharded in one process takes checked steps as reduce::host does", "[sharded][checked]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  pipeline_options skip_and_clip;  // on_nonfinite = skip
  skip_and_clip.max_grad_norm = 0.5;
  pipeline_options accumulate = skip_and_clip;
  accumulate.accumulation_steps = 2;
  pipeline_options scaled;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  for (int poisoned : {-1, 1}) {  // the second step: tower 1's NaN makes it skipped, and named
    poisoned_step = poisoned;
    for (std::size_t towers : {2, 3}) {
      INFO(towers << " towers, NaN at step " << poisoned);
      same_as_reduce_host<layout::flat<float>, optim::adam>(towers, adam, skip_and_clip);
      same_as_reduce_host<layout::per_variable<float>, optim::adam>(towers, adam, accumulate);
      same_as_reduce_host<layout::flat<float>, optim::adam>(towers, adam, scaled);
    }
  }
  poisoned_step = -1;
}

TEST_CASE("reduce::sharded in one process with 16-bit towers (mixed precision) equals reduce::host bitwise",
          "[sharded][mixed]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  pipeline_options skip_and_clip;
  skip_and_clip.max_grad_norm = 0.5;
  for (int poisoned : {-1, 1}) {
    poisoned_step = poisoned;
    for (std::size_t towers : {2, 3}) {
      INFO(towers << " towers, NaN at step " << poisoned);
      same_as_reduce_host<layout::flat<bfloat16>, optim::adam>(towers, adam, skip_and_clip);
      same_as_reduce_host<layout::per_variable<float16>, optim::adam>(towers, adam, skip_and_clip);
    }
  }
  poisoned_step = -1;
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
