// The training program's GPU towers (examples/train.cpp has the rest): compiled by nvcc only where the
// CUDA toolkit is, so that the host-tower program builds with the C++ compiler alone.
#include <towerpipe/cuda.cuh>

#include <memory>

#include "mlp_cuda.cuh"
#include "train_loop.hpp"

namespace towerpipe_examples::training {

// GPU towers compute through mlp_cuda.cuh (cuBLAS, one workspace per tower, made by the tower's thread
// on first use).
template <>
struct tower_program<exec::cuda> {
  std::vector<std::size_t> layers;
  std::size_t max_examples;
  std::vector<std::unique_ptr<towerpipe_examples::gpu_mlp_workspace>> workspaces;
  tower_program(const mlp& m, const options& o)
      : layers(m.layers()), max_examples((o.batch_size + o.towers - 1) / o.towers), workspaces(o.towers) {}
  template <class Context>
  void operator()(Context& tower) {
    auto& workspace = workspaces[tower.tower()];
    if (!workspace) workspace = std::make_unique<towerpipe_examples::gpu_mlp_workspace>(layers, max_examples, tower.device());
    workspace->train_step(tower);
  }
};

// GPU towers evaluate on tower 0's device, with its replica: the test set goes up once, on first use.
template <>
struct test_evaluator<exec::cuda> {
  const mlp& model;
  const labelled_images& test;
  std::unique_ptr<gpu_mlp_evaluator> gpu;
  test_evaluator(const mlp& m, const labelled_images& t) : model(m), test(t) {}

  template <class Pipeline>
  double operator()(Pipeline& p) {
    auto& towers = p.execution_space();
    if (!gpu)
      gpu = std::make_unique<gpu_mlp_evaluator>(model.layers(), test.images.data(), test.labels.data(), test.examples(),
                                                towers.device(0));
    const std::size_t correct = gpu->count_correct([&](std::size_t i) -> const float* { return towers.replica(0).data(i); });
    return 100.0 * static_cast<double>(correct) / static_cast<double>(test.examples());
  }
};

int visible_gpus() { return towerpipe::detail::cuda_device_count(); }

template <class Optim, class Layout>
int train_on_gpus(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  if (o.backend == "device0") return train<exec::cuda, reduce::device0, Optim, Layout>(o, data, h);
  if (o.backend == "p2p_tree") return train<exec::cuda, reduce::p2p_tree, Optim, Layout>(o, data, h);
  return train<exec::cuda, reduce::host, Optim, Layout>(o, data, h);
}

template int train_on_gpus<optim::sgd, layout::flat<float>>(const options&, const image_dataset&, const optim::sgd::hyper_parameters&);
template int train_on_gpus<optim::sgd, layout::per_variable<float>>(const options&, const image_dataset&,
                                                                     const optim::sgd::hyper_parameters&);
template int train_on_gpus<optim::adam, layout::flat<float>>(const options&, const image_dataset&, const optim::adam::hyper_parameters&);
template int train_on_gpus<optim::adam, layout::per_variable<float>>(const options&, const image_dataset&,
                                                                      const optim::adam::hyper_parameters&);
template int train_on_gpus<optim::adamw, layout::flat<float>>(const options&, const image_dataset&,
                                                              const optim::adamw::hyper_parameters&);
template int train_on_gpus<optim::adamw, layout::per_variable<float>>(const options&, const image_dataset&,
                                                                      const optim::adamw::hyper_parameters&);

}  // namespace towerpipe_examples::training
