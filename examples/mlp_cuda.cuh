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

namespace kernels {

// out[e, o] = bias[o] for every example e (the GEMM then adds the product with beta = 1).
__global__ void broadcast_bias(float* out, const float* bias, int examples, int outputs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < examples * outputs) out[i] = bias[i % outputs];
}

__global__ void relu(float* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] = fmaxf(values[i], 0.0f);
}

// delta[i] = 0 where the layer's ReLU output was not positive.
__global__ void relu_backward(float* delta, const float* activation, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count && activation[i] <= 0.0f) delta[i] = 0.0f;
}

// Per example: softmax of its logits in place, its loss -log p[label] into losses[e], and the logits'
// gradient of the mean loss, (p - onehot(label)) / examples.
__global__ void softmax_cross_entropy(float* logits, const std::int32_t* labels, float* losses, int examples,
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

// out[o] = (sum over rows e of values[e * columns + o]) / divisor, one block per column: each thread sums
// a strided share and cub::BlockReduce combines the threads' sums in a fixed order (the same bits every
// run). Gives the bias gradients (divisor 1) and the shard's mean loss (one column).
template <int Threads>
__global__ void __launch_bounds__(Threads) column_sums(float* out, const float* values, int rows, int columns, float divisor) {
  using block_reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename block_reduce::TempStorage scratch;
  const int column = static_cast<int>(blockIdx.x);
  float partial = 0.0f;
  for (int e = static_cast<int>(threadIdx.x); e < rows; e += Threads) partial += values[e * columns + column];
  const float total = block_reduce(scratch).Sum(partial);
  if (threadIdx.x == 0) out[column] = total / divisor;
}
constexpr int column_sum_threads = 128;

inline unsigned blocks(int count) { return static_cast<unsigned>((count + 255) / 256); }

}  // namespace kernels

// Row-major C = alpha * op(A) * op(B) + beta * C through column-major cuBLAS: C^T = op(B)^T op(A)^T.
inline void gemm_rowmajor(cublasHandle_t handle, bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  TOWERPIPE_EXAMPLES_CUBLAS(cublasSgemm(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a, lda, &beta,
                                        c, ldc));
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

  // One tower's forward and backward on its stream; the mean loss goes to tower.device_loss().
  template <class Context>
  void train_step(Context& tower) {
    const auto images = tower.template input<float>("image");
    const auto labels = tower.template input<std::int32_t>("label");
    const int batch = static_cast<int>(images.examples());
    if (static_cast<std::size_t>(batch) > max_examples_) throw std::runtime_error("shard larger than the workspace");
    TOWERPIPE_EXAMPLES_CUBLAS(cublasSetStream(handle_, tower.stream()));
    cudaStream_t stream = tower.stream();
    const std::size_t layer_count = layers_.size() - 1;
    // Forward.
    for (std::size_t k = 0; k < layer_count; ++k) {
      const int in = static_cast<int>(layers_[k]), out = static_cast<int>(layers_[k + 1]);
      const float* input = k == 0 ? images.data() : activations_[k].get();
      float* output = activations_[k + 1].get();
      kernels::broadcast_bias<<<kernels::blocks(batch * out), 256, 0, stream>>>(output, tower.parameter(2 * k + 1).data(),
                                                                                batch, out);
      gemm_rowmajor(handle_, false, true, batch, out, in, 1.0f, input, in, tower.parameter(2 * k).data(), in, 1.0f, output,
                    out);
      if (k + 1 < layer_count) kernels::relu<<<kernels::blocks(batch * out), 256, 0, stream>>>(output, batch * out);
    }
    const int classes = static_cast<int>(layers_.back());
    float* delta = activations_.back().get();  // the logits become their gradient in place
    kernels::softmax_cross_entropy<<<kernels::blocks(batch), 256, 0, stream>>>(delta, labels.data(), losses_.get(), batch,
                                                                               classes);
    kernels::column_sums<kernels::column_sum_threads>
        <<<1, kernels::column_sum_threads, 0, stream>>>(tower.device_loss(), losses_.get(), batch, 1, static_cast<float>(batch));
    // Backward.
    for (std::size_t k = layer_count; k-- > 0;) {
      const int in = static_cast<int>(layers_[k]), out = static_cast<int>(layers_[k + 1]);
      const float* input = k == 0 ? images.data() : activations_[k].get();
      gemm_rowmajor(handle_, true, false, out, in, batch, 1.0f, delta, out, input, in, 0.0f, tower.gradient(2 * k).data(), in);
      kernels::column_sums<kernels::column_sum_threads>
          <<<out, kernels::column_sum_threads, 0, stream>>>(tower.gradient(2 * k + 1).data(), delta, batch, out, 1.0f);
      if (k == 0) break;
      float* next = delta == previous_.get() ? delta_.get() : previous_.get();
      gemm_rowmajor(handle_, false, false, batch, in, out, 1.0f, delta, out, tower.parameter(2 * k).data(), in, 0.0f, next, in);
      kernels::relu_backward<<<kernels::blocks(batch * in), 256, 0, stream>>>(next, activations_[k].get(), batch * in);
      delta = next;
    }
  }

 private:
  std::vector<std::size_t> layers_;
  towerpipe::cuda_device_memory memory_;
  cublasHandle_t handle_ = nullptr;
  std::vector<towerpipe::cuda_device_memory::owner<float>> activations_;  // [0] empty: the images are read in place
  towerpipe::cuda_device_memory::owner<float> delta_{nullptr, {0}}, previous_{nullptr, {0}}, losses_{nullptr, {0}};
  std::size_t max_examples_ = 0;
};

}  // namespace towerpipe_examples
