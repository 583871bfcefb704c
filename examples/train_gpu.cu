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
