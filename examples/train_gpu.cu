// The training program's GPU towers (examples/train.cpp has the rest): compiled by nvcc only where the
// CUDA toolkit is, so that the host-tower program builds with the C++ compiler alone.
#include <towerpipe/cuda.cuh>
#if defined(TOWERPIPE_EXAMPLES_NCCL)
#include <towerpipe/comm/nccl_over_mpi.cuh>
#endif

#include <memory>

#include "mlp_cuda.cuh"
#include "train_loop.hpp"
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
#include "cnn_cudnn.cuh"
#endif

namespace towerpipe_examples::training {

// GPU towers compute through mlp_cuda.cuh (cuBLAS) or cnn_cudnn.cuh (cuDNN and cuBLAS): one workspace
// per tower, made by the tower's thread on first use.
template <>
struct tower_program<exec::cuda> {
  const classifier& model;
  std::size_t max_examples;
  bool mark_ready;  // device0 and reduce::host reduce the marked buckets during the towers; p2p_tree and sharded after
  std::vector<std::unique_ptr<gpu_mlp_workspace>> mlps;
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
  std::vector<std::unique_ptr<gpu_cnn_workspace>> cnns;
#endif
  tower_program(const classifier& m, const options& o)
      : model(m), max_examples((o.batch_size + o.towers - 1) / o.towers), mark_ready(o.overlap), mlps(o.towers) {
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
    cnns.resize(o.towers);
#endif
  }
  template <class Context>
  void operator()(Context& tower) {
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
    if (const cnn<float>* network = model.as_cnn()) {
      auto& workspace = cnns[tower.tower()];
      if (!workspace) workspace = std::make_unique<gpu_cnn_workspace>(network->architecture(), max_examples, tower.device());
      return workspace->train_step(tower, ready_marks(tower, mark_ready));
    }
#endif
    auto& workspace = mlps[tower.tower()];
    if (!workspace) workspace = std::make_unique<gpu_mlp_workspace>(model.as_mlp()->layers(), max_examples, tower.device());
    workspace->train_step(tower, ready_marks(tower, mark_ready));
  }
};

// GPU towers evaluate on tower 0's device, with its replica: the test set goes up once, on first use.
template <>
struct test_evaluator<exec::cuda> {
  const classifier& model;
  const labelled_images& test;
  std::unique_ptr<gpu_evaluator<gpu_mlp_workspace>> mlp_on_gpu;
#if defined(TOWERPIPE_EXAMPLES_CUDNN)
  std::unique_ptr<gpu_evaluator<gpu_cnn_workspace>> cnn_on_gpu;
#endif
  test_evaluator(const classifier& m, const labelled_images& t) : model(m), test(t) {}

  template <class Pipeline>
  double operator()(Pipeline& p) {
    auto& towers = p.execution_space();
    const auto parameter = [&](std::size_t i) -> const float* { return towers.replica(0).data(i); };
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
};

int visible_gpus() { return towerpipe::detail::cuda_device_count(); }
#if defined(TOWERPIPE_EXAMPLES_NCCL)
std::shared_ptr<process_group> nccl_group(MPI_Comm comm, int device) { return nccl_process_group_over_mpi(comm, device); }
#endif

template <class Optim, class Layout>
run_result train_on_gpus(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  if (o.backend == "auto") return train<exec::cuda, reduce::automatic, Optim, Layout>(o, data, h);
  if (o.backend == "device0") return train<exec::cuda, reduce::device0, Optim, Layout>(o, data, h);
  if (o.backend == "p2p_tree") return train<exec::cuda, reduce::p2p_tree, Optim, Layout>(o, data, h);
  if (o.backend == "sharded") return train<exec::cuda, reduce::sharded, Optim, Layout>(o, data, h);
  return train<exec::cuda, reduce::host, Optim, Layout>(o, data, h);
}

#define TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(Optim, Layout) \
  template run_result train_on_gpus<Optim, Layout>(const options&, const image_dataset&, const Optim::hyper_parameters&);
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::sgd, layout::flat<float>)
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::sgd, layout::per_variable<float>)
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::adam, layout::flat<float>)
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::adam, layout::per_variable<float>)
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::adamw, layout::flat<float>)
TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS(optim::adamw, layout::per_variable<float>)
#undef TOWERPIPE_EXAMPLES_TRAIN_ON_GPUS

}  // namespace towerpipe_examples::training
