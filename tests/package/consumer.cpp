// Two host towers take one SGD step on y = w * x; the installed headers must give the textbook result.
#include <towerpipe/towerpipe.hpp>

#include <cmath>
#include <cstdio>

int main() {
  using trainer = towerpipe::pipeline<towerpipe::exec::host, towerpipe::reduce::host, towerpipe::optim::sgd,
                                      towerpipe::layout::per_variable<float>>;
  towerpipe::optim::sgd::hyper_parameters sgd;
  sgd.lr = 0.5;
  trainer pipeline(towerpipe::variable_set{{"w", {1}}}, {{"x", towerpipe::dtype::float32, {1}}}, 2, sgd);
  const float x[4] = {1, 2, 3, 4};
  towerpipe::batch batch;
  batch.add("x", x, 4, {1});
  // loss = mean(w * x) has gradient mean(x) = 2.5 whatever w is, so w = 0 - 0.5 * 2.5 = -1.25.
  pipeline.step(batch, [](trainer::tower_context& tower) {
    const auto shard = tower.input<float>("x");
    float sum = 0;
    for (std::size_t e = 0; e < shard.examples(); ++e) sum += shard(e, 0);
    tower.gradient("w")[0] = sum / static_cast<float>(shard.examples());
    return 0.0;
  });
  const float w = pipeline.parameter("w")[0];
  std::printf("consumer: w after one step = %g (expected -1.25)\n", w);
  return std::fabs(w + 1.25f) < 1e-6f ? 0 : 1;
}
