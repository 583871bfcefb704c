// Checked steps (kernels/screen.hpp): a non-finite averaged gradient skips the step (or throws) with the
// right tower, variable and element named and every bit left as it was; global-norm clipping against a
// float64 reference; a checked step with finite gradients equals the single fused pass bitwise.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

namespace {

template <class Layout, class Optim = optim::adam>
using trainer = pipeline<exec::host, reduce::host, Optim, Layout>;

// Three variables; "big" spans two host chunks and several screen tiles, "odd" ends in a partial group.
const variable_set variables{{"w", {40, 3}}, {"big", {70000}}, {"odd", {7}}};
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

struct gradients {
  std::vector<std::vector<std::vector<float>>> values;  // [tower][variable][element]
  gradients(std::size_t towers, std::uint64_t seed) {
    random_source random(seed);
    values.resize(towers);
    for (auto& tower : values) {
      for (const variable& v : variables) tower.push_back(random.normal(v.size, 0.1f));
    }
  }
};

template <class Pipeline>
step_stats step_with(Pipeline& p, const gradients& g, std::size_t examples = 0) {
  const std::vector<float> x(examples != 0 ? examples : 2 * p.towers(), 1.0f);
  batch b;
  b.add("x", x, {1});
  return p.step(b, [&](typename Pipeline::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v)
      tower.write_gradient(v, g.values[tower.tower()][v].data(), g.values[tower.tower()][v].size());
    return 0.0;
  });
}

// Every bit of parameters, optimizer state and the step count.
template <class Pipeline>
std::vector<std::vector<float>> state_of(const Pipeline& p) {
  std::vector<std::vector<float>> all;
  all.push_back({static_cast<float>(p.steps_done())});
  for (std::size_t v = 0; v < variables.count(); ++v) {
    all.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
    for (std::size_t slot = 0; slot < p.optimizer_state_slots(); ++slot)
      all.emplace_back(p.optimizer_state(slot, v).begin(), p.optimizer_state(slot, v).end());
  }
  return all;
}

template <class A, class B>
void require_same(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(first_bitwise_difference(a[i], b[i]) == -1);
}

pipeline_options with(nonfinite_policy policy, double max_norm = 0) {
  pipeline_options options;
  options.on_nonfinite = policy;
  options.max_grad_norm = max_norm;
  options.host_threads = 3;
  return options;
}

}  // namespace

TEMPLATE_TEST_CASE("a non-finite value in one tower skips the step, names it, and changes no bit", "[checked][nonfinite]",
                   layout::per_variable<float>, layout::flat<float>) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  struct place {
    std::size_t variable, element;
  };
  const place places[] = {{0, 0}, {0, 119}, {1, 2047}, {1, 2048}, {1, 69999}, {2, 6}};
  for (std::size_t towers : {1u, 2u, 3u, 5u}) {
    for (std::size_t bad_tower = 0; bad_tower < towers; bad_tower += 2) {
      for (const place& at : places) {
        const float bad = bad_values[(at.element + bad_tower) % 3];
        CAPTURE(towers, bad_tower, at.variable, at.element, bad);
        trainer<TestType> p(variables, inputs, towers, {}, with(nonfinite_policy::skip));
        trainer<TestType> reference(variables, inputs, towers, {}, with(nonfinite_policy::unchecked));
        step_with(p, gradients(towers, 1));
        step_with(reference, gradients(towers, 1));
        const auto before = state_of(p);

        gradients poisoned(towers, 2);
        poisoned.values[bad_tower][at.variable][at.element] = bad;
        const step_stats stats = step_with(p, poisoned);
        REQUIRE(stats.skipped);
        REQUIRE(stats.nonfinite.has_value());
        CHECK(stats.nonfinite->tower == std::optional<std::size_t>(bad_tower));
        CHECK(stats.nonfinite->variable == at.variable);
        CHECK(stats.nonfinite->variable_name == variables[at.variable].name);
        CHECK(stats.nonfinite->element == at.element);
        CHECK(stats.step == 2);
        require_same(state_of(p), before);

        // The next step runs as if the bad one had never been.
        const step_stats next = step_with(p, gradients(towers, 3));
        step_with(reference, gradients(towers, 3));
        CHECK_FALSE(next.skipped);
        CHECK(next.step == 2);
        require_same(state_of(p), state_of(reference));
      }
    }
  }
}

TEST_CASE("the first non-finite element is named: variable order, then element, then the lowest tower",
          "[checked][nonfinite]") {
  trainer<layout::flat<float>> p(variables, inputs, 4, {}, with(nonfinite_policy::skip));
  gradients g(4, 5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  g.values[3][2][0] = nan;     // a later variable
  g.values[2][1][900] = nan;   // a later element
  g.values[3][1][500] = nan;   // the first element, two towers
  g.values[1][1][500] = -nan;
  const step_stats stats = step_with(p, g);
  REQUIRE(stats.nonfinite.has_value());
  CHECK(stats.nonfinite->variable_name == "big");
  CHECK(stats.nonfinite->element == 500);
  CHECK(stats.nonfinite->index == "(500)");
  CHECK(stats.nonfinite->tower == std::optional<std::size_t>(1));
}

TEST_CASE("finite gradients whose weighted sum overflows blame no tower", "[checked][nonfinite]") {
  // 10 examples on 9 towers: the float weights (0.2 and eight 0.1) add up to 1.0000000149, and the
  // roundings of the canonical tree over weight * FLT_MAX carry the sum past FLT_MAX to infinity.
  trainer<layout::per_variable<float>> p(variables, inputs, 9, {}, with(nonfinite_policy::skip));
  gradients g(9, 6);
  for (auto& tower : g.values) tower[0][37] = std::numeric_limits<float>::max();
  const step_stats stats = step_with(p, g, 10);
  REQUIRE(stats.skipped);
  CHECK(stats.nonfinite->element == 37);
  CHECK(stats.nonfinite->index == "(12, 1)");
  CHECK_FALSE(stats.nonfinite->tower.has_value());
  CHECK(p.steps_done() == 0);
}

TEST_CASE("nonfinite_policy::throw_error says where and changes nothing, unchecked lets the NaN through",
          "[checked][nonfinite]") {
  gradients g(3, 7);
  g.values[2][0][5] = std::numeric_limits<float>::infinity();
  trainer<layout::flat<float>> throwing(variables, inputs, 3, {}, with(nonfinite_policy::throw_error));
  const auto before = state_of(throwing);
  CHECK_THROWS_WITH(step_with(throwing, g),
                    Catch::Contains("step 1: non-finite averaged gradient at element 5 (1, 2) of variable 'w': "
                                    "tower 2's gradient is non-finite there; nothing was updated"));
  require_same(state_of(throwing), before);
  CHECK_FALSE(step_with(throwing, gradients(3, 8)).skipped);

  trainer<layout::flat<float>> unchecked(variables, inputs, 3, {}, with(nonfinite_policy::unchecked));
  const step_stats stats = step_with(unchecked, g);
  CHECK_FALSE(stats.skipped);
  CHECK_FALSE(stats.gradient_norm.has_value());
  CHECK(std::isnan(unchecked.parameter(0)[5]));
}

TEMPLATE_TEST_CASE("a checked step with finite gradients equals the single fused pass bitwise", "[checked]",
                   optim::sgd, optim::adam, optim::adamw) {
  for (std::size_t towers : {1u, 2u, 3u, 6u}) {
    CAPTURE(towers);
    typename TestType::hyper_parameters h{};
    trainer<layout::flat<float>, TestType> checked(variables, inputs, towers, h, with(nonfinite_policy::skip, 1e9));
    trainer<layout::per_variable<float>, TestType> fused(variables, inputs, towers, h, with(nonfinite_policy::unchecked));
    for (std::uint64_t s = 0; s < 3; ++s) {
      const step_stats stats = step_with(checked, gradients(towers, 10 + s));
      step_with(fused, gradients(towers, 10 + s));
      CHECK(stats.clip_coefficient == 1.0);
    }
    require_same(state_of(checked), state_of(fused));
  }
}

TEST_CASE("global-norm clipping follows clip_grad_norm_ against a float64 reference", "[checked][clip]") {
  // One tower: the averaged gradient is the tower's gradient, so the reference needs no tree.
  const gradients g(1, 20);
  double sum = 0;
  for (const auto& values : g.values[0]) {
    for (float x : values) sum += double(x) * double(x);
  }
  const double norm = std::sqrt(sum);
  for (double max_norm : {norm / 4, norm * 2}) {
    CAPTURE(max_norm, norm);
    optim::sgd::hyper_parameters h;
    h.lr = 0.5;
    trainer<layout::flat<float>, optim::sgd> p(variables, inputs, 1, h, with(nonfinite_policy::skip, max_norm));
    const step_stats stats = step_with(p, g);
    REQUIRE(stats.gradient_norm.has_value());
    CHECK(*stats.gradient_norm == Approx(norm).epsilon(1e-13));
    const double coefficient = std::min(1.0, max_norm / (norm + 1e-6));
    CHECK(stats.clip_coefficient == Approx(coefficient).epsilon(1e-13));
    // SGD from zero parameters: p = -lr * float(coefficient) * g, each product rounded in float.
    const float c = static_cast<float>(coefficient);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      for (std::size_t i = 0; i < variables[v].size; ++i) {
        const float expected = 0.0f - static_cast<float>(h.lr) * (c * g.values[0][v][i]);
        REQUIRE(p.parameter(v)[i] == expected);
      }
    }
  }
}

TEST_CASE("the gradient norm is bitwise the same for every layout and thread count", "[checked][clip]") {
  const gradients g(5, 30);
  std::optional<double> first;
  for (std::size_t threads : {1u, 2u, 4u}) {
    pipeline_options options = with(nonfinite_policy::skip, 0.5);
    options.host_threads = threads;
    trainer<layout::flat<float>> flat(variables, inputs, 5, {}, options);
    trainer<layout::per_variable<float>> per_variable(variables, inputs, 5, {}, options);
    const double a = *step_with(flat, g).gradient_norm, b = *step_with(per_variable, g).gradient_norm;
    CHECK(a == b);
    if (!first) first = a;
    CHECK(a == *first);
  }
}

TEST_CASE("bad clipping options are rejected at construction", "[checked][errors]") {
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, with(nonfinite_policy::skip, -1.0))),
                    Catch::Contains("max_grad_norm must be finite and >= 0"));
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {},
                                                  with(nonfinite_policy::skip, std::numeric_limits<double>::quiet_NaN()))),
                    Catch::Contains("max_grad_norm"));
}

namespace {

pipeline_options scaled(loss_scale_mode mode, double initial, std::int64_t interval = 2000) {
  pipeline_options options = with(nonfinite_policy::skip);
  options.loss_scale.mode = mode;
  options.loss_scale.initial_scale = initial;
  options.loss_scale.growth_interval = interval;
  return options;
}

// A step whose towers scale their gradients by the pipeline's loss scale, as a scaled loss would.
template <class Pipeline>
step_stats scaled_step(Pipeline& p, gradients g) {
  for (auto& tower : g.values) {
    for (auto& values : tower) {
      for (float& x : values) x = static_cast<float>(x * p.loss_scale());
    }
  }
  return step_with(p, g);
}

}  // namespace

TEST_CASE("loss scaling with a power-of-two scale equals the unscaled run bitwise", "[checked][loss_scale]") {
  trainer<layout::flat<float>> plain(variables, inputs, 3, {}, with(nonfinite_policy::skip, 2.0));
  trainer<layout::flat<float>> scaled_run(variables, inputs, 3, {}, [] {
    pipeline_options options = scaled(loss_scale_mode::dynamic, 1024.0, 2);
    options.max_grad_norm = 2.0;
    return options;
  }());
  for (std::uint64_t s = 0; s < 5; ++s) {
    const step_stats a = step_with(plain, gradients(3, 40 + s));
    const step_stats b = scaled_step(scaled_run, gradients(3, 40 + s));
    CHECK(b.loss_scale == 1024.0 * std::pow(2.0, static_cast<double>(s / 2)));
    CHECK(*a.gradient_norm == *b.gradient_norm);
    CHECK(a.clip_coefficient == b.clip_coefficient);
  }
  require_same(state_of(plain), state_of(scaled_run));
}

TEST_CASE("a step reports the loss unscaled, and the scaled loss the towers returned by name", "[checked][loss_scale]") {
  trainer<layout::flat<float>> p(variables, inputs, 2, {}, scaled(loss_scale_mode::dynamic, 65536.0));
  const gradients g(2, 7);
  const std::vector<float> x(3, 1.0f);  // tower 0 takes 2 examples, tower 1 one: weights 2/3, 1/3
  batch b;
  b.add("x", x, {1});
  const step_stats stats = p.step(b, [&](trainer<layout::flat<float>>::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v)
      tower.write_gradient(v, g.values[tower.tower()][v].data(), g.values[tower.tower()][v].size());
    return (tower.tower() == 0 ? 0.75 : 1.5) * p.loss_scale();  // a tower returns its loss times the scale
  });
  REQUIRE(stats.loss_scale == 65536.0);
  CHECK(stats.tower_loss == std::vector<double>{0.75, 1.5});
  CHECK(stats.loss == Approx(2.0 / 3 * 0.75 + 1.0 / 3 * 1.5).epsilon(1e-15));
  CHECK(stats.scaled_loss == Approx(65536.0 * (2.0 / 3 * 0.75 + 1.0 / 3 * 1.5)).epsilon(1e-15));
}

TEST_CASE("dynamic loss scaling follows GradScaler's rules step by step", "[checked][loss_scale]") {
  // A scale that overflows float grads: steps marked bad carry an infinity from the tower.
  const bool bad[] = {false, false, true, false, false, false, false, true, true, false, false, false};
  const double growth = 2.0, backoff = 0.5;
  const std::int64_t interval = 3;
  trainer<layout::per_variable<float>> p(variables, inputs, 2, {}, scaled(loss_scale_mode::dynamic, 64.0, interval));
  // The reference: torch.cuda.amp.GradScaler.update as documented, written out.
  double scale = 64.0;
  std::int64_t tracker = 0, applied = 0;
  for (std::size_t s = 0; s < sizeof bad; ++s) {
    CAPTURE(s);
    gradients g(2, 50 + s);
    if (bad[s]) g.values[1][0][3] = std::numeric_limits<float>::infinity();
    const step_stats stats = scaled_step(p, g);
    CHECK(stats.loss_scale == scale);
    CHECK(stats.skipped == bad[s]);
    if (bad[s]) {
      scale *= backoff;
      tracker = 0;
    } else {
      ++applied;
      if (++tracker == interval) {
        scale *= growth;
        tracker = 0;
      }
    }
    CHECK(p.loss_scale() == scale);
    CHECK(p.loss_scale_good_steps() == tracker);
    CHECK(p.steps_done() == applied);
  }
}

TEST_CASE("fixed loss scaling never changes the scale, and bad loss-scaling options are rejected", "[checked][loss_scale]") {
  trainer<layout::flat<float>> p(variables, inputs, 2, {}, scaled(loss_scale_mode::fixed, 128.0));
  gradients g(2, 60);
  g.values[0][1][0] = std::numeric_limits<float>::quiet_NaN();
  CHECK(scaled_step(p, g).skipped);
  CHECK_FALSE(scaled_step(p, gradients(2, 61)).skipped);
  CHECK(p.loss_scale() == 128.0);

  pipeline_options bad = scaled(loss_scale_mode::dynamic, 0.0);
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, bad)), Catch::Contains("initial_scale must be a positive normal float"));
  for (double initial : {1e39, 1e-40, 1e-45, 1e-50}) {  // infinite, subnormal or 0 in float
    bad = scaled(loss_scale_mode::dynamic, initial);
    CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, bad)),
                      Catch::Contains("initial_scale must be a positive normal float"));
  }
  bad = scaled(loss_scale_mode::dynamic, 8.0, 0);
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, bad)), Catch::Contains("growth_interval must be >= 1"));
  bad = scaled(loss_scale_mode::dynamic, 8.0);
  bad.loss_scale.backoff_factor = 1.0;
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, bad)), Catch::Contains("backoff_factor must be in (0, 1)"));
  bad = scaled(loss_scale_mode::dynamic, 8.0);
  bad.on_nonfinite = nonfinite_policy::throw_error;
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 2, {}, bad)), Catch::Contains("needs on_nonfinite = skip"));
  for (double scale : {-1.0, 0.0, 1e-40, 1e-45, 1e-50, 1e39}) {
    INFO("scale " << scale);
    CHECK_THROWS_WITH(p.set_loss_scale(scale), Catch::Contains("a loss scale must be a positive normal float"));
  }
  CHECK(p.loss_scale() == 128.0);
  // A dynamic scale's good-step count stays below its growth interval, so that a good step can raise it.
  trainer<layout::flat<float>> dynamic(variables, inputs, 2, {}, scaled(loss_scale_mode::dynamic, 8.0, 4));
  CHECK_NOTHROW(dynamic.set_loss_scale(16.0, 3));
  for (std::int64_t good : {std::int64_t(4), std::numeric_limits<std::int64_t>::max(), std::int64_t(-1)}) {
    INFO("good steps " << good);
    CHECK_THROWS_WITH(dynamic.set_loss_scale(32.0, good), Catch::Contains("good-step count in [0, growth_interval = 4)"));
  }
  CHECK(dynamic.loss_scale() == 16.0);
  CHECK(dynamic.loss_scale_good_steps() == 3);
}

namespace {

// A model whose per-example gradient is known: example e with input x_e contributes x_e * c_v[i] to
// element i of variable v; a tower writes the mean over its shard, as the gradient contract asks.
struct linear_examples {
  std::vector<std::vector<float>> c;
  explicit linear_examples(std::uint64_t seed) {
    random_source random(seed);
    for (const variable& v : variables) c.push_back(random.normal(v.size));
  }
  template <class Pipeline>
  step_stats step(Pipeline& p, const std::vector<float>& x) const {
    batch b;
    b.add("x", x, {1});
    return p.step(b, [&](typename Pipeline::tower_context& tower) {
      const auto shard = tower.template input<float>("x");
      double mean = 0;
      for (std::size_t e = 0; e < shard.examples(); ++e) mean += shard(e, 0);
      mean /= static_cast<double>(shard.examples());
      for (std::size_t v = 0; v < variables.count(); ++v) {
        auto g = tower.gradient(v);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(mean * c[v][i]);
      }
      return 0.0;
    });
  }
};

}  // namespace

TEST_CASE("k accumulated micro-batches equal one step on the concatenated batch, up to rounding",
          "[checked][accumulation]") {
  const linear_examples model(80);
  random_source random(81);
  const std::vector<float> whole = random.normal(16 + 9 + 11);
  const std::vector<std::vector<float>> micro{{whole.begin(), whole.begin() + 16},
                                              {whole.begin() + 16, whole.begin() + 25},
                                              {whole.begin() + 25, whole.end()}};
  optim::sgd::hyper_parameters h;
  h.lr = 1.0;  // from zero parameters: p = -(the averaged gradient), readable directly
  for (std::size_t towers : {1u, 3u, 4u}) {
    CAPTURE(towers);
    trainer<layout::flat<float>, optim::sgd> one_step(variables, inputs, towers, h, with(nonfinite_policy::skip));
    pipeline_options options = with(nonfinite_policy::skip);
    options.accumulation_steps = 3;
    trainer<layout::per_variable<float>, optim::sgd> accumulated(variables, inputs, towers, h, options);
    model.step(one_step, whole);
    double examples = 0, seconds = 0;  // the optimizer step's so far: its throughput is theirs
    for (std::size_t m = 0; m < 3; ++m) {
      const step_stats stats = model.step(accumulated, micro[m]);
      CHECK(stats.micro_batch == m + 1);
      CHECK(stats.accumulating == (m < 2));
      CHECK(stats.step == 1);
      CHECK(accumulated.steps_done() == (m < 2 ? 0 : 1));
      CHECK(stats.examples == micro[m].size());
      examples += static_cast<double>(micro[m].size());
      seconds += stats.seconds;
      CHECK(stats.examples_per_second == Approx(examples / seconds).epsilon(1e-12));
    }
    // The float64 reference: -mean(x) * c; tower means may cancel, so the tolerance scales with max |x|.
    double mean = 0, largest = 0;
    for (float x : whole) {
      mean += x;
      largest = std::max(largest, std::abs(static_cast<double>(x)));
    }
    mean /= static_cast<double>(whole.size());
    for (std::size_t v = 0; v < variables.count(); ++v) {
      for (std::size_t i = 0; i < variables[v].size; ++i) {
        const double expected = -mean * model.c[v][i];
        const double tolerance = 1e-6 * largest * std::abs(model.c[v][i]) + 1e-12;
        REQUIRE(std::abs(accumulated.parameter(v)[i] - expected) <= tolerance);
        REQUIRE(std::abs(one_step.parameter(v)[i] - expected) <= tolerance);
      }
    }
  }
}

TEST_CASE("a non-finite micro-batch skips the whole accumulated step and names its tower", "[checked][accumulation]") {
  pipeline_options options = with(nonfinite_policy::skip);
  options.accumulation_steps = 2;
  trainer<layout::flat<float>> p(variables, inputs, 3, {}, options);
  const auto before = state_of(p);
  gradients bad(3, 90);
  bad.values[2][1][77] = std::numeric_limits<float>::infinity();
  CHECK(step_with(p, bad).accumulating);
  const step_stats last = step_with(p, gradients(3, 91));
  REQUIRE(last.skipped);
  CHECK(last.nonfinite->tower == std::optional<std::size_t>(2));
  CHECK(last.nonfinite->element == 77);
  require_same(state_of(p), before);
  // The next window starts afresh.
  CHECK(step_with(p, gradients(3, 92)).accumulating);
  CHECK_FALSE(step_with(p, gradients(3, 93)).skipped);
  CHECK(p.steps_done() == 1);
  CHECK_THROWS_WITH((trainer<layout::flat<float>>(variables, inputs, 3, {}, [] {
                      pipeline_options zero;
                      zero.accumulation_steps = 0;
                      return zero;
                    }())),
                    Catch::Contains("accumulation_steps must be >= 1"));
}
