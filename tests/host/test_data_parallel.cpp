// Data-parallel equivalence (docs/guide.md, invariant 3): N towers on a batch of B train a real small
// model (examples/mlp.hpp, hand-written forward and backward) to the same parameters, within float
// rounding, as one tower on the whole batch — also for uneven batches split with weights b_i / B; and
// the model's backward pass marks each layer ready as it finishes it, which changes no bit.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backward_log.hpp"
#include "mlp.hpp"
#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::random_source;

namespace {

using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
const towerpipe_examples::mlp model({6, 8, 4});

struct data {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};

data draw_data(random_source& random, std::size_t examples) {
  data d{random.normal(examples * model.inputs()), std::vector<std::int32_t>(examples)};
  std::uniform_int_distribution<std::int32_t> label(0, static_cast<std::int32_t>(model.classes()) - 1);
  for (std::int32_t& l : d.labels) l = label(random.engine());
  return d;
}

// Trains `steps` SGD-with-momentum steps on batches of `batch_size` examples cut from d; returns the
// parameters and the first and last step's loss.
struct outcome {
  std::vector<std::vector<float>> parameters;
  double first_loss = 0, last_loss = 0;
};

// With `mark_ready`, the towers mark each layer's gradients ready as its backward finishes, and every
// variable is a bucket of its own, reduced while the towers run.
outcome train(std::size_t towers, const data& d, std::size_t batch_size, int steps, split_policy policy,
              bool mark_ready = false) {
  optim::sgd::hyper_parameters h;
  h.lr = 0.1;
  h.momentum = 0.9;
  pipeline_options options;
  options.split = policy;
  if (mark_ready) options.buckets.cap_bytes = 1;
  trainer p(model.variables(), model.input_specs(), towers, h, options);
  std::uint64_t seed = 7;
  p.initialize([&](const variable& v, tensor_view<float> values) { model.initialize(v, values, seed); });
  outcome result;
  const std::size_t batches = d.labels.size() / batch_size;
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = (static_cast<std::size_t>(s) % batches) * batch_size;
    batch b;
    b.add("image", d.images.data() + first * model.inputs(), batch_size, {model.inputs()});
    b.add("label", d.labels.data() + first, batch_size, {});
    const step_stats stats = p.step(b, [&](trainer::tower_context& tower) {
      return model.loss_and_gradient(
          tower.input<float>("image"), tower.input<std::int32_t>("label"),
          [&](std::size_t i) { return tower.parameter(i).data(); }, [&](std::size_t i) { return tower.gradient(i).data(); },
          [&](std::size_t i) {
            if (mark_ready) tower.gradient_ready(i);
          });
    });
    if (s == 0) result.first_loss = stats.loss;
    result.last_loss = stats.loss;
  }
  for (std::size_t v = 0; v < p.variables().count(); ++v)
    result.parameters.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
  return result;
}

double max_relative_difference(const outcome& a, const outcome& b) {
  double worst = 0;
  for (std::size_t v = 0; v < a.parameters.size(); ++v) {
    for (std::size_t i = 0; i < a.parameters[v].size(); ++i) {
      const double x = a.parameters[v][i], y = b.parameters[v][i];
      worst = std::max(worst, std::fabs(x - y) / std::max(1.0, std::fabs(y)));
    }
  }
  return worst;
}

// Float sums taken over different groupings of the same examples differ in the last bits; over 25
// steps that stays below this, while a wrong weighting (say an unweighted mean of uneven shards) or a
// lost shard moves parameters by percent.
constexpr double rounding_tolerance = 5e-6;

}  // namespace

TEST_CASE("N towers equal one tower on the whole batch", "[data_parallel]") {
  random_source random(50);
  INFO("seed " << random.seed());
  const data d = draw_data(random, 240);
  const outcome one = train(1, d, 24, 25, split_policy::weighted);
  CHECK(one.last_loss < one.first_loss);  // the model really learns
  for (std::size_t towers : {2, 3, 4}) {
    INFO(towers << " towers");
    const outcome many = train(towers, d, 24, 25, split_policy::weighted);
    CHECK(max_relative_difference(many, one) < rounding_tolerance);
    CHECK(many.first_loss == Approx(one.first_loss).epsilon(1e-5));
  }
}

TEST_CASE("uneven batches: weighted shards equal one tower on the whole batch", "[data_parallel]") {
  random_source random(51);
  INFO("seed " << random.seed());
  const data d = draw_data(random, 230);
  const outcome one = train(1, d, 23, 25, split_policy::weighted);
  for (std::size_t towers : {2, 3, 4}) {
    INFO(towers << " towers, 23 examples: shards differ by one");
    CHECK(max_relative_difference(train(towers, d, 23, 25, split_policy::weighted), one) < rounding_tolerance);
  }
}

TEST_CASE("drop_remainder: N towers equal one tower on the examples kept, not on the whole batch", "[data_parallel]") {
  // drop_remainder on 23 examples over 4 towers trains on 20 of them: a different batch, hence far from
  // one tower on all 23 — and equal (within rounding) to one tower on those 20.
  random_source random(52);
  INFO("seed " << random.seed());
  const data d = draw_data(random, 230);
  const outcome dropped = train(4, d, 23, 25, split_policy::drop_remainder);
  CHECK(max_relative_difference(dropped, train(1, d, 23, 25, split_policy::weighted)) > 100 * rounding_tolerance);

  // The same 20 examples per step for a single tower: re-pack the data to batches of 20.
  data first20;
  for (std::size_t b = 0; b < 10; ++b) {
    first20.images.insert(first20.images.end(), d.images.begin() + static_cast<long>(b * 23 * model.inputs()),
                          d.images.begin() + static_cast<long>((b * 23 + 20) * model.inputs()));
    first20.labels.insert(first20.labels.end(), d.labels.begin() + static_cast<long>(b * 23),
                          d.labels.begin() + static_cast<long>(b * 23 + 20));
  }
  CHECK(max_relative_difference(dropped, train(1, first20, 20, 25, split_policy::weighted)) < rounding_tolerance);
}

TEST_CASE("the MLP marks each layer ready once, right after its backward is done with it", "[data_parallel]") {
  random_source random(53);
  INFO("seed " << random.seed());
  const towerpipe_examples::mlp deeper({6, 8, 7, 4});
  const data d{random.normal(5 * deeper.inputs()), {0, 3, 1, 2, 3}};
  const variable_set variables = deeper.variables();
  std::vector<std::vector<float>> parameters, gradients;
  for (std::size_t v = 0; v < variables.count(); ++v) {
    parameters.push_back(random.normal(variables[v].size));
    gradients.emplace_back(variables[v].size);
  }
  batch b;
  b.add("image", d.images.data(), d.labels.size(), {deeper.inputs()});
  b.add("label", d.labels.data(), d.labels.size(), {});
  towerpipe_tests::backward_log log;
  deeper.loss_and_gradient(b.input<float>("image"), b.input<std::int32_t>("label"), log.access(parameters),
                           log.access(gradients), log.ready());
  CHECK(log.marks() == std::vector<std::size_t>{4, 5, 2, 3, 0, 1});  // last layer first, weight before bias
  CHECK(log.touched_after_mark().empty());
  for (std::size_t v = 0; v < variables.count(); ++v) {
    // Nothing of another layer was touched between v's last use and its mark.
    for (std::size_t other : log.touched_before_mark(v)) CHECK(other / 2 == v / 2);
  }
}

TEST_CASE("N towers marking the MLP's layers ready end bitwise where unmarked towers do", "[data_parallel]") {
  random_source random(54);
  INFO("seed " << random.seed());
  const data d = draw_data(random, 230);
  for (std::size_t towers : {1, 3}) {
    INFO(towers << " towers");
    const outcome marked = train(towers, d, 23, 10, split_policy::weighted, true);
    CHECK(marked.parameters == train(towers, d, 23, 10, split_policy::weighted).parameters);
  }
}
