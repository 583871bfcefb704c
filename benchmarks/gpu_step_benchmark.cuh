#pragma once
// What the GPU benchmark's units share (gpu_step_benchmark.cu: main, the floors and the order of the rows;
// gpu_step_benchmark_<backend>.cu: one backend's rows each, so that none of them takes long to compile
// alone and the build spreads over cores): the timed step and the rows of one backend, backend_rows,
// instantiated in that backend's unit only (the extern templates at the end).
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/tabulate.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <towerpipe/cuda.cuh>

#include "bench_support.hpp"

namespace towerpipe_gpu_bench {

using namespace towerpipe;
using towerpipe_bench::json_rows;
using towerpipe_bench::median;

#define BENCH_CUDA(call) TOWERPIPE_CUDA_CHECK(call)

// Gradient-like values in [-1e-3, 1e-3) from a hash of the index (thrust::tabulate fills with them), as
// T (float, or bfloat16 for the mixed-precision rows).
template <class T>
struct small_value_of_index {
  unsigned seed;
  __host__ __device__ T operator()(std::size_t i) const {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    return T((static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * 2e-3f);
  }
};

struct floors {
  double device_copy, d2h, h2d, cpu;
  std::size_t l2_bytes;
  int devices;  // visible: towers share them round-robin
};

// checked: the two passes of a checked step (kernels/screen.hpp: screen, then apply) instead of the
// single fused one; the floor adds their extra bytes (screen_bytes).
template <class Reduce, class Optim, class Layout>
void measure(const std::string& model, const variable_set& variables, std::size_t towers,
             const typename Optim::hyper_parameters& h, const towerpipe_bench::options& o, const floors& f,
             json_rows& out, bool checked = false) {
  using towers_type = exec::cuda::towers<Layout>;
  using reducer_type = typename reducer_for<exec::cuda, Reduce, Optim, Layout>::type;
  constexpr bool host_backend = std::is_same_v<Reduce, reduce::host>;
  const double parameters = static_cast<double>(variables.total_size());
  const int slots = Optim::state_slots(h);
  constexpr bool mixed = !std::is_same<typename Layout::value_type, float>::value;  // always a checked step
  constexpr double stored_bytes = sizeof(typename Layout::value_type);              // a gradient or replica element
  const double device_bytes =
      parameters * (mixed ? towerpipe_bench::mixed_bytes_per_parameter(towers, slots, stored_bytes, towers)
                          : towerpipe_bench::bytes_per_parameter(towers, slots, towers - 1) +
                                (checked ? towerpipe_bench::screen_bytes : 0));
  const std::size_t instances =
      host_backend ? 1 : std::max<std::size_t>(1, static_cast<std::size_t>(3.0 * f.l2_bytes / device_bytes) + 1);

  std::vector<std::unique_ptr<towers_type>> tower_sets;
  std::vector<std::unique_ptr<reducer_type>> reducers;
  pipeline_options options;  // reduce::sharded allocates a checked step's buffers only when told it takes them
  if (!checked) options.on_nonfinite = nonfinite_policy::unchecked;
  const detail::processes one_process(options, checked, towers, {});  // what a pipeline lends reduce::sharded
  for (std::size_t i = 0; i < instances; ++i) {
    tower_sets.push_back(std::make_unique<towers_type>(variables, towers, pipeline_options{}));
    reducers.push_back(std::make_unique<reducer_type>(detail::reducer_setup<towers_type, Optim>{variables, h, *tower_sets.back(), options, one_process}));
    for (std::size_t t = 0; t < towers; ++t) {
      for (std::size_t v = 0; v < variables.count(); ++v) {
        auto view = tower_sets.back()->gradients(t).view(v);
        detail::device_guard on(tower_sets.back()->device(t));
        thrust::tabulate(thrust::device, view.data(), view.data() + view.size(),
                         small_value_of_index<typename Layout::value_type>{static_cast<unsigned>(t * 131 + v)});
      }
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  // One whole step as the pipeline drives it (reduce/common/contract.hpp): every variable as one part.
  detail::step_work<float, Optim> work;
  work.weights.assign(towers, 1.0f / static_cast<float>(towers));
  work.checked = checked || mixed;
  work.constants = Optim::template constants<float>(h, 1);
  const std::vector<std::size_t> every_variable = detail::every_variable(variables.count());
  std::vector<double> seconds, wall_seconds;
  for (int r = 0; r < o.repetitions + 3; ++r) {
    const std::size_t i = static_cast<std::size_t>(r) % instances;
    stage_seconds stages;
    const auto start = std::chrono::steady_clock::now();
    reducers[i]->begin_step(*tower_sets[i], work);
    reducers[i]->reduce_part(*tower_sets[i], detail::step_part{every_variable, detail::no_bucket});
    reducers[i]->finish(*tower_sets[i], stages);
    if (checked) reducers[i]->apply(*tower_sets[i], 1.0f, stages);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r < 3) continue;
    wall_seconds.push_back(wall);
    seconds.push_back(host_backend ? wall : stages.reduce + stages.broadcast);
  }
  double floor_seconds = device_bytes / f.device_copy;
  const double devices_used = static_cast<double>(std::min<std::size_t>(towers, static_cast<std::size_t>(f.devices)));
  if (host_backend) {
    const double down = stored_bytes * static_cast<double>(towers) * parameters / f.d2h;
    const double up = stored_bytes * devices_used * parameters / f.h2d;
    // The CPU's pass: with 16-bit towers it also writes the rounded copy that goes up.
    const double cpu = parameters *
                       (mixed ? towerpipe_bench::mixed_bytes_per_parameter(towers, slots, stored_bytes, 1)
                              : towerpipe_bench::bytes_per_parameter(towers, slots, 0)) /
                       f.cpu;
    floor_seconds = std::max({down, up, cpu});
  }
  const double ms = median(seconds) * 1e3, floor_ms = floor_seconds * 1e3, wall_ms = median(wall_seconds) * 1e3;
  const std::string backend = std::string(Reduce::name) + (mixed ? " bf16" : checked ? " checked" : "");
  std::printf("%-10s %-9s %-6s %-12s %2zu %11.0f %9.3f %9.3f %9.3f %7.2fx\n", model.c_str(), backend.c_str(), Optim::name,
              Layout::name, towers, parameters, ms, wall_ms, floor_ms, ms / floor_ms);
  std::fflush(stdout);
  out.rows.push_back(json_rows::measurement(backend, "cuda", model, Optim::name, Layout::name, towers, variables,
                                            host_backend ? stored_bytes * (static_cast<double>(towers) + devices_used) * parameters
                                                         : device_bytes,
                                            ms, floor_ms)
                         .set("instances_rotated", static_cast<double>(instances))
                         .set("timing", host_backend ? "host wall" : "cuda events")
                         .set("wall_ms", wall_ms));
}

template <class Reduce, class Layout>
void measure_optimizers(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                        const floors& f, json_rows& out, bool adam_only) {
  optim::sgd::hyper_parameters momentum;
  momentum.momentum = 0.9;
  for (std::size_t towers : o.towers) {
    measure<Reduce, optim::adam, Layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, f, out);
    measure<Reduce, optim::adam, Layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, f, out, true);
    if (adam_only) continue;
    measure<Reduce, optim::sgd, Layout>(model, variables, towers, momentum, o, f, out);
    measure<Reduce, optim::adamw, Layout>(model, variables, towers, optim::adamw::hyper_parameters{}, o, f, out);
  }
}

// Keeps a stream busy for `cycles` SM clock cycles: one layer's backward compute in the overlap rows.
template <class = void>  // a template: defined in every backend unit without clashing at link time
__global__ void spin_for(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Overlap of the reduction with backward (plan/buckets.hpp): whole training steps whose towers compute
// a set time per gradient bucket (a spin kernel on the tower's stream) and write its gradients, last
// bucket first, against compute alone (the spins without a step), the serial step (no gradient_ready:
// every bucket after the towers) and the overlapped one (each bucket marked ready once written).
// hidden = 1 - (overlapped - compute) / (serial - compute). The compute per step is `compute_ratio`
// times the serial step's own reduction, measured first. Host wall times of whole steps.
template <class Reduce>
void measure_overlap(const std::string& model, const variable_set& variables, std::size_t towers, bool checked,
                     double compute_ratio, const towerpipe_bench::options& o, json_rows& out) {
  using trainer = pipeline<exec::cuda, Reduce, optim::adam, layout::flat<float>>;
  pipeline_options options;
  if (!checked) options.on_nonfinite = nonfinite_policy::unchecked;
  trainer p(variables, {{"x", dtype::float32, {1}}}, towers, {}, options);
  const detail::bucket_plan plan = detail::make_bucket_plan(variables, options.buckets, sizeof(float));
  for (std::size_t t = 0; t < towers; ++t) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      auto view = p.execution_space().gradients(t).view(v);
      detail::device_guard on(p.execution_space().device(t));
      thrust::tabulate(thrust::device, view.data(), view.data() + view.size(), small_value_of_index<float>{static_cast<unsigned>(t * 131 + v)});
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  int clock_khz = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const std::vector<float> x(towers, 1.0f);
  batch b;
  b.add("x", x.data(), towers, {1});
  long long cycles_per_bucket = 0;
  // A step's median host wall seconds; the towers spin cycles_per_bucket before each bucket's gradients.
  const auto steps = [&](bool mark) {
    std::vector<double> seconds;
    for (int r = 0; r < o.repetitions + 3; ++r) {
      const step_stats stats = p.step(b, [&](typename trainer::tower_context& tower) {
        for (std::size_t k = plan.count(); k-- > 0;) {  // backward: the plan's last bucket first
          if (cycles_per_bucket > 0) spin_for<><<<1, 1, 0, tower.stream()>>>(cycles_per_bucket);
          for (std::size_t v : plan.buckets[k]) tower.gradient(v);  // the values stay: only the marks matter
          if (mark) {
            for (std::size_t v : plan.buckets[k]) tower.gradient_ready(v);
          }
        }
        return 0.0;
      });
      if (r >= 3) seconds.push_back(stats.seconds);
    }
    return median(seconds);
  };
  const double reduction = steps(false);
  cycles_per_bucket = static_cast<long long>(compute_ratio * reduction / static_cast<double>(plan.count()) * clock_khz * 1e3);
  std::vector<double> compute_seconds;
  for (int r = 0; r < o.repetitions + 3; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t t = 0; t < towers; ++t) {
      detail::device_guard on(p.execution_space().device(t));
      for (std::size_t k = 0; k < plan.count(); ++k)
        spin_for<><<<1, 1, 0, p.execution_space().stream(t).get()>>>(cycles_per_bucket);
    }
    for (std::size_t t = 0; t < towers; ++t) BENCH_CUDA(cudaStreamSynchronize(p.execution_space().stream(t).get()));
    if (r >= 3) compute_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double compute = median(compute_seconds), serial = steps(false), overlapped = steps(true);
  const double hidden = 1.0 - (overlapped - compute) / (serial - compute);
  const std::string backend = std::string(Reduce::name) + (checked ? " checked" : "");
  std::printf("%-10s %-16s %2zu %5zu %9.3f %9.3f %9.3f %9.3f %8.1f%%\n", model.c_str(), backend.c_str(), towers, plan.count(),
              reduction * 1e3, compute * 1e3, serial * 1e3, overlapped * 1e3, 100.0 * hidden);
  std::fflush(stdout);
  json_rows::row row;
  row.set("kind", "overlap")
      .set("backend", backend)
      .set("exec", "cuda")
      .set("model", model)
      .set("optimizer", "adam")
      .set("layout", "flat")
      .set("towers", static_cast<double>(towers))
      .set("buckets", static_cast<double>(plan.count()))
      .set("reduction_ms", reduction * 1e3)
      .set("compute_ms", compute * 1e3)
      .set("serial_ms", serial * 1e3)
      .set("overlapped_ms", overlapped * 1e3)
      .set("hidden_fraction", hidden)
      .set("compute_ratio", compute_ratio);
  out.rows.push_back(row);
}

template <class Reduce>
void measure_overlaps(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o, json_rows& out) {
  for (std::size_t towers : o.towers) {
    for (const bool checked : {false, true}) measure_overlap<Reduce>(model, variables, towers, checked, 2.0, o, out);
  }
}

// One backend's rows, in the order main prints them; compiled in gpu_step_benchmark_<backend>.cu.
template <class Reduce>
struct backend_rows {
  // Every optimizer (Adam alone with adam_only) with layout::flat<float>, and with layout::per_variable<float>.
  static void flat(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                   const floors& f, json_rows& out, bool adam_only);
  static void per_variable(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                           const floors& f, json_rows& out, bool adam_only);
  // Mixed precision: bf16 towers, fp32 master and state (Adam, a checked step).
  static void mixed(const std::string& model, const variable_set& variables, std::size_t towers,
                    const towerpipe_bench::options& o, const floors& f, json_rows& out);
  static void overlaps(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                       json_rows& out);
};

template <class Reduce>
void backend_rows<Reduce>::flat(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                                const floors& f, json_rows& out, bool adam_only) {
  measure_optimizers<Reduce, layout::flat<float>>(model, variables, o, f, out, adam_only);
}
template <class Reduce>
void backend_rows<Reduce>::per_variable(const std::string& model, const variable_set& variables,
                                        const towerpipe_bench::options& o, const floors& f, json_rows& out, bool adam_only) {
  measure_optimizers<Reduce, layout::per_variable<float>>(model, variables, o, f, out, adam_only);
}
template <class Reduce>
void backend_rows<Reduce>::mixed(const std::string& model, const variable_set& variables, std::size_t towers,
                                 const towerpipe_bench::options& o, const floors& f, json_rows& out) {
  measure<Reduce, optim::adam, layout::flat<bfloat16>>(model, variables, towers, {}, o, f, out, true);
}
template <class Reduce>
void backend_rows<Reduce>::overlaps(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                                    json_rows& out) {
  measure_overlaps<Reduce>(model, variables, o, out);
}

extern template struct backend_rows<reduce::device0>;
extern template struct backend_rows<reduce::p2p_tree>;
extern template struct backend_rows<reduce::sharded>;
extern template struct backend_rows<reduce::host>;

}  // namespace towerpipe_gpu_bench
