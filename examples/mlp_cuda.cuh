#pragma once
// The MLP of mlp.hpp on a GPU tower: the same variables, math and initialisation, with cuBLAS GEMMs
// and small kernels enqueued on the tower's stream. One gpu_mlp_workspace per tower holds the cuBLAS
// handle and the activations; it is made on first use by the tower's own thread.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/cuda.cuh>

#include "mlp.hpp"

namespace towerpipe_examples {

#define TOWERPIPE_EXAMPLES_CUBLAS(call)                                                                  \
  do {                                                                                                   \
    const cublasStatus_t status_ = (call);                                                               \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                                \
      throw std::runtime_error(std::string(#call) + " failed: " + cublasGetStatusString(status_));       \
  } while (0)

// The kernels are templates (only ever of float) so that this header can be in more than one
// translation unit (train_gpu.cu and the generated train_gpu_units/*.cu): one that is not a template is defined in each,
// and the link fails.
namespace kernels {

// out[e, o] = bias[o] for every example e (the GEMM then adds the product with beta = 1).
template <class T>
__global__ void broadcast_bias(T* out, const T* bias, int examples, int outputs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < examples * outputs) out[i] = bias[i % outputs];
}

template <class T>
__global__ void relu(T* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] = fmaxf(values[i], 0.0f);
}

// delta[i] = 0 where the layer's ReLU output was not positive.
template <class T>
__global__ void relu_backward(T* delta, const T* activation, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count && activation[i] <= 0.0f) delta[i] = 0.0f;
}

// Per example: softmax of its logits in place, its loss -log p[label] into losses[e], and the logits'
// gradient of the mean loss, (p - onehot(label)) / examples.
template <class T>
__global__ void softmax_cross_entropy(T* logits, const std::int32_t* labels, T* losses, int examples,
                                      int classes) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= examples) return;
  float* row = logits + e * classes;
  float top = row[0];
  for (int c = 1; c < classes; ++c) top = fmaxf(top, row[c]);
  float total = 0.0f;
  for (int c = 0; c < classes; ++c) total += (row[c] = expf(row[c] - top));
  const int label = labels[e];
  losses[e] = -logf(fmaxf(row[label] / total, 1e-30f));
  for (int c = 0; c < classes; ++c) row[c] = (row[c] / total - (c == label ? 1.0f : 0.0f)) / examples;
}

// Adds to *correct the examples whose largest logit (the first, on a tie) is their label's.
template <class T>
__global__ void count_argmax_hits(const T* logits, const std::int32_t* labels, int examples, int classes,
                                  unsigned* correct) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= examples) return;
  const float* row = logits + e * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c) best = row[c] > row[best] ? c : best;
  if (best == labels[e]) atomicAdd(correct, 1u);
}

// out[c] = (sum over examples n and pixels p of values[(n * channels + c) * pixels + p]) / divisor, one
// block per channel: each thread sums a strided share and cub::BlockReduce combines the threads' sums in
// a fixed order (the same bits every run). With pixels = 1, the sums of a row-major matrix's columns:
// the bias gradients of a dense layer (divisor 1) and the shard's mean loss (one column); with the
// pixels of an NCHW map, a convolution's bias gradients.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    channel_sums(float* out, const float* values, int examples, int channels, int pixels, float divisor) {
  using block_reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename block_reduce::TempStorage scratch;
  const int channel = static_cast<int>(blockIdx.x);
  float partial = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < examples * pixels; i += Threads)
    partial += values[((i / pixels) * channels + channel) * pixels + i % pixels];
  const float total = block_reduce(scratch).Sum(partial);
  if (threadIdx.x == 0) out[channel] = total / divisor;
}
constexpr int channel_sum_threads = 128;

inline unsigned blocks(int count) { return static_cast<unsigned>((count + 255) / 256); }

}  // namespace kernels

// Row-major C = alpha * op(A) * op(B) + beta * C through column-major cuBLAS: C^T = op(B)^T op(A)^T.
inline void gemm_rowmajor(cublasHandle_t handle, bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  TOWERPIPE_EXAMPLES_CUBLAS(cublasSgemm(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta,
                                        c, ldc));
}

// The forward pass over `batch` examples at `input` (row-major, layers[0] features each) on `stream`:
// activations[k + 1] = relu(activations[k] W_k^T + b_k), the last without ReLU (the logits).
// parameter(i): variable i (W_0, b_0, W_1, ...) on the device.
template <class Parameter>
void forward_pass(cublasHandle_t handle, cudaStream_t stream, const std::vector<std::size_t>& layers, const float* input,
                  int batch, Parameter&& parameter, const std::vector<towerpipe::cuda_device_memory::owner<float>>& activations) {
  const std::size_t layer_count = layers.size() - 1;
  for (std::size_t k = 0; k < layer_count; ++k) {
    const int in = static_cast<int>(layers[k]), out = static_cast<int>(layers[k + 1]);
    const float* from = k == 0 ? input : activations[k].get();
    float* output = activations[k + 1].get();
    kernels::broadcast_bias<<<kernels::blocks(batch * out), 256, 0, stream>>>(output, parameter(2 * k + 1), batch, out);
    gemm_rowmajor(handle, false, true, batch, out, in, 1.0f, from, in, parameter(2 * k), in, 1.0f, output, out);
    if (k + 1 < layer_count) kernels::relu<<<kernels::blocks(batch * out), 256, 0, stream>>>(output, batch * out);
  }
}

// The backward pass of forward_pass's layers from delta (the logits' gradient of the mean loss, which
// it overwrites): gradient(i) for every variable, and, where input_gradient is given, the gradient with
// respect to the input. spare_a and spare_b: scratch of batch x the widest layer each. ready(i) as each
// layer's variables are done (ready_marks.hpp), once the work that last uses them is enqueued.
template <class Parameter, class Gradient, class Ready>
void dense_backward_pass(cublasHandle_t handle, cudaStream_t stream, const std::vector<std::size_t>& layers,
                         const float* input, int batch, Parameter&& parameter, Gradient&& gradient,
                         const std::vector<towerpipe::cuda_device_memory::owner<float>>& activations, float* delta,
                         float* spare_a, float* spare_b, float* input_gradient, Ready&& ready) {
  const auto layer_done = [&](std::size_t k) {
    ready(2 * k);
    ready(2 * k + 1);
  };
  for (std::size_t k = layers.size() - 1; k-- > 0;) {
    const int in = static_cast<int>(layers[k]), out = static_cast<int>(layers[k + 1]);
    const float* from = k == 0 ? input : activations[k].get();
    gemm_rowmajor(handle, true, false, out, in, batch, 1.0f, delta, out, from, in, 0.0f, gradient(2 * k), in);
    kernels::channel_sums<kernels::channel_sum_threads>
        <<<out, kernels::channel_sum_threads, 0, stream>>>(gradient(2 * k + 1), delta, batch, out, 1, 1.0f);
    if (k == 0) {
      if (input_gradient != nullptr)
        gemm_rowmajor(handle, false, false, batch, in, out, 1.0f, delta, out, parameter(0), in, 0.0f, input_gradient, in);
      layer_done(0);
      break;
    }
    float* next = delta == spare_a ? spare_b : spare_a;
    gemm_rowmajor(handle, false, false, batch, in, out, 1.0f, delta, out, parameter(2 * k), in, 0.0f, next, in);
    layer_done(k);  // the weight's last read: the delta it propagated to layer k - 1
    kernels::relu_backward<<<kernels::blocks(batch * in), 256, 0, stream>>>(next, activations[k].get(), batch * in);
    delta = next;
  }
}

class gpu_mlp_workspace {
 public:
  gpu_mlp_workspace(const std::vector<std::size_t>& layers, std::size_t max_examples, int device)
      : layers_(layers), memory_{device} {
    TOWERPIPE_EXAMPLES_CUBLAS(cublasCreate(&handle_));
    activations_.emplace_back(nullptr, towerpipe::cuda_device_memory::free_on_device{device});  // the images
    for (std::size_t k = 1; k < layers.size(); ++k)
      activations_.push_back(memory_.allocate<float>(max_examples * layers[k], 256));
    std::size_t widest = 0;
    for (std::size_t width : layers) widest = std::max(widest, width);
    delta_ = memory_.allocate<float>(max_examples * widest, 256);
    previous_ = memory_.allocate<float>(max_examples * widest, 256);
    losses_ = memory_.allocate<float>(max_examples, 256);
    max_examples_ = max_examples;
  }
  ~gpu_mlp_workspace() { cublasDestroy(handle_); }
  gpu_mlp_workspace(const gpu_mlp_workspace&) = delete;
  gpu_mlp_workspace& operator=(const gpu_mlp_workspace&) = delete;

  // One tower's forward and backward on its stream; the mean loss goes to tower.device_loss(); ready(i)
  // as each layer's variables are done (ready_marks.hpp).
  template <class Context, class Ready>
  void train_step(Context& tower, Ready&& ready) {
    const auto images = tower.template input<float>("image");
    const auto labels = tower.template input<std::int32_t>("label");
    const int batch = static_cast<int>(images.examples());
    if (static_cast<std::size_t>(batch) > max_examples_) throw std::runtime_error("shard larger than the workspace");
    TOWERPIPE_EXAMPLES_CUBLAS(cublasSetStream(handle_, tower.stream()));
    cudaStream_t stream = tower.stream();
    forward_pass(handle_, stream, layers_, images.data(), batch, [&](std::size_t i) { return tower.parameter(i).data(); },
                 activations_);
    const int classes = static_cast<int>(layers_.back());
    float* delta = activations_.back().get();  // the logits become their gradient in place
    kernels::softmax_cross_entropy<<<kernels::blocks(batch), 256, 0, stream>>>(delta, labels.data(), losses_.get(), batch,
                                                                               classes);
    kernels::channel_sums<kernels::channel_sum_threads>
        <<<1, kernels::channel_sum_threads, 0, stream>>>(tower.device_loss(), losses_.get(), batch, 1, 1, static_cast<float>(batch));
    dense_backward_pass(handle_, stream, layers_, images.data(), batch, [&](std::size_t i) { return tower.parameter(i).data(); },
                        [&](std::size_t i) { return tower.gradient(i).data(); }, activations_, delta, previous_.get(),
                        delta_.get(), nullptr, ready);
  }

  // The logits of `batch` (<= max_examples) examples at `input`, on `stream` (for gpu_evaluator).
  template <class Parameter>
  const float* logits(cudaStream_t stream, const float* input, int batch, Parameter&& parameter) {
    TOWERPIPE_EXAMPLES_CUBLAS(cublasSetStream(handle_, stream));
    forward_pass(handle_, stream, layers_, input, batch, parameter, activations_);
    return activations_.back().get();
  }

 private:
  std::vector<std::size_t> layers_;
  towerpipe::cuda_device_memory memory_;
  cublasHandle_t handle_ = nullptr;
  std::vector<towerpipe::cuda_device_memory::owner<float>> activations_;  // [0] empty: the images are read in place
  towerpipe::cuda_device_memory::owner<float> delta_{nullptr, {0}}, previous_{nullptr, {0}}, losses_{nullptr, {0}};
  std::size_t max_examples_ = 0;
};

// Test accuracy on the GPU: the test set uploaded once, then a network's forward pass (a workspace of
// this file's or cnn_cudnn.cuh's, made for chunks of the test set) over chunks of it with parameters
// already on the device, and a count of the argmax hits.
template <class Network>
class gpu_evaluator {
 public:
  // make_network(max_examples, device) builds the network's workspace for chunks of chunk_examples.
  template <class MakeNetwork>
  gpu_evaluator(const float* images, std::size_t features, const std::int32_t* labels, std::size_t examples, int classes,
                int device, std::size_t chunk_examples, MakeNetwork&& make_network)
      : device_(device),
        examples_(examples),
        features_(features),
        classes_(classes),
        chunk_(std::min(examples, chunk_examples)),
        images_(towerpipe::cuda_device_memory{device}.allocate<float>(examples * features, 256)),
        labels_(towerpipe::cuda_device_memory{device}.allocate<std::int32_t>(examples, 256)),
        correct_(towerpipe::cuda_device_memory{device}.allocate<unsigned>(1, 256)),
        stream_(device) {
    towerpipe::detail::device_guard on(device);
    towerpipe::detail::copy_to_device_now(images_.get(), images, examples * features * sizeof(float));
    towerpipe::detail::copy_to_device_now(labels_.get(), labels, examples * sizeof(std::int32_t));
    network_ = make_network(chunk_, device);
  }

  // parameter(i): variable i on this evaluator's device, final (no step in flight).
  template <class Parameter>
  std::size_t count_correct(Parameter&& parameter) {
    towerpipe::detail::device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(correct_.get(), 0, sizeof(unsigned), stream_.get()));
    for (std::size_t first = 0; first < examples_; first += chunk_) {
      const int batch = static_cast<int>(std::min(chunk_, examples_ - first));
      const float* logits = network_->logits(stream_.get(), images_.get() + first * features_, batch, parameter);
      kernels::count_argmax_hits<<<kernels::blocks(batch), 256, 0, stream_.get()>>>(logits, labels_.get() + first, batch,
                                                                                    classes_, correct_.get());
      TOWERPIPE_CUDA_CHECK(cudaGetLastError());
    }
    unsigned correct = 0;
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(&correct, correct_.get(), sizeof correct, cudaMemcpyDeviceToHost, stream_.get()));
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    return correct;
  }

 private:
  int device_;
  std::size_t examples_, features_;
  int classes_;
  std::size_t chunk_;
  towerpipe::cuda_device_memory::owner<float> images_;
  towerpipe::cuda_device_memory::owner<std::int32_t> labels_;
  towerpipe::cuda_device_memory::owner<unsigned> correct_;
  towerpipe::detail::cuda_stream stream_;
  std::unique_ptr<Network> network_;
};

}  // namespace towerpipe_examples
