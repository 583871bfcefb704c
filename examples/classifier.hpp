#pragma once
// The training program's model, chosen at run time (--model): the MLP (mlp.hpp) or the tutorial's CNN
// (cnn.hpp). The pipeline's type does not depend on it: only the variables, the towers' program and the
// evaluation do, so one instantiation of each pipeline serves both.

#include <string>
#include <variant>

#include "cnn.hpp"
#include "mlp.hpp"
#include "ready_marks.hpp"

namespace towerpipe_examples {

class classifier {
 public:
  // "mlp": 784-256-128-10 (input width from the data); "cnn": the tutorial's network on 28x28 images.
  classifier(const std::string& name, std::size_t features) : model_(make(name, features)) {}

  const mlp* as_mlp() const { return std::get_if<mlp>(&model_); }
  const cnn<float>* as_cnn() const { return std::get_if<cnn<float>>(&model_); }

  std::string describe() const {
    return std::visit([](const auto& m) { return m.describe(); }, model_);
  }
  towerpipe::variable_set variables() const {
    return std::visit([](const auto& m) { return m.variables(); }, model_);
  }
  std::vector<towerpipe::input_spec> input_specs() const {
    return std::visit([](const auto& m) { return m.input_specs(); }, model_);
  }
  void initialize(const towerpipe::variable& v, towerpipe::tensor_view<float> values, std::uint64_t& seed) const {
    std::visit([&](const auto& m) { m.initialize(v, values, seed); }, model_);
  }
  template <class Parameter, class Gradient, class Ready = no_ready_marks>
  double loss_and_gradient(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                           Parameter&& parameter, Gradient&& gradient, Ready ready = {}) const {
    return std::visit([&](const auto& m) { return m.loss_and_gradient(images, labels, parameter, gradient, ready); }, model_);
  }
  template <class Parameter>
  std::size_t count_correct(const towerpipe::batch_view<float>& images, const towerpipe::batch_view<std::int32_t>& labels,
                            Parameter&& parameter) const {
    return std::visit([&](const auto& m) { return m.count_correct(images, labels, parameter); }, model_);
  }

 private:
  static std::variant<mlp, cnn<float>> make(const std::string& name, std::size_t features) {
    if (name == "mlp") return mlp({features, 256, 128, 10});
    const cnn<float> network;
    if (features != network.inputs())
      throw std::runtime_error("--model cnn reads 28x28 one-channel images (" + std::to_string(network.inputs()) +
                               " values); this data has " + std::to_string(features) + " per example");
    return network;
  }

  std::variant<mlp, cnn<float>> model_;
};

}  // namespace towerpipe_examples
