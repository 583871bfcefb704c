#pragma once
// A multi-layer perceptron classifier — ReLU hidden layers, softmax cross-entropy — with hand-written
// batched forward and backward passes on the CPU (GEMMs through gemm.hpp), for host towers. Variables
// are "layer<k>.weight" [out, in] and "layer<k>.bias" [out]; inputs are "image" (float32, one row of
// `layers.front()` features per example, row-major) and "label" (int32 class index).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "gemm.hpp"
#include "ready_marks.hpp"

namespace towerpipe_examples {

class mlp {
 public:
  explicit mlp(std::vector<std::size_t> layers) : layers_(std::move(layers)) {
    if (layers_.size() < 2) throw std::invalid_argument("an mlp needs at least an input and an output layer");
  }

  const std::vector<std::size_t>& layers() const { return layers_; }
  std::size_t inputs() const { return layers_.front(); }
  std::size_t classes() const { return layers_.back(); }
  std::string describe() const {
    std::string text = "MLP";
    for (std::size_t i = 0; i < layers_.size(); ++i) text += (i ? "-" : " ") + std::to_string(layers_[i]);
    return text;
  }

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
  // gradient(i) (variable i in variables() order). parameter(i) gives variable i's values; ready(i) is
  // called as each layer's variables are done (ready_marks.hpp).
  template <class Parameter, class Gradient, class Ready = no_ready_marks>
  double loss_and_gradient(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                           Parameter&& parameter, Gradient&& gradient, Ready ready = {}) const {
    const int batch = static_cast<int>(images.examples());
    std::vector<std::vector<float>> activation = forward(images, parameter);
    std::vector<float>& probabilities = activation.back();
    double loss = 0.0;
    const int classes_count = static_cast<int>(classes());
    for (int e = 0; e < batch; ++e) {
      float* row = probabilities.data() + static_cast<std::size_t>(e) * classes();
      softmax(row, classes_count);
      const std::int32_t label = check_label(labels(static_cast<std::size_t>(e), 0));
      loss -= std::log(std::max(row[label], 1e-30f));
      row[label] -= 1.0f;  // now the gradient of the summed loss with respect to the logits
    }
    std::vector<float> delta = std::move(probabilities), previous;
    const float scale = 1.0f / static_cast<float>(batch);
    const auto layer_done = [&](std::size_t k) {
      ready(2 * k);
      ready(2 * k + 1);
    };
    for (std::size_t k = layers_.size() - 1; k-- > 0;) {
      const int in = static_cast<int>(layers_[k]), out = static_cast<int>(layers_[k + 1]);
      const float* input = k == 0 ? images.data() : activation[k].data();
      gemm(true, false, out, in, batch, scale, delta.data(), out, input, in, 0.0f, gradient(2 * k), in);
      float* bias_gradient = gradient(2 * k + 1);
      std::fill_n(bias_gradient, out, 0.0f);
      for (int e = 0; e < batch; ++e) {
        for (int o = 0; o < out; ++o) bias_gradient[o] += scale * delta[static_cast<std::size_t>(e * out + o)];
      }
      if (k == 0) {
        layer_done(0);  // the images need no gradient: the weight is not read again
        break;
      }
      previous.assign(static_cast<std::size_t>(batch) * static_cast<std::size_t>(in), 0.0f);
      gemm(false, false, batch, in, out, 1.0f, delta.data(), out, parameter(2 * k), in, 0.0f, previous.data(), in);
      layer_done(k);  // the weight's last read: the delta it propagated to layer k - 1
      const std::vector<float>& h = activation[k];
      for (std::size_t i = 0; i < previous.size(); ++i) {
        if (h[i] <= 0.0f) previous[i] = 0.0f;  // ReLU
      }
      delta.swap(previous);
    }
    return loss / batch;
  }

  // Examples whose most probable class is their label.
  template <class Parameter>
  std::size_t count_correct(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                            Parameter&& parameter) const {
    const std::vector<std::vector<float>> activation = forward(images, parameter);
    const std::vector<float>& logits = activation.back();
    std::size_t correct = 0;
    for (std::size_t e = 0; e < images.examples(); ++e) {
      const float* row = logits.data() + e * classes();
      const auto best = std::max_element(row, row + classes()) - row;
      correct += best == check_label(labels(e, 0)) ? 1 : 0;
    }
    return correct;
  }

 private:
  // activation[k + 1] = layer k's output for every example (ReLU except for the logits); activation[0]
  // stays empty: the images are read in place.
  template <class Parameter>
  std::vector<std::vector<float>> forward(const towerpipe::batch_view<float>& images, Parameter& parameter) const {
    if (!images.is_row_major()) throw std::invalid_argument("the mlp example reads row-major images");
    const int batch = static_cast<int>(images.examples());
    std::vector<std::vector<float>> activation(layers_.size());
    for (std::size_t k = 0; k + 1 < layers_.size(); ++k) {
      const int in = static_cast<int>(layers_[k]), out = static_cast<int>(layers_[k + 1]);
      const float* input = k == 0 ? images.data() : activation[k].data();
      std::vector<float>& output = activation[k + 1];
      output.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(out));
      const float* bias = parameter(2 * k + 1);
      for (int e = 0; e < batch; ++e) std::copy(bias, bias + out, output.data() + static_cast<std::size_t>(e * out));
      gemm(false, true, batch, out, in, 1.0f, input, in, parameter(2 * k), in, 1.0f, output.data(), out);
      if (k + 2 < layers_.size()) {
        for (float& z : output) z = std::max(z, 0.0f);
      }
    }
    return activation;
  }

  static void softmax(float* logits, int count) {
    const float top = *std::max_element(logits, logits + count);
    float total = 0.0f;
    for (int i = 0; i < count; ++i) total += (logits[i] = std::exp(logits[i] - top));
    for (int i = 0; i < count; ++i) logits[i] /= total;
  }

  std::int32_t check_label(std::int32_t label) const {
    if (label < 0 || static_cast<std::size_t>(label) >= classes())
      throw std::out_of_range("label " + std::to_string(label) + " is outside [0, " + std::to_string(classes()) + ")");
    return label;
  }

  std::vector<std::size_t> layers_;
};

}  // namespace towerpipe_examples
