#pragma once
// The training program's loop (examples/train.cpp): options, the training of one configuration of
// policies with its progress output, checkpoints and summary. A header so that host towers build with
// the C++ compiler alone (train.cpp) and GPU towers in a translation unit of their own (train_gpu.cu).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <towerpipe/towerpipe.hpp>
#if defined(TOWERPIPE_EXAMPLES_NCCL)
#include <mpi.h>
#endif

#include "datasets.hpp"
#include "classifier.hpp"
#include "gemm.hpp"
#include "mixed_precision.hpp"

namespace towerpipe_examples::training {

using namespace towerpipe;

struct options {
  std::size_t towers = 2;
  std::vector<int> devices;
  bool cpu_towers = false, gpu_towers = false;
  std::string model = "mlp", backend, optimizer = "adam", layout = "flat";
  // --precision: the towers' parameters and gradients in fp32, or in bf16 / fp16 (16-bit towers: the
  // pipeline keeps an fp32 master, the models compute in fp32 through mixed_precision.hpp).
  std::string precision = "fp32";
  std::size_t epochs = 15, batch_size = 128, log_every = 100, generated = 0;
  std::size_t time_backends = 0;  // --time-backends: pipeline_options::time_backends (reduce::automatic)
  double lr = -1;
  std::uint64_t seed = 1;
  std::string timeline_path, metrics_path, checkpoint_dir, data_dir = "/usr/share/datasets/fashion-mnist";
  bool resume = false, compare_backends = false;
  // The towers mark each layer's gradients ready as its backward finishes, and buckets are reduced while
  // they run; --no-overlap: no marks, every bucket after the towers (the same bits).
  bool overlap = true;
  // --ranks: this process is rank `rank` of `processes` started by mpirun (reduce::sharded over group).
  bool ranks = false;
  int rank = 0, processes = 1;
  std::string transport = "mpi";  // --transport: how GPU towers' processes exchange (mpi: staged in pinned memory; nccl)
  std::shared_ptr<towerpipe::process_group> group;
  std::vector<std::string> given;  // the flags on the command line, to tell defaults apart in messages
  bool was_given(const std::string& flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }
};

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// 16-bit towers come in one layout per precision: bf16 flat, fp16 per_variable. Each combination of
// precision and layout is a pipeline per optimizer and backend to compile, for host and GPU towers: as
// measured (2-core dev machine, shared), these two cost train_mixed.cpp ~47 s and the 16-bit GPU trainings
// (every backend; now one translation unit per optimizer and layout) ~115 s of CPU; both layouts of both precisions would double that (host towers' four:
// 2 x ~65 s).
// (Spelled towerpipe::bfloat16: OpenBLAS's cblas.h declares a global bfloat16.)
using bf16_layout = layout::flat<towerpipe::bfloat16>;
using fp16_layout = layout::per_variable<towerpipe::float16>;
// The layout --precision trains (fp32: both, --layout chooses).
inline const char* layout_of_precision(const std::string& precision) {
  return precision == "bf16" ? bf16_layout::name : precision == "fp16" ? fp16_layout::name : nullptr;
}


// A fingerprint of every parameter's bits: two runs print the same value exactly when they end bitwise equal.
// With 16-bit towers, of the fp32 master (what pipeline::parameter returns, and checkpoints keep).
template <class Pipeline>
std::uint64_t parameter_checksum(const Pipeline& p) {
  std::uint64_t hash = fnv1a_basis;
  for (std::size_t v = 0; v < p.variables().count(); ++v) {
    const auto values = p.parameter(v);
    hash = fnv1a(values.data(), values.size() * sizeof(float), hash);
  }
  return hash;
}

// Test accuracy, in percent: host towers evaluate on the CPU through the model's own code; GPU towers on
// tower 0's device with its replica (train_gpu.cu specialises this).
template <class Exec>
struct test_evaluator {
  const classifier& model;
  const labelled_images& test;
  test_evaluator(const classifier& m, const labelled_images& t) : model(m), test(t) {}
  template <class Pipeline>
  double operator()(Pipeline& p) const {
    towerpipe::batch all;
    all.add("image", test.images.data(), test.examples(), {test.features});
    all.add("label", test.labels.data(), test.examples(), {});
    const std::size_t correct = model.count_correct(all.input<float>("image"), all.input<std::int32_t>("label"),
                                                    [&](std::size_t i) { return p.parameter(i).data(); });
    return 100.0 * static_cast<double>(correct) / static_cast<double>(test.examples());
  }
};

// Output files and directories are checked before any training: the directory is created and the file
// opened for writing (it stays empty until the program writes it), so a bad path costs no training.
inline void prepare_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  const std::filesystem::path file(path);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  if (!std::ofstream(path, std::ios::app))
    throw std::runtime_error(flag + " " + path + ": cannot write there" + (error ? " (" + error.message() + ")" : ""));
}
inline void prepare_output_directory(const std::string& flag, const std::string& directory) {
  if (directory.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error || ::access(directory.c_str(), W_OK) != 0)
    throw std::runtime_error(flag + " " + directory + ": cannot create or write the directory" +
                             (error ? " (" + error.message() + ")" : ""));
}

// The data cursor a checkpoint carries (save_checkpoint's user data): the epochs done, and the batch
// size and batches per epoch that make them. Saved at the end of an epoch, so the next one starts there.
inline std::string data_cursor(std::size_t epochs_done, std::size_t batches_per_epoch, std::size_t batch_size) {
  return "train data cursor: epochs_done " + std::to_string(epochs_done) + " batches_per_epoch " +
         std::to_string(batches_per_epoch) + " batch_size " + std::to_string(batch_size);
}
// The epoch a run resumes at, from the checkpoint's cursor; a checkpoint without one (written before the
// program saved it) from its step count, which is exact only where no step was skipped.
inline std::size_t resume_epoch(const std::string& cursor, const std::string& checkpoint, std::int64_t steps_done,
                                std::size_t batches_per_epoch, std::size_t batch_size) {
  if (cursor.empty()) {
    if (steps_done % static_cast<std::int64_t>(batches_per_epoch) != 0)
      throw std::runtime_error(checkpoint + " was not written at the end of an epoch of this batch size");
    return static_cast<std::size_t>(steps_done) / batches_per_epoch;
  }
  std::size_t epochs = 0, batches = 0, size = 0;
  char rest = 0;
  if (std::sscanf(cursor.c_str(), "train data cursor: epochs_done %zu batches_per_epoch %zu batch_size %zu%c", &epochs,
                  &batches, &size, &rest) != 3)
    throw std::runtime_error(checkpoint + ": its data cursor is not this program's: '" + cursor + "'");
  if (batches != batches_per_epoch || size != batch_size)
    throw std::runtime_error(checkpoint + " was written with " + std::to_string(batches) + " batches of " + std::to_string(size) +
                             " examples an epoch; this run has " + std::to_string(batches_per_epoch) + " of " +
                             std::to_string(batch_size) + " (the same --batch-size and data to resume)");
  return epochs;
}

// Step times with the first steps left out (the first step allocates and warms caches: 100-600x a later
// one on the H200): median, p95, p99 and max, which show the spread the tutorial's users saw.
struct step_times {
  static constexpr std::size_t warmup = 5;
  std::vector<double> seconds;

  bool enough() const { return seconds.size() > warmup; }
  // The q-quantile (nearest rank) of the kept steps, in milliseconds; needs enough().
  double quantile_ms(double q) const {
    std::vector<double> kept(seconds.begin() + warmup, seconds.end());
    std::sort(kept.begin(), kept.end());
    return kept[static_cast<std::size_t>(q * static_cast<double>(kept.size() - 1) + 0.5)] * 1e3;
  }

  std::string summary() const {
    if (!enough()) return "too few steps past the warm-up to tell";
    char text[200];
    std::snprintf(text, sizeof text, "median %.2f ms, p95 %.2f, p99 %.2f, max %.2f (%zu steps; the first %zu left out as warm-up)",
                  quantile_ms(0.5), quantile_ms(0.95), quantile_ms(0.99), quantile_ms(1.0), seconds.size() - warmup, warmup);
    return text;
  }
};

inline std::string duration_text(double seconds) {
  char text[32];
  if (seconds < 60) std::snprintf(text, sizeof text, "%.0f s", seconds);
  else std::snprintf(text, sizeof text, "%.0fm%02.0fs", std::floor(seconds / 60), std::fmod(seconds, 60.0));
  return text;
}

// Double-buffered batches: while step k runs on one buffer, batch k + 1 is staged in the other.
struct batch_buffers {
  std::vector<float> images[2];
  std::vector<std::int32_t> labels[2];
};

// What one run of training ends with: the figures of --compare-backends' table.
struct run_result {
  std::string backend, layout;
  bool overlap = true;
  double examples_per_second = 0, median_ms = 0, p99_ms = 0;
  double reduce_share = 0;  // (reduce + broadcast) / the whole step, averaged over the run
  double share_during_towers = 0;  // of the reduction's time, the part during the towers (below)
  double accuracy = 0;
  std::uint64_t checksum = 0;
};

// Of the reduction's time, the part that ran during the towers (on a thread of its own, as their
// backward passes marked the buckets ready). Hidden only where that thread had a core to itself: with a
// tower on every core it slows the towers down instead.
inline double share_during_towers(const stage_seconds& totals) {
  const double all = totals.reduce_during_towers + totals.reduce;
  return all > 0 ? totals.reduce_during_towers / all : 0.0;
}

// GPU towers, where the program was built with them (train_gpu.cu): the visible GPUs, and the training
// with GPU towers for one optimizer and layout (backend from o.backend; train_gpu.cuh).
int visible_gpus();
template <class Optim, class Layout>
run_result train_on_gpus(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h);
#if defined(TOWERPIPE_EXAMPLES_NCCL)
// --transport nccl: the processes of `comm` as an NCCL group, this one on `device` (train_gpu.cu).
std::shared_ptr<process_group> nccl_group(MPI_Comm comm, int device);
#endif

// One gradient bucket per layer (the variables "<layer>.weight" and "<layer>.bias"), the last layer's
// first: the models mark a layer's variables ready together (ready_marks.hpp), so each bucket can be
// reduced as soon as its layer's backward is done. (The default 25 MiB cap would make one bucket of
// these small models, ready only when the whole backward pass is.)
inline gradient_buckets per_layer_buckets(const variable_set& variables) {
  gradient_buckets buckets;
  std::string layer;
  for (std::size_t v = variables.count(); v-- > 0;) {
    const std::string& name = variables[v].name;
    const std::string prefix = name.substr(0, name.rfind('.'));
    if (buckets.groups.empty() || prefix != layer) buckets.groups.emplace_back();
    buckets.groups.back().push_back(name);
    layer = prefix;
  }
  return buckets;
}

// What a tower's backward pass calls as each variable is done: tower.gradient_ready(i) where `mark`,
// else nothing (--no-overlap).
template <class Context>
auto ready_marks(Context& tower, bool mark) {
  return [&tower, mark](std::size_t i) {
    if (mark) tower.gradient_ready(i);
  };
}

// How one tower computes its gradients: host towers through the model's own code (OpenBLAS), GPU towers
// through mlp_cuda.cuh or cnn_cudnn.cuh (train_gpu.cuh specialises this). fp32 towers hand the model
// their own parameters and gradients; 16-bit towers (Stored bfloat16 or float16) fp32 scratch
// (mixed_precision.hpp), their gradients times the loss scale, and return the scaled loss.
template <class Exec, class Stored>
struct tower_program {
  const classifier& model;
  bool mark_ready;
  float loss_scale = 1;  // pipeline::loss_scale(), set before each step
  std::vector<fp32_scratch<Stored, host_conversions>> scratch;  // 16-bit towers: one per tower
  tower_program(const classifier& m, const options& o) : model(m), mark_ready(o.overlap), scratch(o.towers) {}
  template <class Context>
  double operator()(Context& tower) {
    const auto images = tower.template input<float>("image");
    const auto labels = tower.template input<std::int32_t>("label");
    if constexpr (std::is_same_v<Stored, float>) {
      return model.loss_and_gradient(
          images, labels, [&](std::size_t i) { return tower.parameter(i).data(); },
          [&](std::size_t i) { return tower.gradient(i).data(); }, ready_marks(tower, mark_ready));
    } else {
      auto& fp32 = scratch[tower.tower()];
      fp32.widen_parameters(tower);
      const double loss = model.loss_and_gradient(
          images, labels, [&](std::size_t i) -> const float* { return fp32.parameter(i); },
          [&](std::size_t i) { return fp32.gradient(i); }, fp32.ready_marks(tower, mark_ready, loss_scale));
      fp32.narrow_rest(tower, loss_scale);
      return loss * loss_scale;
    }
  }
};

template <class Exec, class Reduce, class Optim, class Layout>
run_result train(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  using trainer = pipeline<Exec, Reduce, Optim, Layout>;
  using stored = typename trainer::stored_type;
  const classifier model(o.model, data.train.features);
  timeline trace;
  pipeline_options pipeline_opts;
  pipeline_opts.devices = o.devices;
  if (!o.timeline_path.empty()) pipeline_opts.trace = &trace;
  pipeline_opts.buckets = per_layer_buckets(model.variables());
  pipeline_opts.overlap_reduction = o.overlap;
  pipeline_opts.time_backends = o.time_backends;
  // fp16's 5-bit exponent flushes small gradients to zero: dynamic loss scaling (GradScaler's rules)
  // lifts them into its range. bf16 has fp32's exponent range and needs none.
  if constexpr (std::is_same_v<stored, towerpipe::float16>) pipeline_opts.loss_scale.mode = loss_scale_mode::dynamic;
  if constexpr (trainer::reducer_type::capabilities.spans_processes) pipeline_opts.processes = o.group;
  // Checked before the pipeline allocates anything: a batch gives every tower of every process an example.
  if (o.batch_size < o.towers * static_cast<std::size_t>(o.processes))
    throw usage_error("--batch-size " + std::to_string(o.batch_size) + (o.was_given("--batch-size") ? "" : " (the default)") +
                      " is smaller than the " +
                      std::to_string(o.towers * static_cast<std::size_t>(o.processes)) + " towers: every tower needs an example");
  trainer p(model.variables(), model.input_specs(), o.towers, h, pipeline_opts);
  std::uint64_t init_seed = o.seed;
  p.initialize([&](const variable& v, tensor_view<float> values) { model.initialize(v, values, init_seed); });

  const std::size_t batches_per_epoch = data.train.examples() / o.batch_size;
  if (batches_per_epoch == 0)
    throw usage_error("--batch-size " + std::to_string(o.batch_size) + (o.was_given("--batch-size") ? "" : " (the default)") +
                      " is larger than the training set (" + std::to_string(data.train.examples()) + " examples)");
  prepare_output_file("--timeline", o.timeline_path);
  prepare_output_file("--metrics", o.metrics_path);
  prepare_output_directory("--checkpoint", o.checkpoint_dir);
  std::ofstream metrics;
  if (!o.metrics_path.empty()) {
    metrics.open(o.metrics_path);
    metrics << "step,epoch,loss,examples_per_second,ms_per_step,test_accuracy\n";
  }
  const std::string checkpoint = o.checkpoint_dir + "/towerpipe.ckpt";
  std::size_t first_epoch = 0;
  if (o.resume && !std::filesystem::exists(checkpoint)) {
    std::printf("nothing to resume: %s does not exist; starting at step 0\n", checkpoint.c_str());
  } else if (o.resume) {
    // Where the data stands comes from the checkpoint's own cursor (save_data_cursor), not from
    // p.steps_done(), which leaves out the steps skipped (fp16's loss scaling skips overflowing ones).
    first_epoch = resume_epoch(load_checkpoint(p, checkpoint), checkpoint, p.steps_done(), batches_per_epoch, o.batch_size);
    std::printf("resumed from %s at step %lld (epoch %zu)\n", checkpoint.c_str(), static_cast<long long>(p.steps_done()),
                first_epoch);
  }
  std::printf("data: %s: %zu training, %zu test examples\n", data.description.c_str(), data.train.examples(),
              data.test.examples());
  if (std::is_same_v<Exec, exec::host>) {  // the host towers' GEMMs
    std::printf("blas: %s\n", towerpipe_examples::gemm_backend().c_str());
    const std::string better = towerpipe_examples::better_openblas_core();
    // run.sh chooses the kernel only where the environment names none: say which case this is.
    const char* chosen = std::getenv("OPENBLAS_CORETYPE");
    if (!better.empty() && chosen != nullptr)
      std::printf("blas: this kernel's vectors are narrower than this CPU's: OPENBLAS_CORETYPE=%s runs faster; the "
                  "environment sets OPENBLAS_CORETYPE=%s, which examples/run.sh keeps\n",
                  better.c_str(), chosen);
    else if (!better.empty())
      std::printf("blas: this kernel's vectors are narrower than this CPU's: OPENBLAS_CORETYPE=%s runs faster "
                  "(examples/run.sh sets it)\n",
                  better.c_str());
  }
  if constexpr (std::is_same_v<Reduce, reduce::automatic>)
    std::printf("backend: reduce::%s, chosen by reduce::automatic: %s\n", p.backend_name().c_str(), p.backend_reason().c_str());
  std::printf("model: %s, %zu parameters; %zu %s towers%s, reduce::%s, %s, layout::%s, batch %zu, lr %g\n",
              model.describe().c_str(), p.variables().total_size(), p.towers(),
              std::is_same_v<Exec, exec::host> ? "host" : "GPU",
              o.processes > 1 ? (" in each of " + std::to_string(o.processes) + " processes").c_str() : "", p.backend_name().c_str(),
              o.optimizer.c_str(), Layout::name, o.batch_size, o.lr);
  if constexpr (std::is_same_v<stored, float>)
    std::printf("precision: fp32 towers\n");
  else
    std::printf("precision: %s towers (16-bit parameters and gradients; fp32 master, optimizer state and average; "
                "the model computes in fp32)\n",
                o.precision.c_str());
  if (p.loss_scaling_on())
    std::printf("loss scaling: dynamic, from %g (halved and the step skipped on overflow, doubled after %lld good steps)\n",
                p.loss_scale(), static_cast<long long>(pipeline_opts.loss_scale.growth_interval));

  const std::size_t features = data.train.features;
  // With several processes each stages its towers' part of the batch, as one process would cut it.
  const batch_part part = p.process_part(o.batch_size);
  const std::size_t local_first = part.first, local_examples = part.examples;
  batch_buffers buffers;
  const auto stage_batch = [&](const std::vector<std::size_t>& order, std::size_t b, int slot) {
    buffers.images[slot].resize(local_examples * features);
    buffers.labels[slot].resize(local_examples);
    for (std::size_t e = 0; e < local_examples; ++e) {
      const std::size_t example = order[b * o.batch_size + local_first + e];
      std::copy_n(data.train.images.data() + example * features, features, buffers.images[slot].data() + e * features);
      buffers.labels[slot][e] = data.train.labels[example];
    }
    towerpipe::batch next;
    next.add("image", buffers.images[slot].data(), local_examples, {features});
    next.add("label", buffers.labels[slot].data(), local_examples, {});
    p.stage(next);
  };
  tower_program<Exec, stored> program(model, o);
  const auto tower_step = [&](typename trainer::tower_context& tower) { return program(tower); };

  test_evaluator<Exec> test_accuracy(model, data.test);
  double accuracy = first_epoch > 0 ? test_accuracy(p) : 0.0;
  double total_seconds = 0;
  std::size_t total_examples = 0, total_steps = 0;
  const long long all_steps = static_cast<long long>(o.epochs * batches_per_epoch);
  stage_seconds stage_totals;
  std::size_t buckets = 1, buckets_during_towers = 0;  // a step's buckets; those reduced during the towers, over the run
  std::size_t skipped_steps = 0;  // a non-finite average: with loss scaling, an overflow (the scale halves)
  step_times run_times;
  // The log interval: examples, loss and wall time since the last progress line.
  std::size_t interval_steps = 0, interval_examples = 0;
  double interval_loss = 0;
  auto interval_start = std::chrono::steady_clock::now();
  for (std::size_t epoch = first_epoch; epoch < o.epochs; ++epoch) {
    std::vector<std::size_t> order(data.train.examples());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(o.seed * 1000003 + epoch));
    const auto epoch_start = std::chrono::steady_clock::now();
    step_times epoch_times;
    stage_batch(order, 0, 0);
    for (std::size_t b = 0; b < batches_per_epoch; ++b) {
      if (b + 1 < batches_per_epoch) stage_batch(order, b + 1, static_cast<int>((b + 1) % 2));
      program.loss_scale = static_cast<float>(p.loss_scale());
      const step_stats stats = p.step(tower_step);
      skipped_steps += stats.skipped ? 1 : 0;
      ++total_steps;
      // The batch's number: the optimizer's step, but for the steps skipped (stats.step repeats after one).
      const long long batch_step = static_cast<long long>(first_epoch * batches_per_epoch + total_steps);
      stage_totals.split += stats.stages.split;
      stage_totals.towers += stats.stages.towers;
      stage_totals.reduce += stats.stages.reduce;
      stage_totals.broadcast += stats.stages.broadcast;
      stage_totals.reduce_during_towers += stats.stages.reduce_during_towers;
      buckets = stats.buckets;
      buckets_during_towers += stats.buckets_during_towers;
      epoch_times.seconds.push_back(stats.seconds);
      run_times.seconds.push_back(stats.seconds);
      ++interval_steps;
      interval_examples += stats.examples;
      interval_loss += stats.loss / stats.loss_scale;  // the towers return the scaled loss
      if (batch_step % static_cast<long long>(o.log_every) == 0) {
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - interval_start).count();
        const double per_step = wall / static_cast<double>(interval_steps);
        const double rate = static_cast<double>(interval_examples) / wall;
        const double loss = interval_loss / static_cast<double>(interval_steps);
        std::printf("step %lld/%lld, loss = %.4f (%.1f examples/sec; %.2f ms/batch; ETA %s)\n", batch_step, all_steps,
                    loss, rate, per_step * 1e3, duration_text(per_step * static_cast<double>(all_steps - batch_step)).c_str());
        if (metrics.is_open())
          metrics << batch_step << "," << epoch + 1 << "," << loss << "," << rate << "," << per_step * 1e3 << ",\n";
        interval_steps = interval_examples = 0;
        interval_loss = 0;
        interval_start = std::chrono::steady_clock::now();
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    accuracy = test_accuracy(p);
    total_seconds += seconds;
    total_examples += batches_per_epoch * o.batch_size;
    std::sort(epoch_times.seconds.begin(), epoch_times.seconds.end());
    std::printf("epoch %zu/%zu: test accuracy %.2f%%, %.1f examples/sec, step time median %.2f ms, max %.2f ms\n",
                epoch + 1, o.epochs, accuracy, static_cast<double>(batches_per_epoch * o.batch_size) / seconds,
                epoch_times.seconds[epoch_times.seconds.size() / 2] * 1e3, epoch_times.seconds.back() * 1e3);
    if (metrics.is_open()) {
      // The batch count, as the progress rows count (p.steps_done() leaves out skipped steps).
      metrics << first_epoch * batches_per_epoch + total_steps << "," << epoch + 1 << ",,,," << accuracy << "\n" << std::flush;
      if (!metrics) throw std::runtime_error("--metrics " + o.metrics_path + ": writing failed (disk full?)");
    }
    if (!o.checkpoint_dir.empty()) {
      // every process helps gather a sharded optimizer state; the cursor says where the data stands
      save_checkpoint(p, checkpoint, data_cursor(epoch + 1, batches_per_epoch, o.batch_size), o.rank == 0);
      std::printf("checkpoint: %s (step %lld)\n", checkpoint.c_str(), static_cast<long long>(p.steps_done()));
    }
    std::fflush(stdout);
  }
  if (!o.timeline_path.empty()) {
    trace.write_chrome_trace(o.timeline_path);
    std::printf("timeline: %zu spans written to %s\n", trace.spans().size(), o.timeline_path.c_str());
  }
  if constexpr (std::is_same_v<Reduce, reduce::automatic>) {
    if (o.time_backends > 0) std::printf("backend: reduce::%s kept: %s\n", p.backend_name().c_str(), p.backend_reason().c_str());
  }
  std::printf("final: test accuracy %.2f%% after %zu epochs; %.1f examples/sec; parameters checksum %016llx\n",
              accuracy, o.epochs, total_seconds > 0 ? static_cast<double>(total_examples) / total_seconds : 0.0,
              static_cast<unsigned long long>(parameter_checksum(p)));
  std::printf("step time: %s\n", run_times.summary().c_str());
  if (p.loss_scaling_on())
    std::printf("loss scale: %g at the end; %zu of %zu steps skipped (overflow)\n", p.loss_scale(), skipped_steps, total_steps);
  if (metrics.is_open()) std::printf("metrics: %s\n", o.metrics_path.c_str());
  if (total_steps > 0) {
    const double per_step_ms = 1e3 / static_cast<double>(total_steps);
    std::printf("stages, mean per step: split %.3f ms, towers %.3f ms, reduce %.3f ms, broadcast %.3f ms\n",
                stage_totals.split * per_step_ms, stage_totals.towers * per_step_ms, stage_totals.reduce * per_step_ms,
                stage_totals.broadcast * per_step_ms);
    if (o.overlap)
      std::printf("overlap: %.1f of %zu gradient buckets a step reduced during the towers (worker %.3f ms a step), "
                  "reduce %.3f ms after them: %.0f%% of the reduction's time during the towers\n",
                  static_cast<double>(buckets_during_towers) / static_cast<double>(total_steps), buckets,
                  stage_totals.reduce_during_towers * per_step_ms, stage_totals.reduce * per_step_ms,
                  100.0 * share_during_towers(stage_totals));
    else
      std::printf("overlap: off (--no-overlap): every gradient bucket reduced after the towers\n");
  }
  run_result result;
  result.backend = p.backend_name();
  result.layout = Layout::name;
  result.overlap = o.overlap;
  result.share_during_towers = share_during_towers(stage_totals);
  result.examples_per_second = total_seconds > 0 ? static_cast<double>(total_examples) / total_seconds : 0.0;
  if (run_times.enough()) {
    result.median_ms = run_times.quantile_ms(0.5);
    result.p99_ms = run_times.quantile_ms(0.99);
  }
  const double step_seconds = std::accumulate(run_times.seconds.begin(), run_times.seconds.end(), 0.0);
  if (step_seconds > 0) result.reduce_share = (stage_totals.reduce + stage_totals.broadcast) / step_seconds;
  result.accuracy = accuracy;
  result.checksum = parameter_checksum(p);
  return result;
}

// The training on Exec's towers with the backend o.backend names: "auto", or one of the library's list
// (towerpipe::for_each_backend) that takes these towers.
template <class Exec, class Optim, class Layout>
run_result train_with(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  if (o.backend == "auto") return train<Exec, reduce::automatic, Optim, Layout>(o, data, h);
  std::optional<run_result> result;
  towerpipe::for_each_backend<Exec>([&](auto backend) {
    if (o.backend == decltype(backend)::name) result = train<Exec, decltype(backend), Optim, Layout>(o, data, h);
  });
  if (!result) throw usage_error("--backend " + o.backend + " does not take " + Exec::name + " towers");
  return *result;
}

// The training of one optimizer and layout with host or GPU towers (backend from o.backend). train.cpp
// builds it for fp32 towers, train_mixed.cpp for 16-bit ones: translation units of their own, which
// build in parallel.
template <class Optim, class Layout>
run_result train_with_backend(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
#if defined(TOWERPIPE_EXAMPLES_GPU)
  if (o.gpu_towers) return train_on_gpus<Optim, Layout>(o, data, h);
#endif
  return train_with<exec::host, Optim, Layout>(o, data, h);
}

// Explicit instantiations of `Function` (train_with_backend, train_on_gpus) for every optimizer (sgd
// also runs momentum) with `Layout`: Prefix empty where they are built, `extern` where only called.
#define TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(Prefix, Function, Layout)                                                    \
  Prefix template run_result Function<optim::sgd, Layout>(const options&, const image_dataset&,                     \
                                                          const optim::sgd::hyper_parameters&);                      \
  Prefix template run_result Function<optim::adam, Layout>(const options&, const image_dataset&,                    \
                                                           const optim::adam::hyper_parameters&);                    \
  Prefix template run_result Function<optim::adamw, Layout>(const options&, const image_dataset&,                   \
                                                            const optim::adamw::hyper_parameters&);

}  // namespace towerpipe_examples::training
