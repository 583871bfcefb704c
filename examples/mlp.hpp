#pragma once
// A multi-layer perceptron classifier — ReLU hidden layers, softmax cross-entropy — with hand-written
// forward and backward passes on the CPU, for host towers. Variables are "layer<k>.weight" [out, in]
// and "layer<k>.bias" [out]; inputs are "image" (float32, one row of `layers.front()` features per
// example) and "label" (int32 class index).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/towerpipe.hpp>

namespace towerpipe_examples {

class mlp {
 public:
  explicit mlp(std::vector<std::size_t> layers) : layers_(std::move(layers)) {
    if (layers_.size() < 2) throw std::invalid_argument("an mlp needs at least an input and an output layer");
  }

  std::size_t inputs() const { return layers_.front(); }
  std::size_t classes() const { return layers_.back(); }

  towerpipe::variable_set variables() const {
    towerpipe::variable_set set;
    for (std::size_t k = 0; k + 1 < layers_.size(); ++k) {
      set.add("layer" + std::to_string(k) + ".weight", {layers_[k + 1], layers_[k]});
      set.add("layer" + std::to_string(k) + ".bias", {layers_[k + 1]});
    }
    return set;
  }

  std::vector<towerpipe::input_spec> input_specs() const {
    return {{"image", towerpipe::dtype::float32, {inputs()}}, {"label", towerpipe::dtype::int32, {}}};
  }

  // He-uniform weights, zero biases, from a fixed seed (a tiny LCG keeps runs identical on every platform).
  void initialize(const towerpipe::variable& v, towerpipe::tensor_view<float> values, std::uint64_t& seed) const {
    if (v.shape.size() == 1) {
      std::fill(values.begin(), values.end(), 0.0f);
      return;
    }
    const float limit = std::sqrt(6.0f / static_cast<float>(v.shape[1]));
    for (float& w : values) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      const float unit = static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 24);  // [0, 1)
      w = (2.0f * unit - 1.0f) * limit;
    }
  }

  // Mean cross-entropy over the examples; writes its gradient with respect to every variable into
  // gradient(i) (variable i in variables() order). parameter(i) gives variable i's values.
  template <class Parameter, class Gradient>
  double loss_and_gradient(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                           Parameter&& parameter, Gradient&& gradient) const {
    const std::size_t layer_count = layers_.size() - 1;
    for (std::size_t k = 0; k < layer_count; ++k) {
      std::fill_n(gradient(2 * k), layers_[k + 1] * layers_[k], 0.0f);
      std::fill_n(gradient(2 * k + 1), layers_[k + 1], 0.0f);
    }
    const float scale = 1.0f / static_cast<float>(images.examples());
    std::vector<std::vector<float>> activation(layers_.size());
    std::vector<float> delta, previous_delta;
    double loss = 0.0;
    for (std::size_t e = 0; e < images.examples(); ++e) {
      forward(images, e, parameter, activation);
      const std::int32_t label = check_label(labels(e, 0));
      std::vector<float>& p = activation.back();
      softmax(p);
      loss -= std::log(std::max(p[static_cast<std::size_t>(label)], 1e-30f));
      delta = p;
      delta[static_cast<std::size_t>(label)] -= 1.0f;
      for (std::size_t k = layer_count; k-- > 0;) {
        const std::size_t in = layers_[k], out = layers_[k + 1];
        const float* w = parameter(2 * k);
        float* dw = gradient(2 * k);
        float* db = gradient(2 * k + 1);
        const std::vector<float>& h = activation[k];
        for (std::size_t o = 0; o < out; ++o) {
          const float d = delta[o] * scale;
          db[o] += d;
          for (std::size_t i = 0; i < in; ++i) dw[o * in + i] += d * h[i];
        }
        if (k == 0) break;
        previous_delta.assign(in, 0.0f);
        for (std::size_t o = 0; o < out; ++o) {
          for (std::size_t i = 0; i < in; ++i) previous_delta[i] += w[o * in + i] * delta[o];
        }
        for (std::size_t i = 0; i < in; ++i) {
          if (h[i] <= 0.0f) previous_delta[i] = 0.0f;  // ReLU
        }
        delta.swap(previous_delta);
      }
    }
    return loss / static_cast<double>(images.examples());
  }

  // Examples whose most probable class is their label.
  template <class Parameter>
  std::size_t count_correct(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                            Parameter&& parameter) const {
    std::vector<std::vector<float>> activation(layers_.size());
    std::size_t correct = 0;
    for (std::size_t e = 0; e < images.examples(); ++e) {
      forward(images, e, parameter, activation);
      const std::vector<float>& logits = activation.back();
      const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
      correct += best == check_label(labels(e, 0)) ? 1 : 0;
    }
    return correct;
  }

 private:
  // activation[0] = image e; activation[k + 1] = layer k's output (ReLU except for the logits).
  template <class Parameter>
  void forward(const towerpipe::batch_view<float>& images, std::size_t e, Parameter& parameter,
               std::vector<std::vector<float>>& activation) const {
    activation[0].resize(inputs());
    for (std::size_t f = 0; f < inputs(); ++f) activation[0][f] = images(e, f);
    const std::size_t layer_count = layers_.size() - 1;
    for (std::size_t k = 0; k < layer_count; ++k) {
      const std::size_t in = layers_[k], out = layers_[k + 1];
      const float* w = parameter(2 * k);
      const float* b = parameter(2 * k + 1);
      activation[k + 1].assign(b, b + out);
      for (std::size_t o = 0; o < out; ++o) {
        float sum = 0.0f;
        for (std::size_t i = 0; i < in; ++i) sum += w[o * in + i] * activation[k][i];
        activation[k + 1][o] += sum;
        if (k + 1 < layer_count) activation[k + 1][o] = std::max(activation[k + 1][o], 0.0f);
      }
    }
  }

  static void softmax(std::vector<float>& logits) {
    const float top = *std::max_element(logits.begin(), logits.end());
    float total = 0.0f;
    for (float& z : logits) total += (z = std::exp(z - top));
    for (float& z : logits) z /= total;
  }

  std::int32_t check_label(std::int32_t label) const {
    if (label < 0 || static_cast<std::size_t>(label) >= classes())
      throw std::out_of_range("label " + std::to_string(label) + " is outside [0, " + std::to_string(classes()) + ")");
    return label;
  }

  std::vector<std::size_t> layers_;
};

}  // namespace towerpipe_examples
