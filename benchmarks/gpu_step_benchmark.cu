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
//
// This unit: main, the floors and the order of the rows; each backend's rows are compiled in a unit of
// their own (gpu_step_benchmark_<backend>.cu, with what they share in gpu_step_benchmark.cuh).

#include <functional>
#include <thread>

#include "bandwidth_floor.hpp"
#include "gpu_step_benchmark.cuh"

namespace {

using namespace towerpipe_gpu_bench;

const char* usage =
    "towerpipe_gpu_benchmark [--quick] [--out FILE] [--shapes-dir DIR] [--towers 1,2,4,8] [--repetitions N]\n"
    "Times every GPU-tower backend's average+apply+broadcast against the device copy and PCIe floors.\n"
    "--quick: ResNet-50 only, Adam, towers 2 and 4.";

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
    backend_rows<reduce::device0>::flat(model, variables, o, f, out, o.quick);
    backend_rows<reduce::device0>::per_variable(model, variables, o, f, out, o.quick);
    for (std::size_t towers : o.towers) {  // mixed precision: bf16 towers, fp32 master and state, on every backend
      backend_rows<reduce::device0>::mixed(model, variables, towers, o, f, out);
      backend_rows<reduce::p2p_tree>::mixed(model, variables, towers, o, f, out);
      backend_rows<reduce::sharded>::mixed(model, variables, towers, o, f, out);
      backend_rows<reduce::host>::mixed(model, variables, towers, o, f, out);
    }
    backend_rows<reduce::p2p_tree>::flat(model, variables, o, f, out, o.quick);
    backend_rows<reduce::p2p_tree>::per_variable(model, variables, o, f, out, o.quick);
    backend_rows<reduce::sharded>::flat(model, variables, o, f, out, o.quick);
    backend_rows<reduce::sharded>::per_variable(model, variables, o, f, out, true);
    backend_rows<reduce::host>::flat(model, variables, o, f, out, true);
    backend_rows<reduce::host>::per_variable(model, variables, o, f, out, true);
  }
  std::printf("\noverlap with backward (compute per step = 2x the serial reduction; whole steps, host wall ms)\n");
  std::printf("%-10s %-16s %2s %5s %9s %9s %9s %9s %9s\n", "variables", "backend", "N", "bkts", "reduce", "compute", "serial",
              "overlap", "hidden");
  for (const std::string& model : models) {
    const variable_set variables = towerpipe_bench::read_shapes(o.shapes_dir + "/" + model + ".shapes");
    backend_rows<reduce::device0>::overlaps(model, variables, o, out);
    backend_rows<reduce::host>::overlaps(model, variables, o, out);
    backend_rows<reduce::p2p_tree>::overlaps(model, variables, o, out);
    backend_rows<reduce::sharded>::overlaps(model, variables, o, out);
  }
  if (!o.quick) {
    for (std::size_t millions : {1, 4, 16, 64, 256}) {
      variable_set one;
      one.add("flat", {millions << 20});
      const std::string name = "sweep_" + std::to_string(millions) + "M";
      backend_rows<reduce::device0>::flat(name, one, o, f, out, true);
      backend_rows<reduce::p2p_tree>::flat(name, one, o, f, out, true);
      backend_rows<reduce::sharded>::flat(name, one, o, f, out, true);
    }
  }
  out.write(o.out);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "towerpipe_gpu_benchmark: %s\n", e.what());
  return 1;
}
