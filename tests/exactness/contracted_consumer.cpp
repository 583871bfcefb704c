// A user's program built with the user's own flags. It trains a few Adam steps through the library
// (exec::host + reduce::host) and prints two fingerprints:
//   library  — the parameters after the steps: must not depend on the flags (the library keeps its own
//              arithmetic free of fused multiply-adds, core/exact_arithmetic.hpp);
//   plain    — the same Adam formulas written here in plain C++: under -ffp-contract=fast on a machine
//              with FMA they change, which shows that the flags really contracted this build.
// The tower function only copies and averages (adds and one division), so no contraction in user code can
// change the gradients.
#include <towerpipe/towerpipe.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {

std::uint64_t fingerprint(const std::vector<float>& values) { return towerpipe::fnv1a(values.data(), values.size() * 4); }

// Distinct, sign-mixed values spread over a few binades, from integers only (no arithmetic to contract).
float input_value(std::size_t i) { return static_cast<float>(static_cast<int>((i * 7919) % 2003) - 1001) / 97.0f; }

}  // namespace

int main() {
  constexpr std::size_t parameters = 4099, examples = 6, steps = 5;
  using trainer = towerpipe::pipeline<towerpipe::exec::host, towerpipe::reduce::host, towerpipe::optim::adam,
                                      towerpipe::layout::flat<float>>;
  towerpipe::optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.1;  // one more multiply-add per element
  trainer pipeline({{"w", {parameters}}}, {{"x", towerpipe::dtype::float32, {parameters}}}, /*towers=*/3, adam);
  std::vector<float> initial(parameters), x(examples * parameters);
  for (std::size_t i = 0; i < parameters; ++i) initial[i] = input_value(i + 17) / 8.0f;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = input_value(i);
  pipeline.set_parameter("w", initial.data(), initial.size());
  towerpipe::batch batch;
  batch.add("x", x, {parameters});
  for (std::size_t step = 0; step < steps; ++step) {
    pipeline.step(batch, [](trainer::tower_context& tower) {
      const auto shard = tower.input<float>("x");
      const auto g = tower.gradient("w");
      for (std::size_t i = 0; i < g.size(); ++i) {
        float sum = 0;
        for (std::size_t e = 0; e < shard.examples(); ++e) sum += shard(e, i);
        g[i] = sum / static_cast<float>(shard.examples());
      }
      return 0.0;
    });
  }
  const auto w = pipeline.parameter("w");

  // The plain version: Adam with L2 decay written as a user would, on the whole batch's mean gradient
  // computed the same way the library's towers and tree would be — only the arithmetic differs.
  std::vector<float> p = initial, m(parameters), v(parameters);
  const float beta1 = 0.9f, beta2 = 0.999f, lr = 0.01f, decay = 0.1f;
  for (std::size_t step = 1; step <= steps; ++step) {
    const float step_size = static_cast<float>(0.01 / (1.0 - std::pow(0.9, step)));
    const float correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(0.999, step)));
    for (std::size_t i = 0; i < parameters; ++i) {
      float sum = 0;
      for (std::size_t e = 0; e < examples; ++e) sum += x[e * parameters + i];
      const float g = sum / static_cast<float>(examples) + decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      p[i] = p[i] - step_size * m[i] / (std::sqrt(v[i]) / correction2 + 1e-8f);
    }
  }
  (void)lr;
#if defined(__FMA__)
  const int fma = 1;
#else
  const int fma = 0;
#endif
  std::printf("fma %d library %016llx plain %016llx\n", fma,
              static_cast<unsigned long long>(fingerprint(std::vector<float>(w.begin(), w.end()))),
              static_cast<unsigned long long>(fingerprint(p)));
  return 0;
}
