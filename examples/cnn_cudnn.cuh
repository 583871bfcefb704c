#pragma once
// The CNN of cnn.hpp on a GPU tower: the same variables, layout (NCHW images, KCRS filters), math and
// initialisation. Convolutions and max-pooling through cuDNN (its long-standing descriptor API), the
// dense layers, softmax and bias sums through mlp_cuda.cuh (cuBLAS and small kernels), all on the
// tower's stream. Every cuDNN algorithm is chosen among the deterministic ones, and convolutions
// compute in FP32 (no TF32), so that a run's parameters are the same bits every time — the training
// program compares backends by their parameter checksum. One gpu_cnn_workspace per tower, made on
// first use by the tower's own thread.

#include <cudnn.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cnn.hpp"
#include "mlp_cuda.cuh"

namespace towerpipe_examples {

#define TOWERPIPE_EXAMPLES_CUDNN_CHECK(call)                                                                   \
  do {                                                                                                   \
    const cudnnStatus_t status_ = (call);                                                                \
    if (status_ != CUDNN_STATUS_SUCCESS)                                                                 \
      throw std::runtime_error(std::string(#call) + " failed: " + cudnnGetErrorString(status_));         \
  } while (0)

namespace cudnn_detail {

// An owning cuDNN descriptor: Create on construction, Destroy on destruction.
template <class Handle, cudnnStatus_t (*Create)(Handle*), cudnnStatus_t (*Destroy)(Handle)>
class descriptor {
 public:
  descriptor() { TOWERPIPE_EXAMPLES_CUDNN_CHECK(Create(&handle_)); }
  ~descriptor() { Destroy(handle_); }
  descriptor(const descriptor&) = delete;
  descriptor& operator=(const descriptor&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_{};
};
using tensor = descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using filter = descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using convolution =
    descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using pooling = descriptor<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

inline void set_nchw(const tensor& t, int n, int c, int h, int w) {
  TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnSetTensor4dDescriptor(t.get(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
}

// The first algorithm of cuDNN's heuristic ranking that succeeds and is deterministic.
template <class Perf>
auto first_deterministic(const Perf* ranked, int count, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (ranked[i].status == CUDNN_STATUS_SUCCESS && ranked[i].determinism == CUDNN_DETERMINISTIC) return ranked[i];
  }
  throw std::runtime_error(std::string("cuDNN offers no deterministic ") + what + " algorithm for this shape");
}

}  // namespace cudnn_detail

class gpu_cnn_workspace {
 public:
  gpu_cnn_workspace(const cnn_architecture& a, std::size_t max_examples, int device)
      : a_(a), max_examples_(max_examples), memory_{device}, dense_layers_{flattened(), a.fc1, a.fc2, a.classes} {
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnCreate(&cudnn_));
    TOWERPIPE_EXAMPLES_CUBLAS(cublasCreate(&cublas_));
    const std::size_t n = max_examples, map1 = a.side * a.side, map2 = map1 / 4;
    conv1_ = memory_.allocate<float>(n * a.conv1 * map1, 256);
    pooled1_ = memory_.allocate<float>(n * a.conv1 * map2, 256);
    conv2_ = memory_.allocate<float>(n * a.conv2 * map2, 256);
    d_conv1_ = memory_.allocate<float>(n * a.conv1 * map1, 256);
    d_pooled1_ = memory_.allocate<float>(n * a.conv1 * map2, 256);
    d_conv2_ = memory_.allocate<float>(n * a.conv2 * map2, 256);
    dense_.emplace_back(memory_.allocate<float>(n * flattened(), 256));  // pool2's output: the dense input
    for (std::size_t k = 1; k < dense_layers_.size(); ++k) dense_.push_back(memory_.allocate<float>(n * dense_layers_[k], 256));
    const std::size_t widest = std::max({flattened(), a.fc1, a.fc2, a.classes});
    spare_a_ = memory_.allocate<float>(n * widest, 256);
    spare_b_ = memory_.allocate<float>(n * widest, 256);
    d_dense_input_ = memory_.allocate<float>(n * flattened(), 256);
    losses_ = memory_.allocate<float>(n, 256);

    const int k = static_cast<int>(a.kernel), pad = k / 2;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnSetFilter4dDescriptor(filter1_.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                        static_cast<int>(a.conv1), static_cast<int>(a.channels), k, k));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnSetFilter4dDescriptor(filter2_.get(), CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                                        static_cast<int>(a.conv2), static_cast<int>(a.conv1), k, k));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(
        cudnnSetConvolution2dDescriptor(convolution_.get(), pad, pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnSetConvolutionMathType(convolution_.get(), CUDNN_FMA_MATH));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(
        cudnnSetPooling2dDescriptor(pool_.get(), CUDNN_POOLING_MAX_DETERMINISTIC, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
    cudnn_detail::set_nchw(bias1_, 1, static_cast<int>(a.conv1), 1, 1);
    cudnn_detail::set_nchw(bias2_, 1, static_cast<int>(a.conv2), 1, 1);
  }
  ~gpu_cnn_workspace() {
    cudnnDestroy(cudnn_);
    cublasDestroy(cublas_);
  }
  gpu_cnn_workspace(const gpu_cnn_workspace&) = delete;
  gpu_cnn_workspace& operator=(const gpu_cnn_workspace&) = delete;

  // One tower's forward and backward on its stream; the mean loss goes to tower.device_loss(); ready(i)
  // as each layer's variables are done (ready_marks.hpp).
  template <class Context, class Ready>
  void train_step(Context& tower, Ready&& ready) {
    const auto images = tower.template input<float>("image");
    const auto labels = tower.template input<std::int32_t>("label");
    const int batch = static_cast<int>(images.examples());
    const auto parameter = [&](std::size_t i) { return tower.parameter(i).data(); };
    const auto gradient = [&](std::size_t i) { return tower.gradient(i).data(); };
    cudaStream_t stream = tower.stream();
    float* delta = logits(stream, images.data(), batch, parameter);  // becomes the logits' gradient in place
    kernels::softmax_cross_entropy<<<kernels::blocks(batch), 256, 0, stream>>>(delta, labels.data(), losses_.get(), batch,
                                                                               static_cast<int>(a_.classes));
    kernels::channel_sums<kernels::channel_sum_threads>
        <<<1, kernels::channel_sum_threads, 0, stream>>>(tower.device_loss(), losses_.get(), batch, 1, 1, static_cast<float>(batch));
    dense_backward_pass(cublas_, stream, dense_layers_, dense_[0].get(), batch, [&](std::size_t i) { return parameter(4 + i); },
                        [&](std::size_t i) { return gradient(4 + i); }, dense_, delta, spare_a_.get(), spare_b_.get(),
                        d_dense_input_.get(), [&](std::size_t i) { ready(4 + i); });
    const shapes& s = shapes_for(batch);
    // pool2 -> ReLU -> conv2, whose input is pool1's output.
    pool_backward(s.conv2, conv2_.get(), s.pooled2, dense_[0].get(), d_dense_input_.get(), d_conv2_.get());
    relu_backward(d_conv2_.get(), conv2_.get(), batch * static_cast<int>(a_.conv2 * a_.side * a_.side / 4));
    conv_backward(s.pooled1, pooled1_.get(), filter2_, parameter(2), s.conv2, d_conv2_.get(), s.backward2, gradient(2),
                  gradient(3), static_cast<int>(a_.conv2), batch, static_cast<int>(a_.side * a_.side / 4), d_pooled1_.get());
    ready(2);
    ready(3);
    // pool1 -> ReLU -> conv1, whose input is the image (no input gradient needed).
    pool_backward(s.conv1, conv1_.get(), s.pooled1, pooled1_.get(), d_pooled1_.get(), d_conv1_.get());
    relu_backward(d_conv1_.get(), conv1_.get(), batch * static_cast<int>(a_.conv1 * a_.side * a_.side));
    conv_backward(s.images, images.data(), filter1_, parameter(0), s.conv1, d_conv1_.get(), s.backward1, gradient(0),
                  gradient(1), static_cast<int>(a_.conv1), batch, static_cast<int>(a_.side * a_.side), nullptr);
    ready(0);
    ready(1);
  }

  // The logits of `batch` (<= max_examples) examples at `input`, on `stream` (training and gpu_evaluator).
  template <class Parameter>
  float* logits(cudaStream_t stream, const float* input, int batch, Parameter&& parameter) {
    if (batch <= 0 || static_cast<std::size_t>(batch) > max_examples_)
      throw std::runtime_error("cnn: a shard of " + std::to_string(batch) + " examples does not fit the workspace of " +
                               std::to_string(max_examples_));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnSetStream(cudnn_, stream));
    TOWERPIPE_EXAMPLES_CUBLAS(cublasSetStream(cublas_, stream));
    const shapes& s = shapes_for(batch);
    conv_forward(s.images, input, filter1_, parameter(0), bias1_, parameter(1), s.conv1, conv1_.get(), s.forward1,
                 batch * static_cast<int>(a_.conv1 * a_.side * a_.side));
    pool_forward(s.conv1, conv1_.get(), s.pooled1, pooled1_.get());
    conv_forward(s.pooled1, pooled1_.get(), filter2_, parameter(2), bias2_, parameter(3), s.conv2, conv2_.get(), s.forward2,
                 batch * static_cast<int>(a_.conv2 * a_.side * a_.side / 4));
    pool_forward(s.conv2, conv2_.get(), s.pooled2, dense_[0].get());
    forward_pass(cublas_, stream, dense_layers_, dense_[0].get(), batch, [&](std::size_t i) { return parameter(4 + i); },
                 dense_);
    return dense_.back().get();
  }

 private:
  // The tensor descriptors and chosen algorithms for one shard size (uneven splits give towers, and the
  // evaluator's last chunk, other sizes), made once per size.
  struct shapes {
    cudnn_detail::tensor images, conv1, pooled1, conv2, pooled2;
    cudnnConvolutionFwdAlgo_t forward1{}, forward2{};
    struct backward {
      cudnnConvolutionBwdFilterAlgo_t filter{};
      cudnnConvolutionBwdDataAlgo_t data{};
    } backward1, backward2;
  };

  std::size_t flattened() const { return a_.conv2 * (a_.side / 4) * (a_.side / 4); }

  const shapes& shapes_for(int batch) {
    auto found = shapes_.find(batch);
    if (found != shapes_.end()) return *found->second;
    auto made = std::make_unique<shapes>();
    const int side = static_cast<int>(a_.side);
    cudnn_detail::set_nchw(made->images, batch, static_cast<int>(a_.channels), side, side);
    cudnn_detail::set_nchw(made->conv1, batch, static_cast<int>(a_.conv1), side, side);
    cudnn_detail::set_nchw(made->pooled1, batch, static_cast<int>(a_.conv1), side / 2, side / 2);
    cudnn_detail::set_nchw(made->conv2, batch, static_cast<int>(a_.conv2), side / 2, side / 2);
    cudnn_detail::set_nchw(made->pooled2, batch, static_cast<int>(a_.conv2), side / 4, side / 4);
    made->forward1 = choose_forward(made->images, filter1_, made->conv1);
    made->forward2 = choose_forward(made->pooled1, filter2_, made->conv2);
    made->backward1 = choose_backward(made->images, filter1_, made->conv1, false);
    made->backward2 = choose_backward(made->pooled1, filter2_, made->conv2, true);
    return *(shapes_[batch] = std::move(made));
  }

  cudnnConvolutionFwdAlgo_t choose_forward(const cudnn_detail::tensor& x, const cudnn_detail::filter& w,
                                           const cudnn_detail::tensor& y) {
    cudnnConvolutionFwdAlgoPerf_t ranked[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, x.get(), w.get(), convolution_.get(), y.get(),
                                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, ranked));
    const auto chosen = cudnn_detail::first_deterministic(ranked, count, "forward convolution");
    reserve_workspace(chosen.memory);
    return chosen.algo;
  }

  shapes::backward choose_backward(const cudnn_detail::tensor& x, const cudnn_detail::filter& w, const cudnn_detail::tensor& dy,
                                   bool data_too) {
    shapes::backward chosen;
    cudnnConvolutionBwdFilterAlgoPerf_t filters[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        cudnn_, x.get(), dy.get(), convolution_.get(), w.get(), CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, filters));
    const auto filter = cudnn_detail::first_deterministic(filters, count, "filter-gradient");
    reserve_workspace(filter.memory);
    chosen.filter = filter.algo;
    if (!data_too) return chosen;
    cudnnConvolutionBwdDataAlgoPerf_t datas[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        cudnn_, w.get(), dy.get(), convolution_.get(), x.get(), CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, datas));
    const auto data = cudnn_detail::first_deterministic(datas, count, "data-gradient");
    reserve_workspace(data.memory);
    chosen.data = data.algo;
    return chosen;
  }

  void reserve_workspace(std::size_t bytes) {
    if (bytes <= workspace_bytes_) return;
    if (workspace_) {
      // Work already enqueued may still use the old workspace: wait for it rather than rely on cudaFree
      // waiting (it need not, with stream-ordered or asynchronous allocators).
      const towerpipe::detail::device_guard on(memory_.device);
      TOWERPIPE_CUDA_CHECK(cudaDeviceSynchronize());
    }
    workspace_ = memory_.allocate<char>(bytes, 256);
    workspace_bytes_ = bytes;
  }

  // y = relu(conv(x, w) + bias); `count` elements of y.
  void conv_forward(const cudnn_detail::tensor& x_shape, const float* x, const cudnn_detail::filter& w_shape, const float* w,
                    const cudnn_detail::tensor& bias_shape, const float* bias, const cudnn_detail::tensor& y_shape, float* y,
                    cudnnConvolutionFwdAlgo_t algorithm, int count) {
    const float one = 1.0f, zero = 0.0f;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnConvolutionForward(cudnn_, &one, x_shape.get(), x, w_shape.get(), w, convolution_.get(),
                                                     algorithm, workspace_.get(), workspace_bytes_, &zero, y_shape.get(), y));
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnAddTensor(cudnn_, &one, bias_shape.get(), bias, &one, y_shape.get(), y));
    kernels::relu<<<kernels::blocks(count), 256, 0, current_stream()>>>(y, count);
  }

  // From dy (the gradient before the ReLU): dw, the bias gradient and, where dx is given, the gradient with
  // respect to x.
  void conv_backward(const cudnn_detail::tensor& x_shape, const float* x, const cudnn_detail::filter& w_shape, const float* w,
                     const cudnn_detail::tensor& y_shape, const float* dy, const shapes::backward& algorithms, float* dw,
                     float* d_bias, int channels, int batch, int pixels, float* dx) {
    const float one = 1.0f, zero = 0.0f;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cudnn_, &one, x_shape.get(), x, y_shape.get(), dy,
                                                            convolution_.get(), algorithms.filter, workspace_.get(),
                                                            workspace_bytes_, &zero, w_shape.get(), dw));
    kernels::channel_sums<kernels::channel_sum_threads>
        <<<channels, kernels::channel_sum_threads, 0, current_stream()>>>(d_bias, dy, batch, channels, pixels, 1.0f);
    if (dx == nullptr) return;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnConvolutionBackwardData(cudnn_, &one, w_shape.get(), w, y_shape.get(), dy,
                                                          convolution_.get(), algorithms.data, workspace_.get(),
                                                          workspace_bytes_, &zero, x_shape.get(), dx));
  }

  void pool_forward(const cudnn_detail::tensor& x_shape, const float* x, const cudnn_detail::tensor& y_shape, float* y) {
    const float one = 1.0f, zero = 0.0f;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnPoolingForward(cudnn_, pool_.get(), &one, x_shape.get(), x, &zero, y_shape.get(), y));
  }

  void pool_backward(const cudnn_detail::tensor& x_shape, const float* x, const cudnn_detail::tensor& y_shape, const float* y,
                     const float* dy, float* dx) {
    const float one = 1.0f, zero = 0.0f;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnPoolingBackward(cudnn_, pool_.get(), &one, y_shape.get(), y, y_shape.get(), dy,
                                                  x_shape.get(), x, &zero, x_shape.get(), dx));
  }

  void relu_backward(float* delta, const float* output, int count) {
    kernels::relu_backward<<<kernels::blocks(count), 256, 0, current_stream()>>>(delta, output, count);
  }

  cudaStream_t current_stream() const {
    cudaStream_t stream = nullptr;
    TOWERPIPE_EXAMPLES_CUDNN_CHECK(cudnnGetStream(cudnn_, &stream));
    return stream;
  }

  using device_floats = towerpipe::cuda_device_memory::owner<float>;
  cnn_architecture a_;
  std::size_t max_examples_;
  towerpipe::cuda_device_memory memory_;
  std::vector<std::size_t> dense_layers_;  // flattened pool2 output, fc1, fc2, classes
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnn_detail::filter filter1_, filter2_;
  cudnn_detail::convolution convolution_;
  cudnn_detail::pooling pool_;
  cudnn_detail::tensor bias1_, bias2_;
  std::map<int, std::unique_ptr<shapes>> shapes_;
  towerpipe::cuda_device_memory::owner<char> workspace_{nullptr, {0}};
  std::size_t workspace_bytes_ = 0;
  device_floats conv1_{nullptr, {0}}, pooled1_{nullptr, {0}}, conv2_{nullptr, {0}};
  device_floats d_conv1_{nullptr, {0}}, d_pooled1_{nullptr, {0}}, d_conv2_{nullptr, {0}};
  std::vector<device_floats> dense_;  // [0]: pool2's output; [k]: dense layer k's output (the last: logits)
  device_floats spare_a_{nullptr, {0}}, spare_b_{nullptr, {0}}, d_dense_input_{nullptr, {0}}, losses_{nullptr, {0}};
};

}  // namespace towerpipe_examples
