// average + apply + broadcast for every backend with GPU towers — reduce::device0, reduce::p2p_tree,
// reduce::sharded (the optimizer sharded over the towers: on one GPU it moves device0's bytes, so it
// has device0's floor), reduce::host — x layout x optimizer x towers, over the ResNet-50 and BERT-base variable lists and a
// flat sweep, against floors measured in the same run:
//   device backends: bytes / device copy bandwidth (a large cudaMemcpy, bytes read + written), with
//     P * (4N + 8 + 8 * state slots + 4(N - 1)) bytes (Adam: 4N + 24 + 4(N - 1));
//   reduce::host: max(PCIe down: 4N*P bytes over pinned copies, PCIe up: 4D*P bytes for D devices
//     (towers sharing a device share an upload), CPU floor: the host pass's bytes over the best of
//     bandwidth_floor.hpp's read / copy / triad kernels on the host threads, over 1 GiB of memory);
//     the two directions overlap.
// Each figure is a median over repetitions after warm-up. Device backends: CUDA event time of the whole
// reduction as the backend reports it (stage_seconds reduce + broadcast: from the gradients being ready
// to the last replica written, kernel launches included), which is how the PyTorch anchors time their
// methods; reduce::host: host wall time, as the anchors time the CPU parameter server. The host wall
// time of every call (what a training step pays, the final wait included) is in the JSON as wall_ms.
// Towers share the device(s) round-robin. Problems smaller than 3x the L2 cache rotate over several
// independent instances. Then the overlap rows: whole steps whose towers compute a set time per gradient
// bucket, serial against overlapped with backward (measure_overlap).

#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/tabulate.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <towerpipe/cuda.cuh>

#include "bandwidth_floor.hpp"
#include "bench_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_bench::json_rows;
using towerpipe_bench::median;

const char* usage =
    "towerpipe_gpu_benchmark [--quick] [--out FILE] [--shapes-dir DIR] [--towers 1,2,4,8] [--repetitions N]\n"
    "Times every GPU-tower backend's average+apply+broadcast against the device copy and PCIe floors.\n"
    "--quick: ResNet-50 only, Adam, towers 2 and 4.";

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

double elapsed_median(const std::function<void(cudaStream_t)>& work, int repetitions) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, end;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&end));
  std::vector<double> seconds;
  for (int r = 0; r < repetitions + 2; ++r) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    work(stream);
    BENCH_CUDA(cudaEventRecord(end, stream));
    BENCH_CUDA(cudaEventSynchronize(end));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, end));
    if (r >= 2) seconds.push_back(ms * 1e-3);
  }
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(end));
  BENCH_CUDA(cudaStreamDestroy(stream));
  return median(seconds);
}

// Bytes read + written per second by a device-to-device copy of `bytes`.
double device_copy_bandwidth(std::size_t bytes) {
  const auto a = cuda_device_memory{0}.allocate<char>(bytes, 256), b = cuda_device_memory{0}.allocate<char>(bytes, 256);
  return 2.0 * static_cast<double>(bytes) /
         elapsed_median([&](cudaStream_t s) { BENCH_CUDA(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s)); }, 10);
}

double pinned_bandwidth(std::size_t bytes, cudaMemcpyKind kind) {
  const auto device = cuda_device_memory{0}.allocate<char>(bytes, 256);
  const auto host = cuda_pinned_memory{}.allocate<char>(bytes);
  return static_cast<double>(bytes) / elapsed_median([&](cudaStream_t s) {
           if (kind == cudaMemcpyDeviceToHost) BENCH_CUDA(cudaMemcpyAsync(host.get(), device.get(), bytes, kind, s));
           else BENCH_CUDA(cudaMemcpyAsync(device.get(), host.get(), bytes, kind, s));
         }, 5);
}

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
          if (cycles_per_bucket > 0) spin_for<<<1, 1, 0, tower.stream()>>>(cycles_per_bucket);
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
        spin_for<<<1, 1, 0, p.execution_space().stream(t).get()>>>(cycles_per_bucket);
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

}  // namespace

int main(int argc, char** argv) try {
  towerpipe_bench::options o = towerpipe_bench::parse_options(argc, argv, usage);
  if (o.quick) o.towers = {2, 4};
  if (detail::cuda_device_count() == 0) {
    std::puts("towerpipe_gpu_benchmark: no CUDA device; nothing measured");
    return 77;
  }
  cudaDeviceProp properties{};
  BENCH_CUDA(cudaGetDeviceProperties(&properties, 0));
  int sm_clock = 0, memory_clock = 0, driver = 0, runtime = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&sm_clock, cudaDevAttrClockRate, 0));
  BENCH_CUDA(cudaDeviceGetAttribute(&memory_clock, cudaDevAttrMemoryClockRate, 0));
  BENCH_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
  const std::size_t threads = std::thread::hardware_concurrency();
  floors f{device_copy_bandwidth(std::size_t(1) << 30), pinned_bandwidth(std::size_t(1) << 28, cudaMemcpyDeviceToHost),
           pinned_bandwidth(std::size_t(1) << 28, cudaMemcpyHostToDevice), towerpipe_bench::measure_bandwidth(std::size_t(1) << 30, threads, 5).best().bytes_per_second,
           static_cast<std::size_t>(properties.l2CacheSize), detail::cuda_device_count()};
  std::printf("%s: copy %.2f TB/s, pinned D2H %.1f GB/s, H2D %.1f GB/s, CPU %.1f GB/s (%zu threads)\n",
              properties.name, f.device_copy / 1e12, f.d2h / 1e9, f.h2d / 1e9, f.cpu / 1e9, threads);
  std::printf("%-10s %-9s %-6s %-12s %2s %11s %9s %9s %9s %8s\n", "variables", "backend", "optim", "layout", "N",
              "parameters", "ms", "wall_ms", "floor_ms", "ratio");

  json_rows out;
  out.machine.set("gpu", properties.name)
      .set("gpus_visible", static_cast<double>(detail::cuda_device_count()))
      .set("sm_clock_khz", sm_clock)
      .set("memory_clock_khz", memory_clock)
      .set("driver_version", driver)
      .set("runtime_version", runtime)
      .set("l2_bytes", static_cast<double>(f.l2_bytes))
      .set("cpu_threads", static_cast<double>(threads))
      .set("mode", o.quick ? "quick" : "full");
  out.floors.set("device_copy_bytes_per_second", f.device_copy)
      .set("pinned_d2h_bytes_per_second", f.d2h)
      .set("pinned_h2d_bytes_per_second", f.h2d)
      .set("cpu_best_bytes_per_second", f.cpu);

  std::vector<std::string> models{"resnet50"};
  if (!o.quick) models.push_back("bert_base");
  for (const std::string& model : models) {
    const variable_set variables = towerpipe_bench::read_shapes(o.shapes_dir + "/" + model + ".shapes");
    measure_optimizers<reduce::device0, layout::flat<float>>(model, variables, o, f, out, o.quick);
    measure_optimizers<reduce::device0, layout::per_variable<float>>(model, variables, o, f, out, o.quick);
    for (std::size_t towers : o.towers) {  // mixed precision: bf16 towers, fp32 master and state, on every backend
      measure<reduce::device0, optim::adam, layout::flat<bfloat16>>(model, variables, towers, {}, o, f, out, true);
      measure<reduce::p2p_tree, optim::adam, layout::flat<bfloat16>>(model, variables, towers, {}, o, f, out, true);
      measure<reduce::sharded, optim::adam, layout::flat<bfloat16>>(model, variables, towers, {}, o, f, out, true);
      measure<reduce::host, optim::adam, layout::flat<bfloat16>>(model, variables, towers, {}, o, f, out, true);
    }
    measure_optimizers<reduce::p2p_tree, layout::flat<float>>(model, variables, o, f, out, o.quick);
    measure_optimizers<reduce::p2p_tree, layout::per_variable<float>>(model, variables, o, f, out, o.quick);
    measure_optimizers<reduce::sharded, layout::flat<float>>(model, variables, o, f, out, o.quick);
    measure_optimizers<reduce::sharded, layout::per_variable<float>>(model, variables, o, f, out, true);
    measure_optimizers<reduce::host, layout::flat<float>>(model, variables, o, f, out, true);
    measure_optimizers<reduce::host, layout::per_variable<float>>(model, variables, o, f, out, true);
  }
  std::printf("\noverlap with backward (compute per step = 2x the serial reduction; whole steps, host wall ms)\n");
  std::printf("%-10s %-16s %2s %5s %9s %9s %9s %9s %9s\n", "variables", "backend", "N", "bkts", "reduce", "compute", "serial",
              "overlap", "hidden");
  for (const std::string& model : models) {
    const variable_set variables = towerpipe_bench::read_shapes(o.shapes_dir + "/" + model + ".shapes");
    measure_overlaps<reduce::device0>(model, variables, o, out);
    measure_overlaps<reduce::host>(model, variables, o, out);
    measure_overlaps<reduce::p2p_tree>(model, variables, o, out);
    measure_overlaps<reduce::sharded>(model, variables, o, out);
  }
  if (!o.quick) {
    for (std::size_t millions : {1, 4, 16, 64, 256}) {
      variable_set one;
      one.add("flat", {millions << 20});
      const std::string name = "sweep_" + std::to_string(millions) + "M";
      measure_optimizers<reduce::device0, layout::flat<float>>(name, one, o, f, out, true);
      measure_optimizers<reduce::p2p_tree, layout::flat<float>>(name, one, o, f, out, true);
      measure_optimizers<reduce::sharded, layout::flat<float>>(name, one, o, f, out, true);
    }
  }
  out.write(o.out);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "towerpipe_gpu_benchmark: %s\n", e.what());
  return 1;
}
