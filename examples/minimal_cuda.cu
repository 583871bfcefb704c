// towerpipe in one page, on GPU towers: the linear regression of minimal_host.cpp with the gradients
// computed by a kernel on each tower's stream and reduce::device0's fused average + Adam + broadcast.
// docs/guide.md points to this file; CI compiles it. Exits 77 where no CUDA device is visible.
#include <towerpipe/cuda.cuh>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using trainer = towerpipe::pipeline<towerpipe::exec::cuda,     // towers on GPUs (several may share one)
                                    towerpipe::reduce::device0,  // one fused kernel on tower 0's device
                                    towerpipe::optim::adam, towerpipe::layout::flat<float>>;

constexpr std::size_t features = 8, examples = 512;

// One thread per example adds its share of the mean gradient and loss: dw, db and loss start at zero.
__global__ void linear_regression_gradient(const float* x, const float* y, const float* w, const float* b,
                                           int shard_examples, float* dw, float* db, float* loss) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= shard_examples) return;
  const float n = static_cast<float>(shard_examples);
  float error = b[0] - y[e];
  for (std::size_t f = 0; f < features; ++f) error += w[f] * x[e * features + f];
  for (std::size_t f = 0; f < features; ++f) atomicAdd(&dw[f], error * x[e * features + f] / n);
  atomicAdd(db, error / n);
  atomicAdd(loss, 0.5f * error * error / n);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device visible\n");
    return 77;
  }
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(features), x(examples * features), y(examples);
  for (float& w : true_w) w = normal(random);
  for (std::size_t e = 0; e < examples; ++e) {
    y[e] = 0.5f + 0.01f * normal(random);
    for (std::size_t f = 0; f < features; ++f) {
      x[e * features + f] = normal(random);
      y[e] += x[e * features + f] * true_w[f];
    }
  }

  towerpipe::optim::adam::hyper_parameters adam;
  adam.lr = 0.05;
  trainer pipeline({{"w", {features}}, {"b", {1}}},
                   {{"x", towerpipe::dtype::float32, {features}}, {"y", towerpipe::dtype::float32, {}}},
                   /*towers=*/4, adam);  // pipeline_options::devices picks the GPUs; default: all, round-robin
  pipeline.initialize([&](const towerpipe::variable&, towerpipe::tensor_view<float> values) {
    for (float& v : values) v = 0.1f * normal(random);
  });

  towerpipe::batch batch;
  batch.add("x", x, {features}).add("y", y, {});
  double first_loss = 0, loss = 0;
  for (int step = 1; step <= 300; ++step) {
    // stage(next) before step(fn) would overlap the next batch's copy with this step; here the batch
    // is the same every step, so step(batch, fn) stages and runs it.
    const towerpipe::step_stats stats = pipeline.step(batch, [](trainer::tower_context& tower) {
      // Everything the tower touches is on its device; work goes on tower.stream().
      const int n = static_cast<int>(tower.examples());
      const auto dw = tower.zeroed_gradient("w");  // zeroed on tower.stream()
      const auto db = tower.zeroed_gradient("b");
      linear_regression_gradient<<<(n + 127) / 128, 128, 0, tower.stream()>>>(
          tower.input<float>("x").data(), tower.input<float>("y").data(), tower.parameter("w").data(),
          tower.parameter("b").data(), n, dw.data(), db.data(), tower.device_loss());
      // Returning nothing: the step reads the shard's loss from tower.device_loss().
    });
    if (step == 1) first_loss = stats.loss;
    loss = stats.loss;
    if (step % 100 == 0) std::printf("step %d: loss %.6f\n", step, loss);
  }

  const auto w = pipeline.parameter("w");  // copied to the host
  float worst = 0;
  for (std::size_t f = 0; f < features; ++f) worst = std::fmax(worst, std::fabs(w(f) - true_w[f]));
  std::printf("loss %.6f -> %.6f; largest error in w %.4f\n", first_loss, loss, worst);
  return loss < 0.01 * first_loss && worst < 0.01f ? 0 : 1;
}
