#pragma once
// The tutorial's convolutional network (TensorFlow's multi-GPU CIFAR-10 model, on one-channel images):
// conv 5x5x64 -> ReLU -> max-pool -> conv 5x5x64 -> ReLU -> max-pool -> fc 384 -> fc 192 -> fc 10,
// softmax cross-entropy, with hand-written forward and backward passes on the CPU for host towers:
// convolutions as im2col + GEMM (gemm.hpp: OpenBLAS), one example at a time. Two simplifications from
// the tutorial, made on both execution spaces alike: no local response normalisation, and 2x2/2
// max-pooling instead of 3x3/2 (the same output sizes). Convolutions are "SAME" (zero padding k/2,
// stride 1) cross-correlations, as in TensorFlow and cuDNN.
//
// Variables: conv1.weight [c1, channels, k, k], conv1.bias [c1], conv2.weight [c2, c1, k, k],
// conv2.bias [c2], fc1.weight [f1, c2 * (side/4)^2], fc1.bias, fc2.weight [f2, f1], fc2.bias,
// fc3.weight [classes, f2], fc3.bias. Images are channel-major (C, H, W) rows of side^2 * channels;
// the parameters' layout is cuDNN's (NCHW, KCRS), so GPU towers (cnn_cudnn.cuh) read them as they are.
// Real is the arithmetic type: float for training, double for the finite-difference test.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "gemm.hpp"
#include "ready_marks.hpp"

namespace towerpipe_examples {

struct cnn_architecture {
  std::size_t side = 28, channels = 1;  // input images: side x side, channels
  std::size_t kernel = 5;               // odd
  std::size_t conv1 = 64, conv2 = 64, fc1 = 384, fc2 = 192, classes = 10;
};

template <class Real = float>
class cnn {
 public:
  explicit cnn(cnn_architecture a = {}) : a_(a) {
    if (a.kernel % 2 == 0 || a.side % 4 != 0 || a.side == 0)
      throw std::invalid_argument("cnn: the kernel must be odd and the image side a positive multiple of 4");
  }

  const cnn_architecture& architecture() const { return a_; }
  std::size_t inputs() const { return a_.side * a_.side * a_.channels; }
  std::size_t classes() const { return a_.classes; }
  std::string describe() const {
    return "CNN conv" + std::to_string(a_.kernel) + "x" + std::to_string(a_.kernel) + "x" + std::to_string(a_.conv1) +
           "-pool-conv" + std::to_string(a_.kernel) + "x" + std::to_string(a_.kernel) + "x" + std::to_string(a_.conv2) +
           "-pool-fc" + std::to_string(a_.fc1) + "-fc" + std::to_string(a_.fc2) + "-fc" + std::to_string(a_.classes);
  }

  towerpipe::variable_set variables() const {
    towerpipe::variable_set set;
    const std::size_t k = a_.kernel;
    set.add("conv1.weight", {a_.conv1, a_.channels, k, k});
    set.add("conv1.bias", {a_.conv1});
    set.add("conv2.weight", {a_.conv2, a_.conv1, k, k});
    set.add("conv2.bias", {a_.conv2});
    set.add("fc1.weight", {a_.fc1, flattened()});
    set.add("fc1.bias", {a_.fc1});
    set.add("fc2.weight", {a_.fc2, a_.fc1});
    set.add("fc2.bias", {a_.fc2});
    set.add("fc3.weight", {a_.classes, a_.fc2});
    set.add("fc3.bias", {a_.classes});
    return set;
  }

  std::vector<towerpipe::input_spec> input_specs() const {
    return {{"image", towerpipe::dtype::float32, {inputs()}}, {"label", towerpipe::dtype::int32, {}}};
  }

  // He-uniform weights (fan-in: everything but the output dimension), zero biases, from a fixed seed.
  void initialize(const towerpipe::variable& v, towerpipe::tensor_view<Real> values, std::uint64_t& seed) const {
    if (v.shape.size() == 1) {
      std::fill(values.begin(), values.end(), Real(0));
      return;
    }
    std::size_t fan_in = 1;
    for (std::size_t d = 1; d < v.shape.size(); ++d) fan_in *= v.shape[d];
    const Real limit = std::sqrt(Real(6) / static_cast<Real>(fan_in));
    for (Real& w : values) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      const Real unit = static_cast<Real>(seed >> 40) / static_cast<Real>(1ULL << 24);  // [0, 1)
      w = (Real(2) * unit - Real(1)) * limit;
    }
  }

  // Mean cross-entropy over `examples` images; writes its gradient with respect to every variable into
  // gradient(i) (variable i in variables() order). parameter(i) gives variable i's values; ready(i) is
  // called as each layer's variables are done (ready_marks.hpp).
  template <class Parameter, class Gradient, class Ready = no_ready_marks>
  double loss_and_gradient(const Real* images, const std::int32_t* labels, std::size_t examples, Parameter&& parameter,
                           Gradient&& gradient, Ready ready = {}) const {
    activations act = forward(images, examples, parameter);
    const int batch = static_cast<int>(examples), classes_count = static_cast<int>(a_.classes);
    double loss = 0.0;
    std::vector<Real>& delta = act.logits;  // becomes the logits' gradient of the mean loss
    for (int e = 0; e < batch; ++e) {
      Real* row = delta.data() + static_cast<std::size_t>(e) * a_.classes;
      softmax(row, classes_count);
      const std::int32_t label = check_label(labels[e]);
      loss -= std::log(std::max<double>(row[label], 1e-30));
      row[label] -= Real(1);
      for (int c = 0; c < classes_count; ++c) row[c] /= static_cast<Real>(batch);
    }
    // A layer's weight (variable `weight`) and bias are done.
    const auto layer_done = [&](std::size_t weight) {
      ready(weight);
      ready(weight + 1);
    };
    // The three fully connected layers, last first; dense_backward leaves the input's gradient in delta.
    std::vector<Real> previous;
    dense_backward(act.fc2, a_.fc2, a_.classes, delta, parameter(8), gradient(8), gradient(9), batch, &previous);
    layer_done(8);
    relu_backward(previous, act.fc2);
    delta.swap(previous);
    dense_backward(act.fc1, a_.fc1, a_.fc2, delta, parameter(6), gradient(6), gradient(7), batch, &previous);
    layer_done(6);
    relu_backward(previous, act.fc1);
    delta.swap(previous);
    dense_backward(act.pooled2, flattened(), a_.fc1, delta, parameter(4), gradient(4), gradient(5), batch, &previous);
    layer_done(4);
    // The convolutions, one example at a time.
    const std::size_t half = a_.side / 2, quarter = a_.side / 4;
    const std::size_t map1 = a_.side * a_.side, map2 = half * half;
    std::fill_n(gradient(0), a_.conv1 * a_.channels * a_.kernel * a_.kernel, Real(0));
    std::fill_n(gradient(1), a_.conv1, Real(0));
    std::fill_n(gradient(2), a_.conv2 * a_.conv1 * a_.kernel * a_.kernel, Real(0));
    std::fill_n(gradient(3), a_.conv2, Real(0));
    std::vector<Real> d_conv2(a_.conv2 * map2), d_pooled1(a_.conv1 * map2), d_conv1(a_.conv1 * map1), columns, d_columns;
    for (std::size_t e = 0; e < examples; ++e) {
      // pool2 -> ReLU -> conv2 (whose input is pool1's output).
      unpool(previous.data() + e * flattened(), act.argmax2.data() + e * a_.conv2 * quarter * quarter,
             a_.conv2 * quarter * quarter, d_conv2);
      relu_backward(d_conv2, act.conv2.data() + e * a_.conv2 * map2);
      conv_backward(act.pooled1.data() + e * a_.conv1 * map2, a_.conv1, half, a_.conv2, d_conv2.data(), parameter(2),
                    gradient(2), gradient(3), &d_pooled1, columns, d_columns);
      // pool1 -> ReLU -> conv1 (its input is the image: no input gradient needed).
      unpool(d_pooled1.data(), act.argmax1.data() + e * a_.conv1 * map2, a_.conv1 * map2, d_conv1);
      relu_backward(d_conv1, act.conv1.data() + e * a_.conv1 * map1);
      conv_backward(images + e * inputs(), a_.channels, a_.side, a_.conv1, d_conv1.data(), parameter(0), gradient(0),
                    gradient(1), nullptr, columns, d_columns);
    }
    // The convolutions' gradients are sums over the examples of that loop: done only after it.
    layer_done(2);
    layer_done(0);
    return loss / static_cast<double>(batch);
  }

  template <class Parameter, class Gradient, class Ready = no_ready_marks>
  double loss_and_gradient(const towerpipe::batch_view<Real>& images, const towerpipe::batch_view<std::int32_t>& labels,
                           Parameter&& parameter, Gradient&& gradient, Ready ready = {}) const {
    return loss_and_gradient(row_major(images), labels.data(), images.examples(), parameter, gradient, ready);
  }

  // Examples whose most probable class is their label.
  template <class Parameter>
  std::size_t count_correct(const towerpipe::batch_view<Real>& images, const towerpipe::batch_view<std::int32_t>& labels,
                            Parameter&& parameter) const {
    std::size_t correct = 0;
    // In slices, so that the activations of a whole test set need not fit at once.
    for (std::size_t first = 0; first < images.examples(); first += 256) {
      const std::size_t count = std::min<std::size_t>(256, images.examples() - first);
      const activations act = forward(row_major(images) + first * inputs(), count, parameter);
      for (std::size_t e = 0; e < count; ++e) {
        const Real* row = act.logits.data() + e * a_.classes;
        const auto best = std::max_element(row, row + a_.classes) - row;
        correct += best == check_label(labels(first + e, 0)) ? 1 : 0;
      }
    }
    return correct;
  }

 private:
  // What the backward pass needs of the forward pass, per example in a row: ReLU outputs before pooling,
  // pooled maps, the flat index (within the example's maps) each pooled value came from, and the dense
  // layers' outputs.
  struct activations {
    std::vector<Real> conv1, pooled1, conv2, pooled2, fc1, fc2, logits;
    std::vector<std::uint32_t> argmax1, argmax2;
  };

  std::size_t flattened() const { return a_.conv2 * (a_.side / 4) * (a_.side / 4); }

  template <class Parameter>
  activations forward(const Real* images, std::size_t examples, Parameter& parameter) const {
    const std::size_t half = a_.side / 2, quarter = a_.side / 4;
    const std::size_t map1 = a_.side * a_.side, map2 = half * half, map4 = quarter * quarter;
    activations act;
    act.conv1.resize(examples * a_.conv1 * map1);
    act.pooled1.resize(examples * a_.conv1 * map2);
    act.argmax1.resize(act.pooled1.size());
    act.conv2.resize(examples * a_.conv2 * map2);
    act.pooled2.resize(examples * a_.conv2 * map4);
    act.argmax2.resize(act.pooled2.size());
    std::vector<Real> columns;
    for (std::size_t e = 0; e < examples; ++e) {
      Real* c1 = act.conv1.data() + e * a_.conv1 * map1;
      conv_forward(images + e * inputs(), a_.channels, a_.side, a_.conv1, parameter(0), parameter(1), c1, columns);
      pool(c1, a_.conv1, a_.side, act.pooled1.data() + e * a_.conv1 * map2, act.argmax1.data() + e * a_.conv1 * map2);
      Real* c2 = act.conv2.data() + e * a_.conv2 * map2;
      conv_forward(act.pooled1.data() + e * a_.conv1 * map2, a_.conv1, half, a_.conv2, parameter(2), parameter(3), c2,
                   columns);
      pool(c2, a_.conv2, half, act.pooled2.data() + e * a_.conv2 * map4, act.argmax2.data() + e * a_.conv2 * map4);
    }
    const int batch = static_cast<int>(examples);
    dense_forward(act.pooled2, flattened(), a_.fc1, parameter(4), parameter(5), batch, act.fc1, true);
    dense_forward(act.fc1, a_.fc1, a_.fc2, parameter(6), parameter(7), batch, act.fc2, true);
    dense_forward(act.fc2, a_.fc2, a_.classes, parameter(8), parameter(9), batch, act.logits, false);
    return act;
  }

  // columns[(c * k + i) * k + j][y * side + x] = input[c][y + i - k/2][x + j - k/2], zero outside.
  void im2col(const Real* input, std::size_t channels, std::size_t side, std::vector<Real>& columns) const {
    const std::size_t k = a_.kernel, pixels = side * side;
    const long pad = static_cast<long>(k / 2), extent = static_cast<long>(side);
    columns.resize(channels * k * k * pixels);
    for (std::size_t c = 0; c < channels; ++c) {
      for (std::size_t i = 0; i < k; ++i) {
        for (std::size_t j = 0; j < k; ++j) {
          Real* row = columns.data() + ((c * k + i) * k + j) * pixels;
          for (long y = 0; y < extent; ++y) {
            const long from_y = y + static_cast<long>(i) - pad;
            for (long x = 0; x < extent; ++x) {
              const long from_x = x + static_cast<long>(j) - pad;
              const bool inside = from_y >= 0 && from_y < extent && from_x >= 0 && from_x < extent;
              row[y * extent + x] = inside ? input[(static_cast<long>(c) * extent + from_y) * extent + from_x] : Real(0);
            }
          }
        }
      }
    }
  }

  // The adjoint of im2col: adds every column entry's gradient back onto the input pixel it was read from.
  void col2im(const std::vector<Real>& d_columns, std::size_t channels, std::size_t side, Real* d_input) const {
    const std::size_t k = a_.kernel, pixels = side * side;
    const long pad = static_cast<long>(k / 2), extent = static_cast<long>(side);
    std::fill_n(d_input, channels * pixels, Real(0));
    for (std::size_t c = 0; c < channels; ++c) {
      for (std::size_t i = 0; i < k; ++i) {
        for (std::size_t j = 0; j < k; ++j) {
          const Real* row = d_columns.data() + ((c * k + i) * k + j) * pixels;
          for (long y = 0; y < extent; ++y) {
            const long to_y = y + static_cast<long>(i) - pad;
            if (to_y < 0 || to_y >= extent) continue;
            for (long x = 0; x < extent; ++x) {
              const long to_x = x + static_cast<long>(j) - pad;
              if (to_x >= 0 && to_x < extent) d_input[(static_cast<long>(c) * extent + to_y) * extent + to_x] += row[y * extent + x];
            }
          }
        }
      }
    }
  }

  // output[o][pixel] = relu(bias[o] + sum over (c, i, j) of weight[o][c][i][j] * input[c][pixel + (i, j) - k/2]).
  void conv_forward(const Real* input, std::size_t channels, std::size_t side, std::size_t outputs, const Real* weight,
                    const Real* bias, Real* output, std::vector<Real>& columns) const {
    const int pixels = static_cast<int>(side * side), depth = static_cast<int>(channels * a_.kernel * a_.kernel);
    im2col(input, channels, side, columns);
    for (std::size_t o = 0; o < outputs; ++o) std::fill_n(output + o * side * side, side * side, bias[o]);
    gemm(false, false, static_cast<int>(outputs), pixels, depth, Real(1), weight, depth, columns.data(), pixels, Real(1),
         output, pixels);
    for (std::size_t i = 0; i < outputs * side * side; ++i) output[i] = std::max(output[i], Real(0));
  }

  // Adds this example's weight and bias gradients (d_output: the gradient before the ReLU, [outputs][pixels])
  // and, when d_input is given, writes the gradient with respect to the input.
  void conv_backward(const Real* input, std::size_t channels, std::size_t side, std::size_t outputs, const Real* d_output,
                     const Real* weight, Real* d_weight, Real* d_bias, std::vector<Real>* d_input,
                     std::vector<Real>& columns, std::vector<Real>& d_columns) const {
    const int pixels = static_cast<int>(side * side), depth = static_cast<int>(channels * a_.kernel * a_.kernel);
    im2col(input, channels, side, columns);
    gemm(false, true, static_cast<int>(outputs), depth, pixels, Real(1), d_output, pixels, columns.data(), pixels, Real(1),
         d_weight, depth);
    for (std::size_t o = 0; o < outputs; ++o) {
      for (int p = 0; p < pixels; ++p) d_bias[o] += d_output[o * static_cast<std::size_t>(pixels) + static_cast<std::size_t>(p)];
    }
    if (d_input == nullptr) return;
    d_columns.resize(static_cast<std::size_t>(depth) * static_cast<std::size_t>(pixels));
    gemm(true, false, depth, pixels, static_cast<int>(outputs), Real(1), weight, depth, d_output, pixels, Real(0),
         d_columns.data(), pixels);
    col2im(d_columns, channels, side, d_input->data());
  }

  // 2x2 max-pooling with stride 2 over `maps` maps of side x side; argmax[q]: the flat index (within
  // these maps) of the value pooled[q] came from, the first of the window on a tie.
  static void pool(const Real* input, std::size_t maps, std::size_t side, Real* pooled, std::uint32_t* argmax) {
    const std::size_t half = side / 2;
    for (std::size_t m = 0; m < maps; ++m) {
      for (std::size_t y = 0; y < half; ++y) {
        for (std::size_t x = 0; x < half; ++x) {
          std::size_t best = (m * side + 2 * y) * side + 2 * x;
          for (std::size_t dy = 0; dy < 2; ++dy) {
            for (std::size_t dx = 0; dx < 2; ++dx) {
              const std::size_t at = (m * side + 2 * y + dy) * side + 2 * x + dx;
              if (input[at] > input[best]) best = at;
            }
          }
          const std::size_t q = (m * half + y) * half + x;
          pooled[q] = input[best];
          argmax[q] = static_cast<std::uint32_t>(best);
        }
      }
    }
  }

  // The pooling's adjoint: every pooled gradient goes to the input it came from (windows do not overlap).
  static void unpool(const Real* d_pooled, const std::uint32_t* argmax, std::size_t count, std::vector<Real>& d_input) {
    std::fill(d_input.begin(), d_input.end(), Real(0));
    for (std::size_t q = 0; q < count; ++q) d_input[argmax[q]] = d_pooled[q];
  }

  // output[e] = input[e] W^T + b, then ReLU where `relu`.
  static void dense_forward(const std::vector<Real>& input, std::size_t in, std::size_t out, const Real* weight,
                            const Real* bias, int batch, std::vector<Real>& output, bool relu) {
    output.resize(static_cast<std::size_t>(batch) * out);
    for (int e = 0; e < batch; ++e) std::copy(bias, bias + out, output.data() + static_cast<std::size_t>(e) * out);
    gemm(false, true, batch, static_cast<int>(out), static_cast<int>(in), Real(1), input.data(), static_cast<int>(in),
         weight, static_cast<int>(in), Real(1), output.data(), static_cast<int>(out));
    if (relu) {
      for (Real& z : output) z = std::max(z, Real(0));
    }
  }

  // From delta (the gradient of the layer's pre-activation output): the weight and bias gradients, and the
  // gradient with respect to the layer's input into *d_input.
  static void dense_backward(const std::vector<Real>& input, std::size_t in, std::size_t out, const std::vector<Real>& delta,
                             const Real* weight, Real* d_weight, Real* d_bias, int batch, std::vector<Real>* d_input) {
    gemm(true, false, static_cast<int>(out), static_cast<int>(in), batch, Real(1), delta.data(), static_cast<int>(out),
         input.data(), static_cast<int>(in), Real(0), d_weight, static_cast<int>(in));
    std::fill_n(d_bias, out, Real(0));
    for (int e = 0; e < batch; ++e) {
      for (std::size_t o = 0; o < out; ++o) d_bias[o] += delta[static_cast<std::size_t>(e) * out + o];
    }
    d_input->assign(static_cast<std::size_t>(batch) * in, Real(0));
    gemm(false, false, batch, static_cast<int>(in), static_cast<int>(out), Real(1), delta.data(), static_cast<int>(out),
         weight, static_cast<int>(in), Real(0), d_input->data(), static_cast<int>(in));
  }

  // Zeroes the gradient where the ReLU's output was not positive.
  static void relu_backward(std::vector<Real>& delta, const Real* output) {
    for (std::size_t i = 0; i < delta.size(); ++i) {
      if (output[i] <= Real(0)) delta[i] = Real(0);
    }
  }
  static void relu_backward(std::vector<Real>& delta, const std::vector<Real>& output) { relu_backward(delta, output.data()); }

  static void softmax(Real* logits, int count) {
    const Real top = *std::max_element(logits, logits + count);
    Real total = 0;
    for (int i = 0; i < count; ++i) total += (logits[i] = std::exp(logits[i] - top));
    for (int i = 0; i < count; ++i) logits[i] /= total;
  }

  const Real* row_major(const towerpipe::batch_view<Real>& images) const {
    if (!images.is_row_major() || images.features() != inputs())
      throw std::invalid_argument("the cnn example reads row-major images of " + std::to_string(inputs()) + " values");
    return images.data();
  }

  std::int32_t check_label(std::int32_t label) const {
    if (label < 0 || static_cast<std::size_t>(label) >= a_.classes)
      throw std::out_of_range("label " + std::to_string(label) + " is outside [0, " + std::to_string(a_.classes) + ")");
    return label;
  }

  cnn_architecture a_;
};

}  // namespace towerpipe_examples
