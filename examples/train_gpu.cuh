#pragma once
// The training program's GPU towers (examples/train.cpp has the rest): their program, their evaluation
// and their training through the backend --backend names. Each optimizer and layout's training is a
// translation unit of its own (examples/train_gpu_unit.cu.in; compile time), built with nvcc only where
// the CUDA toolkit is, so that the host-tower program builds with the C++ compiler alone.
#include <towerpipe/cuda.cuh>

#include <memory>
#include <optional>
#include <type_traits>

#include "mixed_precision.hpp"
#include "mlp_cuda.cuh"
#include "train_loop.hpp"
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
#include "cnn_cudnn.cuh"
#endif

namespace towerpipe_examples {

namespace kernels {

template <class Stored>
__global__ void widen(float* to, const Stored* from, std::size_t count) {
  const std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < count) to[k] = static_cast<float>(from[k]);
}
template <class Stored>
__global__ void narrow(Stored* to, const float* from, std::size_t count, float scale) {
  const std::size_t k = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < count) to[k] = static_cast<Stored>(from[k] * scale);
}
template <class T>
__global__ void scale(T* values, T by) {
  *values *= by;
}

inline unsigned blocks_of(std::size_t count) { return static_cast<unsigned>((count + 255) / 256); }

}  // namespace kernels

// 16-bit GPU towers' fp32 scratch (mixed_precision.hpp): device memory on the tower's device, converted
// by a kernel a variable on the tower's stream, so that a variable's narrowing is enqueued before its
// gradient_ready mark records the event the reduction waits for.
struct cuda_conversions {
  using buffer = towerpipe::cuda_device_memory::owner<float>;
  static buffer empty() { return buffer(nullptr, towerpipe::cuda_device_memory::free_on_device{0}); }
  template <class Context>
  static buffer allocate(const Context& tower, std::size_t count) {
    return towerpipe::cuda_device_memory{tower.device()}.allocate<float>(count, 256);
  }
  static float* data(buffer& b) { return b.get(); }
  template <class Context, class Stored>
  static void widen(const Context& tower, float* to, const Stored* from, std::size_t count) {
    if (count == 0) return;  // a launch of no blocks is an error
    kernels::widen<<<kernels::blocks_of(count), 256, 0, tower.stream()>>>(to, from, count);
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  }
  template <class Context, class Stored>
  static void narrow(const Context& tower, Stored* to, const float* from, std::size_t count, float scale) {
    if (count == 0) return;
    kernels::narrow<<<kernels::blocks_of(count), 256, 0, tower.stream()>>>(to, from, count, scale);
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
  }
};

// What the GPU models (train_step) see of a 16-bit tower: its inputs, stream and loss, and the fp32
// scratch as its parameters and gradients.
template <class Context, class Scratch>
struct fp32_tower_view {
  Context& tower;
  Scratch& fp32;
  struct values {
    float* address;
    float* data() const { return address; }
  };
  template <class U>
  auto input(const std::string& name) const {
    return tower.template input<U>(name);
  }
  cudaStream_t stream() const { return tower.stream(); }
  float* device_loss() const { return tower.device_loss(); }
  values parameter(std::size_t i) const { return {fp32.parameter(i)}; }
  values gradient(std::size_t i) const { return {fp32.gradient(i)}; }
};

namespace training {

// GPU towers compute through mlp_cuda.cuh (cuBLAS) or cnn_cudnn.cuh (cuDNN and cuBLAS): one workspace
// per tower, made by the tower's thread on first use. 16-bit towers through fp32 scratch, as host
// towers (train_loop.hpp's tower_program), the device loss scaled as the gradients.
template <class Stored>
struct tower_program<exec::cuda, Stored> {
  const classifier& model;
  std::size_t max_examples;
  bool mark_ready;  // the towers mark each layer's gradients ready: every backend reduces those buckets during the towers
  float loss_scale = 1;  // pipeline::loss_scale(), set before each step
  std::vector<std::unique_ptr<gpu_mlp_workspace>> mlps;
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
  std::vector<std::unique_ptr<gpu_cnn_workspace>> cnns;
#endif
  std::vector<fp32_scratch<Stored, cuda_conversions>> scratch;  // 16-bit towers: one per tower
  tower_program(const classifier& m, const options& o)
      : model(m), max_examples((o.batch_size + o.towers - 1) / o.towers), mark_ready(o.overlap), mlps(o.towers) {
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
    cnns.resize(o.towers);
#endif
    if constexpr (!std::is_same_v<Stored, float>) scratch.resize(o.towers);
  }
  template <class Context>
  void operator()(Context& tower) {
    if constexpr (std::is_same_v<Stored, float>) {
      run(tower, tower, ready_marks(tower, mark_ready));
    } else {
      auto& fp32 = scratch[tower.tower()];
      fp32.widen_parameters(tower);
      fp32_tower_view<Context, fp32_scratch<Stored, cuda_conversions>> view{tower, fp32};
      run(tower, view, fp32.ready_marks(tower, mark_ready, loss_scale));
      fp32.narrow_rest(tower, loss_scale);
      if (loss_scale != 1) {
        kernels::scale<<<1, 1, 0, tower.stream()>>>(tower.device_loss(), loss_scale);
        TOWERPIPE_CUDA_CHECK(cudaGetLastError());
      }
    }
  }

 private:
  // The model's step on `seen` (the tower, or its fp32 view); workspaces on the tower's device.
  template <class Context, class Seen, class Ready>
  void run(Context& tower, Seen& seen, Ready&& ready) {
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
    if (const cnn<float>* network = model.as_cnn()) {
      auto& workspace = cnns[tower.tower()];
      if (!workspace) workspace = std::make_unique<gpu_cnn_workspace>(network->architecture(), max_examples, tower.device());
      return workspace->train_step(seen, ready);
    }
#endif
    auto& workspace = mlps[tower.tower()];
    if (!workspace) workspace = std::make_unique<gpu_mlp_workspace>(model.as_mlp()->layers(), max_examples, tower.device());
    workspace->train_step(seen, ready);
  }
};

// GPU towers evaluate on tower 0's device: fp32 towers with its replica; 16-bit towers with the fp32
// master (as host towers do), uploaded each time. The test set goes up once, on first use.
template <>
struct test_evaluator<exec::cuda> {
  const classifier& model;
  const labelled_images& test;
  std::unique_ptr<gpu_evaluator<gpu_mlp_workspace>> mlp_on_gpu;
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
  std::unique_ptr<gpu_evaluator<gpu_cnn_workspace>> cnn_on_gpu;
#endif
  std::optional<towerpipe::cuda_device_memory::owner<float>> master;  // 16-bit towers: the master on tower 0's device
  std::vector<std::size_t> offsets;
  test_evaluator(const classifier& m, const labelled_images& t) : model(m), test(t) {}

  template <class Pipeline>
  double operator()(Pipeline& p) {
    auto& towers = p.execution_space();
    const auto parameter = [&](std::size_t i) -> const float* {
      if constexpr (std::is_same_v<typename Pipeline::stored_type, float>) return towers.replica(0).data(i);
      else return master->get() + offsets[i];
    };
    if constexpr (!std::is_same_v<typename Pipeline::stored_type, float>) upload_master(p, towers.device(0));
    const int classes = 10;
    std::size_t correct = 0;
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
    if (const cnn<float>* network = model.as_cnn()) {
      // Smaller chunks than the MLP's: a CNN example's activations take about 1 MB.
      if (!cnn_on_gpu)
        cnn_on_gpu = std::make_unique<gpu_evaluator<gpu_cnn_workspace>>(
            test.images.data(), test.features, test.labels.data(), test.examples(), classes, towers.device(0), 512,
            [&](std::size_t chunk, int device) { return std::make_unique<gpu_cnn_workspace>(network->architecture(), chunk, device); });
      correct = cnn_on_gpu->count_correct(parameter);
      return 100.0 * static_cast<double>(correct) / static_cast<double>(test.examples());
    }
#endif
    if (!mlp_on_gpu)
      mlp_on_gpu = std::make_unique<gpu_evaluator<gpu_mlp_workspace>>(
          test.images.data(), test.features, test.labels.data(), test.examples(), classes, towers.device(0), 4096,
          [&](std::size_t chunk, int device) { return std::make_unique<gpu_mlp_workspace>(model.as_mlp()->layers(), chunk, device); });
    correct = mlp_on_gpu->count_correct(parameter);
    return 100.0 * static_cast<double>(correct) / static_cast<double>(test.examples());
  }

 private:
  template <class Pipeline>
  void upload_master(const Pipeline& p, int device) {
    if (!master) {
      std::size_t total = 0;
      for (std::size_t v = 0; v < p.variables().count(); ++v) {
        offsets.push_back(total);
        total += p.variables()[v].size;
      }
      master = towerpipe::cuda_device_memory{device}.allocate<float>(total, 256);
    }
    towerpipe::detail::device_guard on(device);
    for (std::size_t v = 0; v < p.variables().count(); ++v) {
      const auto values = p.parameter(v);
      towerpipe::detail::copy_to_device_now(master->get() + offsets[v], values.data(), values.size() * sizeof(float));
    }
  }
};

// Every backend takes GPU towers of every precision.
template <class Optim, class Layout>
run_result train_on_gpus(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  return train_with<exec::cuda, Optim, Layout>(o, data, h);
}

}  // namespace training
}  // namespace towerpipe_examples
