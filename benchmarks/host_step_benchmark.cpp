// The host backend's average+apply (exec::host + reduce::host) against the CPU's memory-bandwidth
// floor, measured in the same run: a STREAM-like triad on the same number of threads. Prints a table
// and writes every figure as JSON. --quick runs a small subset in seconds (CI runs it). Backend "host" is
// the single fused pass (on_nonfinite = unchecked); "host checked" the default checked step (screen,
// then apply: programs/screen.hpp), whose floor has the average's write and read on top; "host bf16" the
// mixed-precision step (bf16 towers, fp32 master and state), whose floor counts 2-byte gradients;
// "sharded" reduce::sharded in one process (unchecked; average+apply and the gather of the parameters),
// against the same floor as "host": the bytes the job needs, not the slicing's extra copies, so its
// ratio shows what sharding costs where there is nothing to spread over.

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "bench_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_bench::json_rows;
using towerpipe_bench::median;

const char* usage =
    "towerpipe_host_benchmark [--quick] [--out FILE] [--shapes-dir DIR] [--towers 1,2,4,8] [--repetitions N]\n"
    "Times exec::host + reduce::host average+apply over the ResNet-50 and BERT-base variable lists and a\n"
    "flat sweep, against a triad floor measured on the same threads.";

template <class Optim, class Layout, class Reduce = reduce::host>
void measure(const std::string& model, const variable_set& variables, std::size_t towers,
             const typename Optim::hyper_parameters& h, const towerpipe_bench::options& o, double floor_bandwidth,
             bool checked, json_rows& out) {
  using trainer = pipeline<exec::host, Reduce, Optim, Layout>;
  pipeline_options options;
  options.host_threads = std::thread::hardware_concurrency();
  if (!checked) options.on_nonfinite = nonfinite_policy::unchecked;
  using stored = typename Layout::value_type;
  constexpr bool mixed = !std::is_same<stored, float>::value;
  trainer p(variables, {{"x", dtype::float32, {1}}}, towers, h, options);
  const std::vector<float> x(towers, 1.0f);
  batch b;
  b.add("x", x.data(), towers, {1});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  // The first step draws gradients; later steps reuse them (gradient() marks them written) so that
  // only the reduction is timed.
  p.step(b, [&](typename trainer::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      for (stored& g : tower.gradient(v)) g = stored(normal(rng));
    }
    return 0.0;
  });
  std::vector<double> seconds;
  for (int r = 0; r < o.repetitions; ++r) {
    const step_stats stats = p.step(b, [&](typename trainer::tower_context& tower) {
      for (std::size_t v = 0; v < variables.count(); ++v) tower.gradient(v);
      return 0.0;
    });
    seconds.push_back(stats.stages.reduce + stats.stages.broadcast);
  }
  const double parameters = static_cast<double>(variables.total_size());
  const int slots = Optim::state_slots(h);
  const double bytes =
      parameters * (mixed ? towerpipe_bench::mixed_bytes_per_parameter(towers, slots, sizeof(stored), 1)
                          : towerpipe_bench::bytes_per_parameter(towers, slots, 0) + (checked ? towerpipe_bench::screen_bytes : 0));
  const double ms = median(seconds) * 1e3;
  const double floor_ms = bytes / floor_bandwidth * 1e3;
  const char* backend = mixed ? "host bf16" : checked ? "host checked" : Reduce::name;
  std::printf("%-10s %-13s %-6s %-12s %2zu %11.0f %9.3f %9.3f %8.1f %7.2fx\n", model.c_str(), backend, Optim::name,
              Layout::name, towers, parameters, ms, floor_ms, bytes / (ms * 1e-3) / 1e9, ms / floor_ms);
  out.rows.push_back(json_rows::measurement(backend, "host", model, Optim::name, Layout::name, towers, variables, bytes, ms,
                                            floor_ms));
}

template <class Layout>
void measure_optimizers(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                        double floor_bandwidth, json_rows& out) {
  optim::sgd::hyper_parameters momentum;
  momentum.momentum = 0.9;
  for (std::size_t towers : o.towers) {
    for (bool checked : {false, true}) {
      if (!o.quick) measure<optim::sgd, Layout>(model, variables, towers, momentum, o, floor_bandwidth, checked, out);
      measure<optim::adam, Layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, floor_bandwidth, checked, out);
      if (!o.quick)
        measure<optim::adamw, Layout>(model, variables, towers, optim::adamw::hyper_parameters{}, o, floor_bandwidth, checked,
                                      out);
    }
    measure<optim::adam, Layout, reduce::sharded>(model, variables, towers, optim::adam::hyper_parameters{}, o,
                                                  floor_bandwidth, false, out);
    // Mixed precision: bf16 towers, fp32 master and state (a checked step by construction).
    using bf16_layout = std::conditional_t<std::is_same<Layout, layout::flat<float>>::value, layout::flat<bfloat16>,
                                           layout::per_variable<bfloat16>>;
    measure<optim::adam, bf16_layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, floor_bandwidth, true, out);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  towerpipe_bench::options o = towerpipe_bench::parse_options(argc, argv, usage);
  if (o.quick) {
    o.towers = {1, 2};
    o.repetitions = std::min(o.repetitions, 5);
  }
  const std::size_t threads = std::thread::hardware_concurrency();
  const double triad = towerpipe_bench::triad_bandwidth(o.quick ? (1u << 24) : (1u << 27), threads, o.repetitions);
  std::printf("CPU triad floor: %.1f GB/s on %zu threads\n", triad / 1e9, threads);
  std::printf("%-10s %-13s %-6s %-12s %2s %11s %9s %9s %8s %8s\n", "variables", "backend", "optim", "layout", "N",
              "parameters", "ms", "floor_ms", "GB/s", "ratio");

  json_rows out;
  out.machine.set("cpu_threads", static_cast<double>(threads)).set("mode", o.quick ? "quick" : "full");
  out.floors.set("cpu_triad_bytes_per_second", triad);
  std::vector<std::pair<std::string, variable_set>> lists;
  lists.emplace_back("resnet50", towerpipe_bench::read_shapes(o.shapes_dir + "/resnet50.shapes"));
  if (!o.quick) lists.emplace_back("bert_base", towerpipe_bench::read_shapes(o.shapes_dir + "/bert_base.shapes"));
  for (std::size_t millions : o.quick ? std::vector<std::size_t>{1, 4} : std::vector<std::size_t>{1, 4, 16, 64}) {
    variable_set one;
    one.add("flat", {millions << 20});
    lists.emplace_back("sweep_" + std::to_string(millions) + "M", std::move(one));
  }
  for (const auto& [model, variables] : lists) {
    measure_optimizers<layout::flat<float>>(model, variables, o, triad, out);
    if (!o.quick) measure_optimizers<layout::per_variable<float>>(model, variables, o, triad, out);
  }
  out.write(o.out);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "towerpipe_host_benchmark: %s\n", e.what());
  return 1;
}
