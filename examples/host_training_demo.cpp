// A small honest demo of the host path: N host towers train an MLP classifier with Adam on a GENERATED
// data set (Gaussian clusters, one per class; no download), printing the step log and the accuracy on
// held-out examples drawn from the same clusters.
//
//   host_training_demo [--towers N] [--steps S] [--batch-size B] [--lr LR] [--seed SEED]

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "mlp.hpp"

namespace {

struct options {
  std::size_t towers = 2, steps = 300, batch_size = 256;
  double lr = 1e-3;
  std::uint64_t seed = 1;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::puts("host_training_demo [--towers N] [--steps S] [--batch-size B] [--lr LR] [--seed SEED]\n"
                "Trains a 64-128-10 MLP with Adam on N host towers over generated Gaussian clusters.");
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (see --help)");
    const std::string value = argv[++i];
    std::size_t used = 0;
    try {
      if (flag == "--towers") o.towers = std::stoul(value, &used);
      else if (flag == "--steps") o.steps = std::stoul(value, &used);
      else if (flag == "--batch-size") o.batch_size = std::stoul(value, &used);
      else if (flag == "--lr") o.lr = std::stod(value, &used);
      else if (flag == "--seed") o.seed = std::stoull(value, &used);
      else throw std::invalid_argument("unknown flag " + flag + " (see --help)");
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (used != value.size()) throw std::invalid_argument("bad value '" + value + "' for " + flag);
  }
  return o;
}

// Gaussian clusters: class c's examples are centre_c + noise, the centres drawn once from the seed.
struct generated_data {
  std::vector<float> images;
  std::vector<std::int32_t> labels;
};

generated_data generate(std::size_t examples, std::size_t features, std::size_t classes, std::uint64_t seed,
                        const std::vector<float>& centres) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(classes) - 1);
  generated_data data;
  data.images.resize(examples * features);
  data.labels.resize(examples);
  for (std::size_t e = 0; e < examples; ++e) {
    data.labels[e] = pick(rng);
    for (std::size_t f = 0; f < features; ++f)
      data.images[e * features + f] = centres[static_cast<std::size_t>(data.labels[e]) * features + f] + noise(rng);
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  constexpr std::size_t features = 64, classes = 10;
  const towerpipe_examples::mlp model({features, 128, classes});

  std::mt19937_64 centre_rng(o.seed);
  std::normal_distribution<float> centre(0.0f, 0.35f);
  std::vector<float> centres(classes * features);
  for (float& c : centres) c = centre(centre_rng);
  const generated_data train = generate(o.batch_size * 64, features, classes, o.seed + 1, centres);
  const generated_data test = generate(4096, features, classes, o.seed + 2, centres);
  std::printf("data: GENERATED Gaussian clusters (%zu classes, %zu features): %zu training, %zu test examples\n",
              classes, features, train.labels.size(), test.labels.size());

  using trainer = towerpipe::pipeline<towerpipe::exec::host, towerpipe::reduce::host, towerpipe::optim::adam,
                                      towerpipe::layout::flat<float>>;
  towerpipe::optim::adam::hyper_parameters adam;
  adam.lr = o.lr;
  trainer pipeline(model.variables(), model.input_specs(), o.towers, adam);
  std::uint64_t init_seed = o.seed;
  pipeline.initialize([&](const towerpipe::variable& v, towerpipe::tensor_view<float> values) {
    model.initialize(v, values, init_seed);
  });
  std::printf("model: MLP 64-128-10, %zu parameters; %zu host towers, reduce::host, adam, flat layout\n",
              pipeline.variables().total_size(), pipeline.towers());

  const std::size_t batches = train.labels.size() / o.batch_size;
  double examples_per_second_sum = 0;
  for (std::size_t step = 0; step < o.steps; ++step) {
    const std::size_t first = (step % batches) * o.batch_size;
    towerpipe::batch batch;
    batch.add("image", train.images.data() + first * features, o.batch_size, {features});
    batch.add("label", train.labels.data() + first, o.batch_size, {});
    const towerpipe::step_stats stats = pipeline.step(batch, [&](trainer::tower_context& tower) {
      return model.loss_and_gradient(
          tower.input<float>("image"), tower.input<std::int32_t>("label"),
          [&](std::size_t i) { return tower.parameter(i).data(); }, [&](std::size_t i) { return tower.gradient(i).data(); });
    });
    examples_per_second_sum += stats.examples_per_second;
    if (stats.step % 50 == 0 || step + 1 == o.steps)
      std::printf("step %lld, loss = %.4f (%.1f examples/sec; %.4f sec/batch)\n", static_cast<long long>(stats.step),
                  stats.loss, stats.examples_per_second, stats.seconds);
  }

  towerpipe::batch held_out;
  held_out.add("image", test.images.data(), test.labels.size(), {features});
  held_out.add("label", test.labels.data(), test.labels.size(), {});
  const std::size_t correct =
      model.count_correct(held_out.input<float>("image"), held_out.input<std::int32_t>("label"),
                          [&](std::size_t i) { return pipeline.parameter(i).data(); });
  std::printf("test accuracy %.2f%% (%zu / %zu); mean %.1f examples/sec over %zu steps\n",
              100.0 * static_cast<double>(correct) / static_cast<double>(test.labels.size()), correct,
              test.labels.size(), examples_per_second_sum / static_cast<double>(o.steps), o.steps);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "host_training_demo: %s\n", e.what());
  return 1;
}
