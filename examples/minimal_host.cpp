// towerpipe in one page, on CPU towers: linear regression y = x·w + b on generated data, trained with
// Adam across 4 host towers. The README quotes this file; CI builds and runs it.
#include <towerpipe/towerpipe.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using trainer = towerpipe::pipeline<towerpipe::exec::host,        // towers are CPU threads
                                    towerpipe::reduce::host,      // average + Adam in one pass over memory
                                    towerpipe::optim::adam,       // torch.optim.Adam's algorithm, exactly
                                    towerpipe::layout::flat<float>>;

int main() {
  constexpr std::size_t features = 8, examples = 512;
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> true_w(features), x(examples * features), y(examples);  // the data set
  for (float& w : true_w) w = normal(random);
  for (std::size_t e = 0; e < examples; ++e) {
    y[e] = 0.5f + 0.01f * normal(random);  // true b = 0.5, plus noise
    for (std::size_t f = 0; f < features; ++f) {
      x[e * features + f] = normal(random);
      y[e] += x[e * features + f] * true_w[f];
    }
  }

  towerpipe::optim::adam::hyper_parameters adam;
  adam.lr = 0.05;
  trainer pipeline({{"w", {features}}, {"b", {1}}},                              // variables: names, shapes
                   {{"x", towerpipe::dtype::float32, {features}},                 // inputs: one example's shape
                    {"y", towerpipe::dtype::float32, {}}},
                   /*towers=*/4, adam);
  pipeline.initialize([&](const towerpipe::variable&, towerpipe::tensor_view<float> values) {
    for (float& v : values) v = 0.1f * normal(random);
  });

  towerpipe::batch batch;  // views the caller's memory; it must outlive the step
  batch.add("x", x, {features}).add("y", y, {});
  double first_loss = 0, loss = 0;
  for (int step = 1; step <= 300; ++step) {
    const towerpipe::step_stats stats = pipeline.step(batch, [](trainer::tower_context& tower) {
      const auto xs = tower.input<float>("x");  // this tower's shard: examples x features, no copy
      const auto ys = tower.input<float>("y");
      const auto w = tower.parameter("w");
      const float b = tower.parameter("b")[0];
      // The mean gradient over the shard, accumulated per example: ask for zeroed buffers.
      // (tower.gradient(v) is write-only and free: its contents are unspecified.)
      const auto dw = tower.zeroed_gradient("w");
      const auto db = tower.zeroed_gradient("b");
      const float n = static_cast<float>(tower.examples());
      double shard_loss = 0;
      for (std::size_t e = 0; e < tower.examples(); ++e) {
        float error = b - ys(e, 0);
        for (std::size_t f = 0; f < features; ++f) error += w[f] * xs(e, f);
        shard_loss += 0.5 * error * error;
        for (std::size_t f = 0; f < features; ++f) dw[f] += error * xs(e, f) / n;
        db[0] += error / n;
      }
      return shard_loss / n;  // the shard's mean loss
    });
    if (step == 1) first_loss = stats.loss;
    loss = stats.loss;
    if (step % 100 == 0) std::printf("step %d: loss %.6f (%.0f examples/s)\n", step, loss, stats.examples_per_second);
  }

  const auto w = pipeline.parameter("w");  // read back (a copy on the host for GPU towers)
  float worst = 0;
  for (std::size_t f = 0; f < features; ++f) worst = std::fmax(worst, std::fabs(w(f) - true_w[f]));
  std::printf("loss %.6f -> %.6f; b = %.4f (true 0.5); largest error in w %.4f\n", first_loss, loss,
              pipeline.parameter("b")[0], worst);
  return loss < 0.01 * first_loss && worst < 0.01f ? 0 : 1;
}
