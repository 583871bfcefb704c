// The main job: an MLP classifier (784-256-128-10, ReLU, softmax cross-entropy) trained on
// Fashion-MNIST by N towers through a towerpipe pipeline — GPU towers (cuBLAS) where the program was
// built with CUDA and a GPU is visible, host towers (OpenBLAS) otherwise — with the classic
// multi-tower step log, per-epoch test accuracy and throughput, a Chrome-trace timeline and
// checkpoint/resume. `train --help` lists the flags. Bad flags end with a one-line error and exit
// status 2, bad files with one and exit status 1.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <type_traits>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "datasets.hpp"
#include "mlp.hpp"
#if defined(TOWERPIPE_EXAMPLES_GPU)
#include <memory>

#include "mlp_cuda.cuh"
#endif

namespace {

using namespace towerpipe;
using towerpipe_examples::image_dataset;
using towerpipe_examples::labelled_images;
using towerpipe_examples::mlp;

const char* usage = R"(train — an MLP (784-256-128-10) on Fashion-MNIST across N towers

  --towers N            towers                                                  [2]
  --devices LIST        GPU ids, tower i on LIST[i % size]          [all visible, round-robin]
  --cpu-towers          host towers even where a GPU is visible
  --backend NAME        host | device0 | p2p_tree (device backends need GPU towers)
                                                   [device0 with GPU towers, else host]
  --optimizer NAME      sgd | momentum (sgd, momentum 0.9) | adam | adamw       [adam]
  --layout NAME         flat | per_variable                                      [flat]
  --epochs N            passes over the training set                            [15]
  --batch-size N        examples per step, split across the towers              [128]
  --lr X                learning rate               [sgd 0.1, momentum 0.05, adam/adamw 0.001]
  --seed N              initial weights and shuffling                           [1]
  --log-every N         a step line every N steps                               [100]
  --timeline FILE       write a Chrome trace (chrome://tracing, Perfetto) of every step
  --checkpoint DIR      save DIR/towerpipe.ckpt after every epoch
  --resume              continue from DIR/towerpipe.ckpt (needs --checkpoint)
  --data DIR            Fashion-MNIST gzipped IDX files  [/usr/share/datasets/fashion-mnist]
  --generated N         train on N GENERATED examples (Gaussian clusters) instead of Fashion-MNIST
  --help                this text)";

struct options {
  std::size_t towers = 2;
  std::vector<int> devices;
  bool cpu_towers = false, gpu_towers = false;
  std::string backend, optimizer = "adam", layout = "flat";
  std::size_t epochs = 15, batch_size = 128, log_every = 100, generated = 0;
  double lr = -1;
  std::uint64_t seed = 1;
  std::string timeline_path, checkpoint_dir, data_dir = "/usr/share/datasets/fashion-mnist";
  bool resume = false;
};

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::size_t positive(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  unsigned long long number = 0;
  try {
    number = std::stoull(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value[0] == '-' || number == 0)
    throw usage_error(flag + " needs a positive whole number, not '" + value + "'");
  return static_cast<std::size_t>(number);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::puts(usage);
      std::exit(0);
    }
    if (flag == "--resume" || flag == "--cpu-towers") {
      (flag == "--resume" ? o.resume : o.cpu_towers) = true;
      continue;
    }
    if (i + 1 >= argc) throw usage_error(flag + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (flag == "--towers") o.towers = positive(flag, value);
    else if (flag == "--devices") {
      std::size_t start = 0;
      for (std::size_t comma; start <= value.size(); start = comma + 1) {
        comma = value.find(',', start);
        if (comma == std::string::npos) comma = value.size();
        const std::string id = value.substr(start, comma - start);
        if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos)
          throw usage_error("--devices needs comma-separated GPU ids, not '" + value + "'");
        o.devices.push_back(std::stoi(id));
      }
    }
    else if (flag == "--backend") o.backend = value;
    else if (flag == "--optimizer") o.optimizer = value;
    else if (flag == "--layout") o.layout = value;
    else if (flag == "--epochs") o.epochs = positive(flag, value);
    else if (flag == "--batch-size") o.batch_size = positive(flag, value);
    else if (flag == "--log-every") o.log_every = positive(flag, value);
    else if (flag == "--generated") o.generated = positive(flag, value);
    else if (flag == "--seed") o.seed = positive(flag, value);
    else if (flag == "--timeline") o.timeline_path = value;
    else if (flag == "--checkpoint") o.checkpoint_dir = value;
    else if (flag == "--data") o.data_dir = value;
    else if (flag == "--lr") {
      std::size_t used = 0;
      try {
        o.lr = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(o.lr > 0)) throw usage_error("--lr needs a positive number, not '" + value + "'");
    } else {
      throw usage_error("unknown flag " + flag + " (see --help)");
    }
  }
  const auto one_of = [](const std::string& flag, const std::string& value, std::initializer_list<const char*> allowed) {
    for (const char* a : allowed) {
      if (value == a) return;
    }
    std::string list;
    for (const char* a : allowed) list += std::string(list.empty() ? "" : " | ") + a;
    throw usage_error(flag + " '" + value + "' is not one of " + list);
  };
#if defined(TOWERPIPE_EXAMPLES_GPU)
  o.gpu_towers = !o.cpu_towers && towerpipe::detail::cuda_device_count() > 0;
#endif
  if (o.backend.empty()) o.backend = o.gpu_towers ? "device0" : "host";
  one_of("--backend", o.backend, {"host", "device0", "p2p_tree"});
  one_of("--optimizer", o.optimizer, {"sgd", "momentum", "adam", "adamw"});
  one_of("--layout", o.layout, {"flat", "per_variable"});
  const char* why_no_gpu = o.cpu_towers ? "--cpu-towers was given"
#if defined(TOWERPIPE_EXAMPLES_GPU)
                                        : "no GPU is visible";
#else
                                        : "this build of the program has no CUDA";
#endif
  if (o.backend != "host" && !o.gpu_towers)
    throw usage_error("--backend " + o.backend + " needs GPU towers, and " + why_no_gpu);
  if (!o.devices.empty() && !o.gpu_towers) throw usage_error(std::string("--devices needs GPU towers, and ") + why_no_gpu);
  if (o.resume && o.checkpoint_dir.empty()) throw usage_error("--resume needs --checkpoint DIR");
  if (o.lr < 0) o.lr = o.optimizer == "sgd" ? 0.1 : o.optimizer == "momentum" ? 0.05 : 1e-3;
  return o;
}

// A fingerprint of every parameter's bits: two runs print the same value exactly when they end bitwise equal.
template <class Pipeline>
std::uint64_t parameter_checksum(const Pipeline& p) {
  std::uint64_t hash = fnv1a_basis;
  for (std::size_t v = 0; v < p.variables().count(); ++v) {
    const auto values = p.parameter(v);
    hash = fnv1a(values.data(), values.size() * sizeof(float), hash);
  }
  return hash;
}

template <class Pipeline>
double test_accuracy(const Pipeline& p, const mlp& model, const labelled_images& test) {
  towerpipe::batch all;
  all.add("image", test.images.data(), test.examples(), {test.features});
  all.add("label", test.labels.data(), test.examples(), {});
  const std::size_t correct = model.count_correct(all.input<float>("image"), all.input<std::int32_t>("label"),
                                                  [&](std::size_t i) { return p.parameter(i).data(); });
  return 100.0 * static_cast<double>(correct) / static_cast<double>(test.examples());
}

// Double-buffered batches: while step k runs on one buffer, batch k + 1 is staged in the other.
struct batch_buffers {
  std::vector<float> images[2];
  std::vector<std::int32_t> labels[2];
};

// How one tower computes its gradients: host towers through mlp.hpp (OpenBLAS), GPU towers through
// mlp_cuda.cuh (cuBLAS, one workspace per tower, made by the tower's thread on first use).
template <class Exec>
struct tower_program {
  const mlp& model;
  tower_program(const mlp& m, const options&) : model(m) {}
  template <class Context>
  double operator()(Context& tower) const {
    return model.loss_and_gradient(
        tower.template input<float>("image"), tower.template input<std::int32_t>("label"),
        [&](std::size_t i) { return tower.parameter(i).data(); }, [&](std::size_t i) { return tower.gradient(i).data(); });
  }
};

#if defined(TOWERPIPE_EXAMPLES_GPU)
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
#endif

template <class Exec, class Reduce, class Optim, class Layout>
int train(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  using trainer = pipeline<Exec, Reduce, Optim, Layout>;
  const mlp model({data.train.features, 256, 128, 10});
  timeline trace;
  pipeline_options pipeline_opts;
  pipeline_opts.devices = o.devices;
  if (!o.timeline_path.empty()) pipeline_opts.trace = &trace;
  trainer p(model.variables(), model.input_specs(), o.towers, h, pipeline_opts);
  std::uint64_t init_seed = o.seed;
  p.initialize([&](const variable& v, tensor_view<float> values) { model.initialize(v, values, init_seed); });

  const std::size_t batches_per_epoch = data.train.examples() / o.batch_size;
  if (batches_per_epoch == 0) throw usage_error("--batch-size is larger than the training set");
  const std::string checkpoint = o.checkpoint_dir + "/towerpipe.ckpt";
  std::size_t first_epoch = 0;
  if (o.resume) {
    load_checkpoint(p, checkpoint);
    if (p.steps_done() % static_cast<std::int64_t>(batches_per_epoch) != 0)
      throw std::runtime_error(checkpoint + " was not written at the end of an epoch of this batch size");
    first_epoch = static_cast<std::size_t>(p.steps_done()) / batches_per_epoch;
    std::printf("resumed from %s at step %lld (epoch %zu)\n", checkpoint.c_str(), static_cast<long long>(p.steps_done()),
                first_epoch);
  }
  std::printf("data: %s: %zu training, %zu test examples\n", data.description.c_str(), data.train.examples(),
              data.test.examples());
  std::printf("model: %s, %zu parameters; %zu %s towers, reduce::%s, %s, layout::%s, batch %zu, lr %g\n",
              model.describe().c_str(), p.variables().total_size(), p.towers(),
              std::is_same_v<Exec, exec::host> ? "host" : "GPU", Reduce::name, o.optimizer.c_str(), Layout::name,
              o.batch_size, o.lr);

  const std::size_t features = data.train.features;
  batch_buffers buffers;
  const auto stage_batch = [&](const std::vector<std::size_t>& order, std::size_t b, int slot) {
    buffers.images[slot].resize(o.batch_size * features);
    buffers.labels[slot].resize(o.batch_size);
    for (std::size_t e = 0; e < o.batch_size; ++e) {
      const std::size_t example = order[b * o.batch_size + e];
      std::copy_n(data.train.images.data() + example * features, features, buffers.images[slot].data() + e * features);
      buffers.labels[slot][e] = data.train.labels[example];
    }
    towerpipe::batch next;
    next.add("image", buffers.images[slot].data(), o.batch_size, {features});
    next.add("label", buffers.labels[slot].data(), o.batch_size, {});
    p.stage(next);
  };
  tower_program<Exec> program(model, o);
  const auto tower_step = [&](typename trainer::tower_context& tower) { return program(tower); };

  double accuracy = first_epoch > 0 ? test_accuracy(p, model, data.test) : 0.0;
  double total_seconds = 0, slowest_step = 0, fastest_step = 1e30;
  std::size_t total_examples = 0, total_steps = 0;
  stage_seconds stage_totals;
  for (std::size_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    std::vector<std::size_t> order(data.train.examples());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed * 1000003 + epoch));
    const auto epoch_start = std::chrono::steady_clock::now();
    double epoch_fastest = 1e30, epoch_slowest = 0;
    stage_batch(order, 0, 0);
    for (std::size_t b = 0; b < batches_per_epoch; ++b) {
      if (b + 1 < batches_per_epoch) stage_batch(order, b + 1, static_cast<int>((b + 1) % 2));
      const step_stats stats = p.step(tower_step);
      ++total_steps;
      stage_totals.split += stats.stages.split;
      stage_totals.towers += stats.stages.towers;
      stage_totals.reduce += stats.stages.reduce;
      stage_totals.broadcast += stats.stages.broadcast;
      epoch_fastest = std::min(epoch_fastest, stats.seconds);
      epoch_slowest = std::max(epoch_slowest, stats.seconds);
      if (stats.step % static_cast<std::int64_t>(o.log_every) == 0)
        std::printf("step %lld, loss = %.2f (%.1f examples/sec; %.3f sec/batch)\n", static_cast<long long>(stats.step),
                    stats.loss, stats.examples_per_second, stats.seconds);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    accuracy = test_accuracy(p, model, data.test);
    total_seconds += seconds;
    total_examples += batches_per_epoch * o.batch_size;
    fastest_step = std::min(fastest_step, epoch_fastest);
    slowest_step = std::max(slowest_step, epoch_slowest);
    std::printf("epoch %zu: test accuracy %.2f%%, %.1f examples/sec, step time %.2f-%.2f ms (spread %.2fx)\n", epoch + 1,
                accuracy, static_cast<double>(batches_per_epoch * o.batch_size) / seconds, epoch_fastest * 1e3,
                epoch_slowest * 1e3, epoch_slowest / epoch_fastest);
    std::fflush(stdout);
    if (!o.checkpoint_dir.empty()) {
      ::mkdir(o.checkpoint_dir.c_str(), 0755);
      save_checkpoint(p, checkpoint);
    }
  }
  if (!o.timeline_path.empty()) {
    trace.write_chrome_trace(o.timeline_path);
    std::printf("timeline: %zu spans written to %s\n", trace.spans().size(), o.timeline_path.c_str());
  }
  std::printf("final: test accuracy %.2f%% after %zu epochs; %.1f examples/sec; step time spread %.2fx; "
              "parameters checksum %016llx\n",
              accuracy, o.epochs, total_seconds > 0 ? static_cast<double>(total_examples) / total_seconds : 0.0,
              total_examples > 0 ? slowest_step / fastest_step : 0.0,
              static_cast<unsigned long long>(parameter_checksum(p)));
  if (total_steps > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(total_steps);
    std::printf("stages, mean per step: split %.3f ms, towers %.3f ms, reduce %.3f ms, broadcast %.3f ms\n",
                stage_totals.split * per_step_ms, stage_totals.towers * per_step_ms, stage_totals.reduce * per_step_ms,
                stage_totals.broadcast * per_step_ms);
  }
  return 0;
}

template <class Optim, class Layout>
int with_backend(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
#if defined(TOWERPIPE_EXAMPLES_GPU)
  if (o.gpu_towers) {
    if (o.backend == "device0") return train<exec::cuda, reduce::device0, Optim, Layout>(o, data, h);
    if (o.backend == "p2p_tree") return train<exec::cuda, reduce::p2p_tree, Optim, Layout>(o, data, h);
    return train<exec::cuda, reduce::host, Optim, Layout>(o, data, h);
  }
#endif
  return train<exec::host, reduce::host, Optim, Layout>(o, data, h);
}

template <class Optim>
int with_layout(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  if (o.layout == "flat") return with_backend<Optim, layout::flat<float>>(o, data, h);
  return with_backend<Optim, layout::per_variable<float>>(o, data, h);
}

int dispatch(const options& o, const image_dataset& data) {
  if (o.optimizer == "sgd" || o.optimizer == "momentum") {
    optim::sgd::hyper_parameters h;
    h.lr = o.lr;
    h.momentum = o.optimizer == "momentum" ? 0.9 : 0.0;
    return with_layout<optim::sgd>(o, data, h);
  }
  if (o.optimizer == "adam") {
    optim::adam::hyper_parameters h;
    h.lr = o.lr;
    return with_layout<optim::adam>(o, data, h);
  }
  optim::adamw::hyper_parameters h;
  h.lr = o.lr;
  return with_layout<optim::adamw>(o, data, h);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    towerpipe_examples::use_single_threaded_gemm();
    const image_dataset data = o.generated > 0
                                   ? towerpipe_examples::generate_clusters(o.generated, std::max<std::size_t>(o.generated / 5, 100),
                                                                           784, 10, o.seed)
                                   : towerpipe_examples::load_fashion_mnist(o.data_dir);
    return dispatch(o, data);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
