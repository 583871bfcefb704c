// reduce::sharded across MPI processes with host towers (run under mpirun -np R), against the machine's
// memory-bandwidth floor and two peers measured in the same run:
//   "sharded"            R processes x L towers, reduce::sharded over an mpi_process_group (unchecked
//                        steps): contributions to the owners, canonical sum, Adam on each owner's slice,
//                        the all-gather of the new parameters;
//   "allreduce"          the way DDP and Horovod do it, written here: each process sums its towers,
//                        MPI_Allreduce of the sums, then every process applies Adam to all parameters
//                        with a full copy of the state (not bitwise equal to one process in general:
//                        MPI's reduction order is not the canonical one);
//   "one process"        rank 0 alone (the others wait) with all R * L towers and reduce::host, on every
//                        core: the same job without processes.
// Times are medians over the repetitions of each step's slowest process, whole steps on the wall clock
// (the towers do nothing), so that the agreement collectives a step takes count as well. After the timed steps the
// sharded parameters are compared with the one-process run's, bit for bit ("equal": yes/no); the exit
// status is 1 if any row differs.
//
// Floor: the bytes the step must move, over the best bandwidth of bandwidth_floor.hpp's read / copy /
// triad kernels on every core over buffers as large as the row's arrays or larger (rank 0 measures
// them while the others wait): the one-process job (N = R * L gradients read, parameters and Adam's two slots read
// and written: 4N + 24 bytes a parameter) plus the two exchanges, each of which copies (R - 1) * P
// floats from one process's memory to another's (read once and written once: 16 (R - 1) bytes a
// parameter). It leaves out what an implementation may avoid: writing a process's partial sum, the
// owner reading what arrived.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <towerpipe/comm/mpi.hpp>
#include <towerpipe/towerpipe.hpp>

#include "bandwidth_floor.hpp"
#include "bench_support.hpp"

namespace {

using namespace towerpipe;
using towerpipe_bench::json_rows;
using towerpipe_bench::median;

const char* usage =
    "mpirun -np R towerpipe_mpi_benchmark [--quick] [--out FILE] [--shapes-dir DIR] [--towers 1,2] [--repetitions N]\n"
    "Times reduce::sharded across the MPI processes (--towers: host towers per process) against the\n"
    "memory-bandwidth floor, an MPI_Allreduce + replicated Adam peer and one process with every tower.";

int rank = 0, processes = 1;
bool every_row_equal = true;

std::size_t threads_per_process() {
  return std::max<std::size_t>(1, std::thread::hardware_concurrency() / static_cast<std::size_t>(processes));
}

// A barrier whose waiting processes sleep: MPI_Barrier spins, and would take cores from rank 0 while it
// measures alone.
void sleeping_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0; MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// The slowest process's time for each repetition.
std::vector<double> slowest(const std::vector<double>& mine) {
  std::vector<double> out(mine.size());
  MPI_Allreduce(mine.data(), out.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// Global tower `tower`'s gradient: the same numbers in every run, whichever process holds the tower.
void draw_gradient(std::size_t tower, std::size_t variable, float* gradient, std::size_t count) {
  std::mt19937 rng(static_cast<unsigned>(7919 * tower + variable));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (std::size_t i = 0; i < count; ++i) gradient[i] = normal(rng);
}

// Runs 1 + repetitions steps of `p` with global towers first_tower ... (the first draws the gradients,
// the later ones reuse them so that only the reduction is timed); returns the timed steps' reduce +
// broadcast seconds.
template <class Pipeline>
std::vector<double> run_steps(Pipeline& p, const variable_set& variables, std::size_t first_tower, int repetitions) {
  const std::size_t towers = p.towers();
  const std::vector<float> x(towers, 1.0f);
  batch b;
  b.add("x", x.data(), towers, {1});
  p.step(b, [&](typename Pipeline::tower_context& tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const auto gradient = tower.gradient(v);
      draw_gradient(first_tower + tower.tower(), v, gradient.data(), gradient.size());
    }
    return 0.0;
  });
  // The whole step on the wall clock (its towers do nothing): across processes, where the waits for the
  // other ranks fall among step_stats' stages depends on the step's structure, not on its cost.
  std::vector<double> seconds;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    p.step(b, [&](typename Pipeline::tower_context& tower) {
      for (std::size_t v = 0; v < variables.count(); ++v) tower.gradient(v);
      return 0.0;
    });
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

template <class Pipeline>
std::uint64_t parameter_checksum(const Pipeline& p, const variable_set& variables) {
  std::uint64_t hash = fnv1a_basis;
  for (std::size_t v = 0; v < variables.count(); ++v) {
    const auto values = p.parameter(v);
    hash = fnv1a(values.data(), values.size() * sizeof(float), hash);
  }
  return hash;
}

// The peer: local sum, MPI_Allreduce, Adam on every parameter with a full copy of the state, on the
// process's threads. Returns each timed step's seconds.
std::vector<double> allreduce_peer(const variable_set& variables, std::size_t local_towers, int repetitions) {
  const std::size_t n = variables.total_size();
  std::vector<std::vector<float>> gradients(local_towers, std::vector<float>(n));
  for (std::size_t t = 0; t < local_towers; ++t) {
    std::size_t offset = 0;
    for (std::size_t v = 0; v < variables.count(); ++v) {
      draw_gradient(rank * local_towers + t, v, gradients[t].data() + offset, variables[v].size);
      offset += variables[v].size;
    }
  }
  std::vector<float> sum(n), parameters(n, 0.0f), m(n, 0.0f), v(n, 0.0f);
  const float weight = 1.0f / static_cast<float>(local_towers * static_cast<std::size_t>(processes));
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  const std::size_t threads = threads_per_process();
  detail::thread_pool pool(threads);
  std::vector<double> seconds;
  for (int step = 1; step <= repetitions + 1; ++step) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    pool.run(threads, [&](std::size_t thread) {
      for (std::size_t i = n * thread / threads; i < n * (thread + 1) / threads; ++i) {
        float s = 0.0f;
        for (std::size_t t = 0; t < local_towers; ++t) s += gradients[t][i];
        sum[i] = weight * s;
      }
    });
    MPI_Allreduce(MPI_IN_PLACE, sum.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const float correction1 = 1.0f - std::pow(beta1, static_cast<float>(step));
    const float correction2 = 1.0f - std::pow(beta2, static_cast<float>(step));
    pool.run(threads, [&](std::size_t thread) {
      for (std::size_t i = n * thread / threads; i < n * (thread + 1) / threads; ++i) {
        m[i] = beta1 * m[i] + (1.0f - beta1) * sum[i];
        v[i] = beta2 * v[i] + (1.0f - beta2) * sum[i] * sum[i];
        parameters[i] -= lr * (m[i] / correction1) / (std::sqrt(v[i] / correction2) + epsilon);
      }
    });
    if (step > 1) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

template <class Layout>
void measure(const std::string& model, const variable_set& variables, std::size_t local_towers,
             const towerpipe_bench::options& o, towerpipe_bench::bandwidth_floors& floors, const std::shared_ptr<process_group>& group,
             json_rows& out) {
  const std::size_t towers = local_towers * static_cast<std::size_t>(processes);
  const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};
  const optim::adam::hyper_parameters h;
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  options.host_threads = threads_per_process();
  options.processes = group;
  options.identical_process_parts = true;  // every process stages the same synthetic batch; the gradients differ

  std::vector<double> sharded_seconds;
  std::uint64_t sharded_checksum = 0;
  {
    pipeline<exec::host, reduce::sharded, optim::adam, Layout> p(variables, inputs, local_towers, h, options);
    sharded_seconds = slowest(run_steps(p, variables, rank * local_towers, o.repetitions));
    sharded_checksum = parameter_checksum(p, variables);
  }
  const std::vector<double> allreduce_seconds = slowest(allreduce_peer(variables, local_towers, o.repetitions));
  double one_process_ms = 0.0;
  bool equal = false;
  // The arrays of every process, each counted once: its towers' gradients, its copy of the parameters,
  // its slice of Adam's state, what it sends and what it receives.
  const double parameters = static_cast<double>(variables.total_size());
  const double footprint = parameters * (4.0 * static_cast<double>(towers + static_cast<std::size_t>(processes)) + 8.0 +
                                         8.0 * static_cast<double>(processes - 1));
  towerpipe_bench::bandwidth_floors::choice floor;
  if (rank == 0) {  // alone: the others sleep (the first row measures every floor)
    floor = floors.at(footprint);
    pipeline_options alone;
    alone.on_nonfinite = nonfinite_policy::unchecked;
    alone.host_threads = std::thread::hardware_concurrency();
    pipeline<exec::host, reduce::host, optim::adam, Layout> p(variables, inputs, towers, h, alone);
    one_process_ms = median(run_steps(p, variables, 0, o.repetitions)) * 1e3;
    equal = parameter_checksum(p, variables) == sharded_checksum;
    every_row_equal = every_row_equal && equal;
  }
  sleeping_barrier();
  if (rank != 0) return;

  const double bytes = parameters * (towerpipe_bench::bytes_per_parameter(towers, optim::adam::state_slots(h), 0) +
                                     16.0 * static_cast<double>(processes - 1));
  const double floor_ms = bytes / floor.bytes_per_second * 1e3;
  const double sharded_ms = median(sharded_seconds) * 1e3, allreduce_ms = median(allreduce_seconds) * 1e3;
  std::printf("%-10s %-12s %2d x %-2zu %11.0f %9.3f %9.3f %7.2fx %9.3f %7.2fx %9.3f %7.2fx %5s\n", model.c_str(),
              Layout::name, processes, local_towers, parameters, floor_ms, sharded_ms, sharded_ms / floor_ms, allreduce_ms,
              allreduce_ms / sharded_ms, one_process_ms, one_process_ms / sharded_ms, equal ? "yes" : "NO");
  json_rows::row row = json_rows::measurement("sharded", "host", model, optim::adam::name, Layout::name, towers, variables,
                                              bytes, sharded_ms, floor_ms);
  row.set("footprint_bytes", footprint)
      .set("floor_bytes_per_second", floor.bytes_per_second)
      .set("floor_kernel", floor.kernel)
      .set("floor_measured_bytes", static_cast<double>(floor.measured_bytes))
      .set("processes", static_cast<double>(processes))
      .set("towers_per_process", static_cast<double>(local_towers))
      .set("allreduce_ms", allreduce_ms)
      .set("one_process_ms", one_process_ms)
      .set("bitwise_equal_to_one_process", equal ? "yes" : "no");
  out.rows.push_back(row);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;  // SERIALIZED: reduce::sharded exchanges gradient buckets from its worker thread (comm/mpi.hpp)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &threads);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &processes);
  try {
    towerpipe_bench::options o = towerpipe_bench::parse_options(argc, argv, usage);
    if (o.quick) o.repetitions = std::min(o.repetitions, 5);
    const bool towers_given = std::find(argv, argv + argc, std::string("--towers")) != argv + argc;
    if (!towers_given) o.towers = o.quick ? std::vector<std::size_t>{1, 2} : std::vector<std::size_t>{1, 2, 4};
    const auto group = std::make_shared<mpi_process_group>(MPI_COMM_WORLD);

    // Measured by rank 0 alone (memory, not a cache, above 1 GiB; 128 MiB in --quick).
    towerpipe_bench::bandwidth_floors floors(std::thread::hardware_concurrency(), o.repetitions,
                                             o.quick ? (std::size_t{1} << 27) : (std::size_t{1} << 30));
    if (rank == 0) {
      std::printf("floor: per row, the best bandwidth of read / copy / triad kernels (non-temporal stores or not) over "
                  "buffers of the row's footprint or larger, on %zu threads; %d processes x %zu threads each\n",
                  floors.threads(), processes, threads_per_process());
      std::printf("%-10s %-12s %7s %11s %9s %9s %8s %9s %8s %9s %8s %5s\n", "variables", "layout", "R x L", "parameters",
                  "floor_ms", "sharded", "ratio", "allreduce", "vs", "1 proc", "vs", "equal");
    }
    sleeping_barrier();

    json_rows out;
    out.machine.set("cpu_threads", static_cast<double>(std::thread::hardware_concurrency()))
        .set("processes", static_cast<double>(processes))
        .set("mode", o.quick ? "quick" : "full");
    std::vector<std::pair<std::string, variable_set>> lists;
    // --quick (ctest): a small flat list only, seconds on CI's 2 cores.
    if (!o.quick) {
      lists.emplace_back("resnet50", towerpipe_bench::read_shapes(o.shapes_dir + "/resnet50.shapes"));
      lists.emplace_back("bert_base", towerpipe_bench::read_shapes(o.shapes_dir + "/bert_base.shapes"));
    }
    for (std::size_t millions : o.quick ? std::vector<std::size_t>{1} : std::vector<std::size_t>{1, 16}) {
      variable_set one;
      one.add("flat", {millions << 20});
      lists.emplace_back("sweep_" + std::to_string(millions) + "M", std::move(one));
    }
    for (const auto& [model, variables] : lists) {
      for (std::size_t local_towers : o.towers) {
        measure<layout::flat<float>>(model, variables, local_towers, o, floors, group, out);
        if (!o.quick) measure<layout::per_variable<float>>(model, variables, local_towers, o, floors, group, out);
      }
    }
    if (rank == 0) {
      towerpipe_bench::print_floors(floors, out.floors);
      out.write(o.out);
      std::printf("wrote %s\n", o.out.c_str());
      if (!every_row_equal) std::printf("FAILED: reduce::sharded differed from one process (equal: NO above)\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "towerpipe_mpi_benchmark: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return every_row_equal ? 0 : 1;
}
