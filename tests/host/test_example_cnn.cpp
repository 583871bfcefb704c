// The training program's CNN (examples/cnn.hpp) on host towers: its loss against a direct
// convolution written here (no im2col, no GEMM), every gradient element against central finite
// differences of that loss, in double on a small architecture, and where its backward pass marks
// each layer's gradients ready.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backward_log.hpp"
#include "cnn.hpp"

namespace {

using towerpipe_examples::cnn;
using towerpipe_examples::cnn_architecture;

cnn_architecture small_architecture() {
  cnn_architecture a;
  a.side = 8;
  a.channels = 2;
  a.kernel = 3;
  a.conv1 = 3;
  a.conv2 = 4;
  a.fc1 = 5;
  a.fc2 = 6;
  a.classes = 3;
  return a;
}

// The network's mean cross-entropy, straight from its definition: "SAME" cross-correlation + bias +
// ReLU, 2x2/2 max-pooling, dense layers, log-softmax.
double reference_loss(const cnn_architecture& a, const std::vector<std::vector<double>>& p, const std::vector<double>& images,
                      const std::vector<std::int32_t>& labels) {
  using map = std::vector<double>;  // channels x side x side
  const auto convolve = [&](const map& in, std::size_t channels, std::size_t side, const std::vector<double>& w,
                            const std::vector<double>& b, std::size_t outputs) {
    map out(outputs * side * side);
    const long k = static_cast<long>(a.kernel), pad = k / 2, n = static_cast<long>(side);
    for (std::size_t o = 0; o < outputs; ++o) {
      for (long y = 0; y < n; ++y) {
        for (long x = 0; x < n; ++x) {
          double sum = b[o];
          for (std::size_t c = 0; c < channels; ++c) {
            for (long i = 0; i < k; ++i) {
              for (long j = 0; j < k; ++j) {
                const long yy = y + i - pad, xx = x + j - pad;
                if (yy < 0 || yy >= n || xx < 0 || xx >= n) continue;
                sum += w[((o * channels + c) * a.kernel + static_cast<std::size_t>(i)) * a.kernel + static_cast<std::size_t>(j)] *
                       in[(c * side + static_cast<std::size_t>(yy)) * side + static_cast<std::size_t>(xx)];
              }
            }
          }
          out[(o * side + static_cast<std::size_t>(y)) * side + static_cast<std::size_t>(x)] = std::max(sum, 0.0);
        }
      }
    }
    return out;
  };
  const auto pool = [](const map& in, std::size_t maps, std::size_t side) {
    const std::size_t half = side / 2;
    map out(maps * half * half);
    for (std::size_t m = 0; m < maps; ++m) {
      for (std::size_t y = 0; y < half; ++y) {
        for (std::size_t x = 0; x < half; ++x) {
          const double* row = &in[(m * side + 2 * y) * side + 2 * x];
          out[(m * half + y) * half + x] = std::max({row[0], row[1], row[side], row[side + 1]});
        }
      }
    }
    return out;
  };
  const auto dense = [](const map& in, const std::vector<double>& w, const std::vector<double>& b, bool relu) {
    map out(b.size());
    for (std::size_t o = 0; o < b.size(); ++o) {
      double sum = b[o];
      for (std::size_t i = 0; i < in.size(); ++i) sum += w[o * in.size() + i] * in[i];
      out[o] = relu ? std::max(sum, 0.0) : sum;
    }
    return out;
  };
  const std::size_t inputs = a.side * a.side * a.channels;
  double total = 0.0;
  for (std::size_t e = 0; e < labels.size(); ++e) {
    const map image(images.begin() + static_cast<long>(e * inputs), images.begin() + static_cast<long>((e + 1) * inputs));
    const map c1 = pool(convolve(image, a.channels, a.side, p[0], p[1], a.conv1), a.conv1, a.side);
    const map c2 = pool(convolve(c1, a.conv1, a.side / 2, p[2], p[3], a.conv2), a.conv2, a.side / 2);
    const map logits = dense(dense(dense(c2, p[4], p[5], true), p[6], p[7], true), p[8], p[9], false);
    double top = logits[0], sum = 0.0;
    for (double z : logits) top = std::max(top, z);
    for (double z : logits) sum += std::exp(z - top);
    total -= logits[static_cast<std::size_t>(labels[e])] - top - std::log(sum);
  }
  return total / static_cast<double>(labels.size());
}

struct problem {
  cnn<double> model{small_architecture()};
  std::vector<std::vector<double>> parameters;
  std::vector<double> images;
  std::vector<std::int32_t> labels{0, 2, 1, 2, 0};

  problem() {
    std::mt19937_64 rng(7);
    std::normal_distribution<double> normal(0.0, 1.0);
    const towerpipe::variable_set variables = model.variables();
    for (std::size_t v = 0; v < variables.count(); ++v) {
      // Random biases too, so that their gradients are checked away from zero.
      std::vector<double> values(variables[v].size);
      for (double& x : values) x = 0.5 * normal(rng);
      parameters.push_back(values);
    }
    images.resize(labels.size() * model.inputs());
    for (double& x : images) x = normal(rng);
  }

  double loss(std::vector<std::vector<double>>* gradients = nullptr) {
    std::vector<std::vector<double>> ignored(parameters.size());
    auto& out = gradients ? *gradients : ignored;
    for (std::size_t v = 0; v < parameters.size(); ++v) out[v].assign(parameters[v].size(), -1.0);
    return model.loss_and_gradient(images.data(), labels.data(), labels.size(),
                                   [&](std::size_t v) { return parameters[v].data(); },
                                   [&](std::size_t v) { return out[v].data(); });
  }
};

}  // namespace

TEST_CASE("example cnn: the tutorial's variables and parameter count", "[examples][cnn]") {
  const towerpipe::variable_set variables = cnn<float>().variables();
  REQUIRE(variables.count() == 10);
  CHECK(variables[0].shape == towerpipe::shape{64, 1, 5, 5});
  CHECK(variables[4].shape == towerpipe::shape{384, 7 * 7 * 64});
  CHECK(variables[8].shape == towerpipe::shape{10, 192});
  // 64*25 + 64 + 64*64*25 + 64 + 384*3136 + 384 + 192*384 + 192 + 10*192 + 10
  CHECK(variables.total_size() == 1384586);
}

TEST_CASE("example cnn: loss equals a direct convolution's", "[examples][cnn]") {
  problem p;
  const double loss = p.loss();
  CHECK(loss == Approx(reference_loss(p.model.architecture(), p.parameters, p.images, p.labels)).epsilon(1e-12));
}

TEST_CASE("example cnn: every gradient element matches central finite differences", "[examples][cnn]") {
  problem p;
  std::vector<std::vector<double>> gradients(p.parameters.size());
  p.loss(&gradients);
  const double h = 1e-6;
  std::size_t checked = 0, nonzero = 0;
  for (std::size_t v = 0; v < p.parameters.size(); ++v) {
    for (std::size_t i = 0; i < p.parameters[v].size(); ++i) {
      const double saved = p.parameters[v][i];
      p.parameters[v][i] = saved + h;
      const double up = reference_loss(p.model.architecture(), p.parameters, p.images, p.labels);
      p.parameters[v][i] = saved - h;
      const double down = reference_loss(p.model.architecture(), p.parameters, p.images, p.labels);
      p.parameters[v][i] = saved;
      const double numeric = (up - down) / (2 * h);
      INFO("variable " << v << " element " << i << ": analytic " << gradients[v][i] << ", numeric " << numeric);
      CHECK(std::abs(gradients[v][i] - numeric) <= 1e-7 + 1e-6 * std::abs(numeric));
      ++checked;
      nonzero += numeric != 0.0 ? 1 : 0;
    }
  }
  CHECK(checked == p.model.variables().total_size());
  CHECK(nonzero > checked / 2);  // the check is not vacuous: most parameters move the loss
}

TEST_CASE("example cnn: each layer marked ready once, as its backward pass is done with it", "[examples][cnn]") {
  problem p;
  std::vector<std::vector<double>> gradients(p.parameters.size());
  for (std::size_t v = 0; v < gradients.size(); ++v) gradients[v].resize(p.parameters[v].size());
  towerpipe_tests::backward_log log;
  p.model.loss_and_gradient(p.images.data(), p.labels.data(), p.labels.size(), log.access(p.parameters),
                            log.access(gradients), log.ready());
  // fc3, fc2, fc1, then the convolutions, weight before bias.
  CHECK(log.marks() == std::vector<std::size_t>{8, 9, 6, 7, 4, 5, 2, 3, 0, 1});
  CHECK(log.touched_after_mark().empty());
  // A dense layer is marked before anything of the next layer down is touched; the convolutions'
  // gradients are sums over the examples, one example's conv2 and conv1 at a time, so conv2 waits for
  // the last example's conv1.
  for (std::size_t weight : {8, 6, 4, 0}) {
    for (std::size_t v : {weight, weight + 1}) {
      for (std::size_t other : log.touched_before_mark(v)) CHECK((other == weight || other == weight + 1));
    }
  }
  for (std::size_t other : log.touched_before_mark(2)) CHECK(other <= 3);
}
