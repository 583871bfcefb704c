// Each optimizer against a float64 reference written here from torch.optim's documented algorithm,
// run through a host pipeline for 120 steps on fresh random gradients.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::random_source;

namespace {

constexpr std::size_t elements = 1000;
constexpr int steps = 120;

// torch.optim.SGD's documented algorithm, in double.
struct sgd_reference {
  optim::sgd::hyper_parameters h;
  std::vector<double> buffer;
  void step(int t, std::vector<double>& p, const std::vector<float>& grad) {
    buffer.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (h.weight_decay != 0) g += h.weight_decay * p[i];
      if (h.momentum != 0) {
        buffer[i] = t > 1 ? h.momentum * buffer[i] + (1 - h.dampening) * g : g;
        g = h.nesterov ? g + h.momentum * buffer[i] : buffer[i];
      }
      p[i] -= h.lr * g;
    }
  }
};

// torch.optim.Adam (decoupled = false) and AdamW (decoupled = true), documented algorithms, in double.
struct adam_reference {
  adam_reference(double lr_, double beta1_, double beta2_, double eps_, double weight_decay_, bool decoupled_)
      : lr(lr_), beta1(beta1_), beta2(beta2_), eps(eps_), weight_decay(weight_decay_), decoupled(decoupled_) {}
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  bool bias_correction = true;  // false only to show that the test tells the difference
  std::vector<double> m, v;
  void step(int t, std::vector<double>& p, const std::vector<float>& grad) {
    m.resize(p.size());
    v.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (decoupled) p[i] -= lr * weight_decay * p[i];
      else if (weight_decay != 0) g += weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double m_hat = bias_correction ? m[i] / (1 - std::pow(beta1, t)) : m[i];
      const double v_hat = bias_correction ? v[i] / (1 - std::pow(beta2, t)) : v[i];
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

template <class Optim>
using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<float>>;

// Largest |float result - float64 reference| over all steps, relative to max(1, |reference|).
template <class Optim, class Reference>
double max_deviation(const typename Optim::hyper_parameters& h, Reference reference, float gradient_scale,
                     std::uint64_t salt) {
  random_source random(salt);
  INFO("seed " << random.seed());
  const std::vector<float> initial = random.normal(elements);
  trainer<Optim> p(variable_set{{"theta", {elements}}}, {{"x", dtype::float32, {1}}}, 1, h);
  p.set_parameter("theta", initial.data(), initial.size());
  std::vector<double> expected(initial.begin(), initial.end());
  const float x = 1.0f;
  batch b;
  b.add("x", &x, 1, {1});
  double worst = 0;
  for (int t = 1; t <= steps; ++t) {
    const std::vector<float> grad = random.normal(elements, gradient_scale);
    p.step(b, [&](typename trainer<Optim>::tower_context& tower) {
      tower.write_gradient("theta", grad.data(), grad.size());
      return 0.0;
    });
    reference.step(t, expected, grad);
    for (std::size_t i = 0; i < elements; ++i)
      worst = std::max(worst, std::fabs(p.parameter(0)[i] - expected[i]) / std::max(1.0, std::fabs(expected[i])));
  }
  return worst;
}

// float32 arithmetic over 120 steps stays well within this of the exact algorithm; every formula slip
// tried (missing bias correction, eps inside the root, wrong momentum start) moves results by far more.
constexpr double tolerance = 2e-5;

}  // namespace

TEST_CASE("sgd matches torch.optim.SGD's algorithm", "[optim]") {
  struct named_case {
    const char* name;
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
  };
  const named_case cases[] = {
      {"plain", 0.05, 0, 0, 0, false},           {"weight decay", 0.05, 0, 0, 0.1, false},
      {"momentum", 0.02, 0.9, 0, 0, false},      {"momentum + dampening", 0.02, 0.9, 0.3, 0, false},
      {"nesterov", 0.02, 0.8, 0, 0, true},       {"nesterov + weight decay", 0.02, 0.8, 0, 0.05, true},
      {"all of momentum, dampening, decay", 0.01, 0.5, 0.5, 0.2, false},
  };
  std::uint64_t salt = 10;
  for (const named_case& c : cases) {
    INFO(c.name);
    optim::sgd::hyper_parameters h;
    h.lr = c.lr;
    h.momentum = c.momentum;
    h.dampening = c.dampening;
    h.weight_decay = c.weight_decay;
    h.nesterov = c.nesterov;
    CHECK(max_deviation<optim::sgd>(h, sgd_reference{h, {}}, 1.0f, ++salt) < tolerance);
  }
}

TEST_CASE("adam and adamw match torch.optim.Adam and AdamW's algorithms", "[optim]") {
  struct named_case {
    const char* name;
    double lr, beta1, beta2, eps, weight_decay;
    float gradient_scale;
  };
  // Gradients of 1e-3 with eps = 1e-3 make eps's place (after the square root) visible.
  const named_case cases[] = {
      {"defaults", 1e-3, 0.9, 0.999, 1e-8, 0, 1.0f},
      {"large lr, weight decay", 1e-2, 0.9, 0.999, 1e-8, 0.1, 1.0f},
      {"eps comparable to the gradients", 1e-2, 0.8, 0.99, 1e-3, 0, 1e-3f},
      {"beta1 = 0", 1e-2, 0.0, 0.9, 1e-6, 0.01, 0.5f},
  };
  std::uint64_t salt = 20;
  for (const named_case& c : cases) {
    INFO(c.name);
    const optim::adam::hyper_parameters adam{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
    const optim::adamw::hyper_parameters adamw{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
    CHECK(max_deviation<optim::adam>(adam, adam_reference{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, false},
                                     c.gradient_scale, ++salt) < tolerance);
    CHECK(max_deviation<optim::adamw>(adamw, adam_reference{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, true},
                                      c.gradient_scale, ++salt) < tolerance);
  }
}

TEST_CASE("the optimizer tolerance is tight enough to see a missing bias correction", "[optim]") {
  optim::adam::hyper_parameters h;
  h.lr = 1e-2;
  adam_reference wrong{1e-2, 0.9, 0.999, 1e-8, 0, false};
  wrong.bias_correction = false;
  CHECK(max_deviation<optim::adam>(h, wrong, 1.0f, 30) > 100 * tolerance);
}

TEST_CASE("adamw's defaults are torch's", "[optim]") {
  const optim::adamw::hyper_parameters w;
  CHECK(w.lr == 1e-3);
  CHECK(w.weight_decay == 1e-2);
  CHECK(w.eps == 1e-8);
  CHECK(optim::adam::hyper_parameters().weight_decay == 0.0);
}

TEST_CASE("bias corrections are computed in double once per step and rounded to float", "[optim]") {
  optim::adam::hyper_parameters h;
  h.lr = 3e-4;
  h.beta1 = 0.85;
  h.beta2 = 0.995;
  for (std::int64_t t : {1, 2, 10, 1000}) {
    const auto c = optim::adam::constants<float>(h, t);
    CHECK(c.step_size == static_cast<float>(3e-4 / (1.0 - std::pow(0.85, static_cast<double>(t)))));
    CHECK(c.bias_correction2_sqrt == static_cast<float>(std::sqrt(1.0 - std::pow(0.995, static_cast<double>(t)))));
  }
}

TEST_CASE("bad hyper-parameters are rejected as torch rejects them", "[optim][errors]") {
  const auto sgd_with = [](auto change) {
    optim::sgd::hyper_parameters h;
    change(h);
    optim::sgd::validate(h);
  };
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.lr = -0.1; }), Catch::Contains("sgd: invalid learning rate -0.1"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.lr = std::nan(""); }), Catch::Contains("invalid learning rate nan"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.lr = INFINITY; }), Catch::Contains("invalid learning rate inf"));
  // Finite in double, infinite in float: parameters would become -inf after one step.
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.lr = 1e39; }), Catch::Contains("invalid learning rate 1e+39 (must be >= 0 and finite in float)"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.weight_decay = 1e39; }), Catch::Contains("invalid weight_decay 1e+39"));
  CHECK_NOTHROW(sgd_with([](auto& h) { h.lr = 3e38; }));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.momentum = -1; }), Catch::Contains("invalid momentum"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.weight_decay = -1; }), Catch::Contains("invalid weight_decay"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) { h.nesterov = true; }), Catch::Contains("nesterov momentum requires"));
  CHECK_THROWS_WITH(sgd_with([](auto& h) {
                      h.nesterov = true;
                      h.momentum = 0.9;
                      h.dampening = 0.1;
                    }),
                    Catch::Contains("zero dampening"));
  CHECK_NOTHROW(sgd_with([](auto& h) {
    h.nesterov = true;
    h.momentum = 0.9;
  }));

  const auto adam_with = [](auto change) {
    optim::adamw::hyper_parameters h;
    change(h);
    optim::adamw::validate(h);
  };
  CHECK_THROWS_WITH(adam_with([](auto& h) { h.beta1 = 1.0; }), Catch::Contains("adamw: invalid beta1 1"));
  CHECK_THROWS_WITH(adam_with([](auto& h) { h.beta2 = -0.1; }), Catch::Contains("invalid beta2 -0.1"));
  CHECK_THROWS_WITH(adam_with([](auto& h) { h.beta2 = std::nan(""); }), Catch::Contains("invalid beta2 nan"));
  CHECK_THROWS_WITH(adam_with([](auto& h) { h.eps = -1e-8; }), Catch::Contains("invalid epsilon"));
  CHECK_THROWS_WITH(adam_with([](auto& h) { h.weight_decay = -1e-2; }), Catch::Contains("invalid weight_decay"));
  CHECK_THROWS_AS(adam_with([](auto& h) { h.lr = -1; }), towerpipe::error);
}
