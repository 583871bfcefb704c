// The host backend's average+apply (exec::host + reduce::host) against the CPU's memory-bandwidth
// floor, measured in the same run on the same threads: for each row the best of five streaming kernels
// (read, copy, triad; with and without non-temporal stores: bandwidth_floor.hpp) over buffers of the
// size of the row's arrays or larger, so that a pass whose arrays fit in a cache meets that cache's
// floor. Prints a table
// and writes every figure as JSON. --quick runs a small subset in seconds (CI runs it). Backend "host" is
// the single fused pass (on_nonfinite = unchecked); "host checked" the default checked step (screen,
// then apply: kernels/screen.hpp), whose floor has the average's write and read on top; "host bf16" the
// mixed-precision step (bf16 towers, fp32 master and state), whose floor counts 2-byte gradients;
// "sharded" reduce::sharded in one process (unchecked; average+apply and the gather of the parameters),
// against the same floor as "host": the bytes the job needs, not the slicing's extra copies, so its
// ratio shows what sharding costs where there is nothing to spread over.
//
// The overlap rows (--only overlap runs them alone): how much of reduce::host's reduction a step hides
// behind the towers' backward pass when the towers mark their gradients ready (gradient_ready) and each
// bucket is reduced on the pipeline's worker thread meanwhile. A synthetic tower stands in for the
// backward pass: bucket by bucket, in the order the pipeline plans them (plan/buckets.hpp: reverse
// declaration order, 25 MiB a bucket), it computes for a set time — a busy loop until its thread has
// run that many microseconds of CPU time (wall time would count as compute done the time the worker
// took the tower's core) — then takes the bucket's gradients and, where it marks, marks them ready. The
// compute is sized against the reduction measured first (reduce: no compute), compute = ratio x reduce,
// and per configuration the medians are
//   compute     the towers' stage of a step that computes and marks nothing (nothing is reduced during it);
//   serial      that step's whole time: compute, then every bucket;
//   overlapped  the whole time of a step that marks;
//   hidden      1 - (overlapped - compute) / (serial - compute): the share of the reduction gone from the
//               step (1 all of it; 0 none; below 0 the overlap cost more than it hid);
//   hideable    the parameters' share outside the last bucket, which the tower marks as it returns: at
//               most that much can hide.
// host_threads = towers, so that with fewer towers than cores the worker has a core of its own (1 tower:
// the pool is the calling thread); with a tower on every core it takes turns with them. The busy loop
// reads no memory: unlike a real backward pass it leaves all the bandwidth to the reduction.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <towerpipe/towerpipe.hpp>

#include "bandwidth_floor.hpp"
#include "bench_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_bench::json_rows;
using towerpipe_bench::median;

const char* usage =
    "towerpipe_host_benchmark [--quick] [--out FILE] [--shapes-dir DIR] [--towers 1,2,4,8] [--repetitions N]\n"
    "                         [--only reduction|overlap]\n"
    "Times exec::host + reduce::host average+apply over the ResNet-50 and BERT-base variable lists and a\n"
    "flat sweep, against the best bandwidth of streaming kernels over buffers of the row's size or\n"
    "larger, measured on the same threads (the reduction rows); and how much of\n"
    "the reduction a step hides behind a synthetic backward pass that marks its gradients ready, with 1\n"
    "tower up to a tower on every core (the overlap rows).";

// The first step's gradients: normal values from a generator of the tower's own (towers run on several
// threads). Later steps reuse them (gradient() marks them written), so that only the reduction is timed.
template <class Context>
void draw_gradients(Context& tower) {
  std::mt19937 rng(static_cast<unsigned>(7 + tower.tower()));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (std::size_t v = 0; v < tower.variables().count(); ++v) {
    for (auto& g : tower.gradient(v)) g = std::remove_reference_t<decltype(g)>(normal(rng));
  }
}

template <class Optim, class Layout, class Reduce = reduce::host>
void measure(const std::string& model, const variable_set& variables, std::size_t towers,
             const typename Optim::hyper_parameters& h, const towerpipe_bench::options& o,
             towerpipe_bench::bandwidth_floors& floors, bool checked, json_rows& out) {
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
  p.step(b, [&](typename trainer::tower_context& tower) {
    draw_gradients(tower);
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
  // The arrays the pass goes through, each counted once: the floor is measured over as many bytes or more.
  const double footprint =
      parameters * (static_cast<double>(sizeof(stored)) * static_cast<double>(towers + (mixed ? 1 : 0)) + 4.0 + 4.0 * slots +
                    (checked ? 4.0 : 0.0));
  const towerpipe_bench::bandwidth_floors::choice floor = floors.at(footprint);
  const double ms = median(seconds) * 1e3;
  const double floor_ms = bytes / floor.bytes_per_second * 1e3;
  const char* backend = mixed ? "host bf16" : checked ? "host checked" : Reduce::name;
  std::printf("%-10s %-13s %-6s %-12s %2zu %11.0f %9.3f %9.3f %8.1f %7.2fx %8.1f %s\n", model.c_str(), backend, Optim::name,
              Layout::name, towers, parameters, ms, floor_ms, bytes / (ms * 1e-3) / 1e9, ms / floor_ms,
              floor.bytes_per_second / 1e9, floor.kernel.c_str());
  json_rows::row row = json_rows::measurement(backend, "host", model, Optim::name, Layout::name, towers, variables, bytes,
                                              ms, floor_ms);
  row.set("footprint_bytes", footprint).set("floor_bytes_per_second", floor.bytes_per_second).set("floor_kernel", floor.kernel)
      .set("floor_measured_bytes", static_cast<double>(floor.measured_bytes));
  out.rows.push_back(row);
}

template <class Layout>
void measure_optimizers(const std::string& model, const variable_set& variables, const towerpipe_bench::options& o,
                        towerpipe_bench::bandwidth_floors& floors, json_rows& out) {
  optim::sgd::hyper_parameters momentum;
  momentum.momentum = 0.9;
  for (std::size_t towers : o.towers) {
    for (bool checked : {false, true}) {
      if (!o.quick) measure<optim::sgd, Layout>(model, variables, towers, momentum, o, floors, checked, out);
      measure<optim::adam, Layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, floors, checked, out);
      if (!o.quick)
        measure<optim::adamw, Layout>(model, variables, towers, optim::adamw::hyper_parameters{}, o, floors, checked,
                                      out);
    }
    measure<optim::adam, Layout, reduce::sharded>(model, variables, towers, optim::adam::hyper_parameters{}, o,
                                                  floors, false, out);
    // Mixed precision: bf16 towers, fp32 master and state (a checked step by construction).
    using bf16_layout = std::conditional_t<std::is_same<Layout, layout::flat<float>>::value, layout::flat<bfloat16>,
                                           layout::per_variable<bfloat16>>;
    measure<optim::adam, bf16_layout>(model, variables, towers, optim::adam::hyper_parameters{}, o, floors, true, out);
  }
}

// The calling thread's CPU time in microseconds.
double thread_cpu_microseconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) * 1e-3;
}

// Busy until the calling thread has run `microseconds` of CPU time: compute that a thread taking the
// core from it delays, as it would delay a real backward pass.
void compute_for(double microseconds) {
  const double until = thread_cpu_microseconds() + microseconds;
  while (thread_cpu_microseconds() < until) {
  }
}

// One overlap row (see the top): Adam, layout flat, `towers` towers on as many threads, compute =
// `ratio` x the reduction.
void measure_overlap(const std::string& model, const variable_set& variables, std::size_t towers, bool checked,
                     double ratio, int repetitions, json_rows& out) {
  using trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
  pipeline_options options;
  options.host_threads = towers;
  if (!checked) options.on_nonfinite = nonfinite_policy::unchecked;
  trainer p(variables, {{"x", dtype::float32, {1}}}, towers, optim::adam::hyper_parameters{}, options);
  const detail::bucket_plan plan = detail::make_bucket_plan(variables, options.buckets, sizeof(float));
  const std::vector<float> x(towers, 1.0f);
  batch b;
  b.add("x", x.data(), towers, {1});
  p.step(b, [&](trainer::tower_context& tower) {
    draw_gradients(tower);
    return 0.0;
  });
  double compute_per_bucket_us = 0;
  bool mark = false;
  const auto backward = [&](trainer::tower_context& tower) {
    for (const std::vector<std::size_t>& bucket : plan.buckets) {
      compute_for(compute_per_bucket_us);
      for (std::size_t v : bucket) {
        tower.gradient(v);
        if (mark) tower.gradient_ready(v);
      }
    }
    return 0.0;
  };
  std::vector<double> reduce, compute, serial, overlapped, worker;
  double buckets_during_towers = 0;
  for (int r = 0; r < repetitions; ++r) {
    const step_stats stats = p.step(b, backward);
    reduce.push_back(stats.stages.reduce + stats.stages.broadcast);
  }
  compute_per_bucket_us = ratio * median(reduce) * 1e6 / static_cast<double>(plan.count());
  // Serial and overlapped steps in turns, so that a drift of the machine's speed reaches both alike.
  for (int r = 0; r < repetitions; ++r) {
    mark = false;
    const step_stats plain = p.step(b, backward);
    compute.push_back(plain.stages.towers);
    serial.push_back(plain.seconds);
    mark = true;
    const step_stats marked = p.step(b, backward);
    overlapped.push_back(marked.seconds);
    worker.push_back(marked.stages.reduce_during_towers);
    buckets_during_towers += static_cast<double>(marked.buckets_during_towers) / repetitions;
  }
  const double reduce_ms = median(reduce) * 1e3, compute_ms = median(compute) * 1e3, serial_ms = median(serial) * 1e3;
  const double overlapped_ms = median(overlapped) * 1e3, worker_ms = median(worker) * 1e3;
  const double hidden = 1.0 - (overlapped_ms - compute_ms) / (serial_ms - compute_ms);
  std::size_t last_bucket = 0;
  for (std::size_t v : plan.buckets.back()) last_bucket += variables[v].size;
  const double hideable = 1.0 - static_cast<double>(last_bucket) / static_cast<double>(variables.total_size());
  const char* backend = checked ? "host checked" : "host";
  std::printf("%-10s %-13s %2zu %7zu %7.1f %4.0fx %9.2f %9.2f %9.2f %9.2f %9.2f %6.1f %6.0f%% %7.0f%%\n", model.c_str(),
              backend, towers, plan.count(), buckets_during_towers, ratio, reduce_ms, compute_ms, serial_ms, overlapped_ms,
              worker_ms, compute_per_bucket_us / 1e3, 100.0 * hidden, 100.0 * hideable);
  json_rows::row row;
  row.set("kind", "overlap")
      .set("backend", backend)
      .set("exec", "host")
      .set("model", model)
      .set("optimizer", optim::adam::name)
      .set("layout", layout::flat<float>::name)
      .set("towers", static_cast<double>(towers))
      .set("host_threads", static_cast<double>(towers))
      .set("parameters", static_cast<double>(variables.total_size()))
      .set("tensors", static_cast<double>(variables.count()))
      .set("buckets", static_cast<double>(plan.count()))
      .set("buckets_during_towers", buckets_during_towers)
      .set("compute_ratio", ratio)
      .set("compute_per_bucket_ms", compute_per_bucket_us / 1e3)
      .set("reduce_ms", reduce_ms)
      .set("compute_ms", compute_ms)
      .set("serial_ms", serial_ms)
      .set("overlapped_ms", overlapped_ms)
      .set("worker_ms", worker_ms)
      .set("hidden_fraction", hidden)
      .set("hideable_fraction", hideable);
  out.rows.push_back(row);
}

// The overlap rows: ResNet-50 and, but in --quick, BERT-base; the tower counts asked for up to one a
// core (more would take turns computing); unchecked and checked steps; compute 2x and, but in --quick,
// 1x the reduction; at most 10 steps of each kind a row (3 in --quick).
void measure_overlaps(const towerpipe_bench::options& o, std::size_t cores, json_rows& out) {
  std::printf("\noverlap: a synthetic backward pass computing bucket by bucket, marking each bucket ready; %zu cores\n",
              cores);
  std::printf("%-10s %-13s %2s %7s %7s %5s %9s %9s %9s %9s %9s %6s %7s %8s\n", "variables", "backend", "N", "buckets",
              "during", "ratio", "reduce", "compute", "serial", "overlap", "worker", "b. ms", "hidden", "hideable");
  std::vector<std::string> models{"resnet50"};
  if (!o.quick) models.push_back("bert_base");
  for (const std::string& model : models) {
    const variable_set variables = towerpipe_bench::read_shapes(o.shapes_dir + "/" + model + ".shapes");
    for (std::size_t towers : o.towers) {
      if (towers > cores) continue;
      for (bool checked : {false, true}) {
        for (double ratio : o.quick ? std::vector<double>{2} : std::vector<double>{2, 1})
          measure_overlap(model, variables, towers, checked, ratio, std::min(o.repetitions, o.quick ? 3 : 10), out);
      }
    }
  }
  std::printf("(ms, medians; during: buckets a step reduced during the towers; worker: the worker's time on them; b. ms: "
              "compute per bucket; hidden: 1 - (overlap - compute) / (serial - compute); hideable: the parameters outside "
              "the last bucket)\n");
}

}  // namespace

int main(int argc, char** argv) try {
  towerpipe_bench::options o = towerpipe_bench::parse_options(argc, argv, usage, {"reduction", "overlap"});
  if (o.quick) {
    o.towers = {1, 2};
    o.repetitions = std::min(o.repetitions, 5);
  }
  const std::size_t threads = std::thread::hardware_concurrency();
  // The floors' ladder of sizes ends at 1 GiB (128 MiB in --quick), memory rather than a cache:
  // larger footprints get its figure.
  towerpipe_bench::bandwidth_floors floors(threads, o.repetitions, o.quick ? (std::size_t{1} << 27) : (std::size_t{1} << 30));

  json_rows out;
  out.machine.set("cpu_threads", static_cast<double>(threads)).set("mode", o.quick ? "quick" : "full");
  if (o.only != "overlap") {
    std::printf("floor: per row, the best bandwidth of read / copy / triad kernels (non-temporal stores or not) over buffers "
                "of the row's footprint or larger, on %zu threads\n",
                threads);
    std::printf("%-10s %-13s %-6s %-12s %2s %11s %9s %9s %8s %8s %8s %s\n", "variables", "backend", "optim", "layout", "N",
                "parameters", "ms", "floor_ms", "GB/s", "ratio", "floor GB/s", "floor kernel");
    std::vector<std::pair<std::string, variable_set>> lists;
    lists.emplace_back("resnet50", towerpipe_bench::read_shapes(o.shapes_dir + "/resnet50.shapes"));
    if (!o.quick) lists.emplace_back("bert_base", towerpipe_bench::read_shapes(o.shapes_dir + "/bert_base.shapes"));
    for (std::size_t millions : o.quick ? std::vector<std::size_t>{1, 4} : std::vector<std::size_t>{1, 4, 16, 64}) {
      variable_set one;
      one.add("flat", {millions << 20});
      lists.emplace_back("sweep_" + std::to_string(millions) + "M", std::move(one));
    }
    for (const auto& [model, variables] : lists) {
      measure_optimizers<layout::flat<float>>(model, variables, o, floors, out);
      if (!o.quick) measure_optimizers<layout::per_variable<float>>(model, variables, o, floors, out);
    }
  }
  if (o.only != "overlap") towerpipe_bench::print_floors(floors, out.floors);
  if (o.only != "reduction") measure_overlaps(o, threads, out);
  out.write(o.out);
  std::printf("wrote %s\n", o.out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "towerpipe_host_benchmark: %s\n", e.what());
  return 1;
}
