// The main job: a classifier — an MLP (784-256-128-10) or the tutorial's CNN — trained on Fashion-MNIST
// by N towers through a towerpipe pipeline — GPU towers (cuBLAS, cuDNN) where the program was built with
// CUDA and a GPU is visible, host towers (OpenBLAS) otherwise — with the classic multi-tower step log,
// per-epoch test accuracy and throughput, a Chrome-trace timeline, checkpoint/resume, and a comparison
// of the reduction backends on the same training. `train --help` lists the flags. Bad flags end with a
// one-line error and exit status 2, bad files with one and exit status 1.
//
// Host towers build with the C++ compiler alone; GPU towers (train_gpu.cu) where the CUDA toolkit is.

#include <cstdio>
#include <initializer_list>
#include <vector>
#include <string>

#include "train_loop.hpp"
#if defined(TOWERPIPE_EXAMPLES_MPI)
#include <towerpipe/comm/mpi.hpp>
#endif

// The 16-bit towers' trainings are built in train_mixed.cpp.
namespace towerpipe_examples::training {
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(extern, train_with_backend, bf16_layout)
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(extern, train_with_backend, fp16_layout)
}  // namespace towerpipe_examples::training

namespace {

using namespace towerpipe_examples::training;
using towerpipe_examples::image_dataset;

const char* usage = R"(train — a classifier on Fashion-MNIST across N towers

  --model NAME          mlp (784-256-128-10) | cnn (the tutorial's: conv 5x5x64, pool, conv 5x5x64,
                        pool, fc 384, fc 192, fc 10)                             [mlp]
  --towers N            towers                                                  [2]
  --devices LIST        GPU ids, tower i on LIST[i % size]          [all visible, round-robin]
  --cpu-towers          host towers even where a GPU is visible
  --backend NAME        auto | host | sharded | device0 | p2p_tree (the last two: GPU towers);
                        auto: reduce::automatic picks one from the towers' topology and the
                        program prints which and why                            [auto]
  --time-backends N     with --backend auto: time every candidate backend N times on the first step
                        and keep the fastest (each trial's result compared bit for bit; N <= 100)
                                                                                [0: off]
  --ranks               run as one of the processes mpirun started: reduce::sharded over all of them,
                        --towers towers in each (GPU towers where visible, their exchange staged
                        through pinned host memory), --batch-size split over every process's towers
                        (mpirun -np 4 train --ranks ...; only rank 0 prints); without
                        --devices each process's GPU towers go on GPU (local rank % GPUs)
  --transport NAME      with --ranks and GPU towers: mpi (staged in pinned host memory) | nccl
                        (NCCL only moves bytes: the same bits)                  [mpi]
  --optimizer NAME      sgd | momentum (sgd, momentum 0.9) | adam | adamw       [adam]
  --layout NAME         flat | per_variable (--precision bf16: flat; fp16: per_variable)   [flat]
  --precision NAME      fp32 | bf16 | fp16: the towers' parameters and gradients. bf16, fp16: 16-bit
                        towers; the pipeline keeps an fp32 master copy (the checkpoint, the checksum),
                        fp32 optimizer state and an fp32 average, and every step is a checked one; the
                        model computes in fp32 (its parameters widened, its gradients rounded to
                        16 bits to nearest even). fp16 turns on dynamic loss scaling (from 2^16,
                        halved and the step skipped on overflow); bf16 needs none (fp32's exponent
                        range). 16-bit towers come in one layout per precision (compile time): bf16
                        flat, fp16 per_variable                                 [fp32]
  --no-overlap          reduce every gradient bucket after the towers (the serial step), instead of
                        each layer's bucket while the rest of the backward pass runs (the towers
                        mark each layer's gradients ready; one bucket a layer); the same bits
  --epochs N            passes over the training set                            [15]
  --batch-size N        examples per step, split across the towers              [128]
  --lr X                learning rate               [sgd 0.1, momentum 0.05, adam/adamw 0.001]
  --seed N              initial weights and shuffling                           [1]
  --log-every N         a progress line every N steps (rates averaged over them)  [100]
  --timeline FILE       write a Chrome trace (chrome://tracing, Perfetto) of every step
  --metrics FILE        write progress and per-epoch accuracy as CSV
  --checkpoint DIR      save DIR/towerpipe.ckpt after every epoch (DIR is created)
  --resume              continue from DIR/towerpipe.ckpt (needs --checkpoint; none there: from step 0)
                        at the epoch its data cursor names (skipped fp16 steps do not shift it)
  --data DIR            Fashion-MNIST gzipped IDX files  [/usr/share/datasets/fashion-mnist]
  --generated N         train on N GENERATED examples (Gaussian clusters) instead of Fashion-MNIST
  --compare-backends    train once per backend the towers allow (and per layout, unless --layout is
                        given; reduce::host also with --no-overlap), same seed and steps, and print
                        one table; exit 1 unless every run ends with the same parameters
  --openblas-core       print the OPENBLAS_CORETYPE this CPU needs where OpenBLAS took a kernel with
                        narrower vectors than the CPU has (AVX2 or none on a CPU with AVX-512, none
                        on a CPU with AVX2; an empty line where its kernel fits), and exit
  -h, --help            this text

Flags take their value as the next argument or after '=': --towers 4, --towers=4. Output files and
directories are checked (and created) before training starts.)";

// Digits only (no sign, no spaces), within 64 bits; zero where `zero_allowed`.
std::size_t whole_number(const std::string& flag, const std::string& value, bool zero_allowed = false) {
  const char* kind = zero_allowed ? "a whole number" : "a positive whole number";
  if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos)
    throw usage_error(flag + " needs " + kind + ", not '" + value + "'");
  unsigned long long number = 0;
  try {
    number = std::stoull(value);
  } catch (const std::exception&) {
    throw usage_error(flag + " " + value + " is too large");
  }
  if (number == 0 && !zero_allowed) throw usage_error(flag + " needs " + kind + ", not '" + value + "'");
  return static_cast<std::size_t>(number);
}
std::size_t positive(const std::string& flag, const std::string& value) { return whole_number(flag, value); }
// A file or directory name; an empty one would silently turn the output off.
std::string path_value(const std::string& flag, const std::string& value) {
  if (value.empty()) throw usage_error(flag + " needs a path, not an empty string");
  return value;
}

options parse(int argc, char** argv) {
  options o;
  const std::vector<std::string> switches{"--resume", "--cpu-towers", "--compare-backends", "--ranks", "--no-overlap"};
  const std::vector<std::string> valued{"--model", "--towers", "--devices", "--backend", "--optimizer", "--layout", "--precision", "--epochs",
                                        "--batch-size", "--log-every", "--generated", "--seed", "--timeline",
                                        "--metrics", "--checkpoint", "--data", "--lr", "--transport", "--time-backends"};
  const auto known = [](const std::vector<std::string>& flags, const std::string& flag) {
    return std::find(flags.begin(), flags.end(), flag) != flags.end();
  };
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    std::string flag = argument, value;
    const std::size_t equals = argument.find('=');
    const bool inline_value = argument.rfind("--", 0) == 0 && equals != std::string::npos;
    if (inline_value) {
      flag = argument.substr(0, equals);
      value = argument.substr(equals + 1);
    }
    if (flag == "--help" || flag == "-h") {
      std::puts(usage);
      std::exit(0);
    }
    if (flag == "--openblas-core") {  // for examples/run.sh, which sets it before the program starts
      std::puts(towerpipe_examples::better_openblas_core().c_str());
      std::exit(0);
    }
    if (!known(switches, flag) && !known(valued, flag)) throw usage_error("unknown argument " + argument + " (see --help)");
    o.given.push_back(flag);
    if (known(switches, flag)) {
      if (inline_value) throw usage_error(flag + " takes no value");
      if (flag == "--no-overlap") {
        o.overlap = false;
        continue;
      }
      (flag == "--resume"       ? o.resume
       : flag == "--cpu-towers" ? o.cpu_towers
       : flag == "--ranks"      ? o.ranks
                                : o.compare_backends) = true;
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) throw usage_error(flag + " needs a value (see --help)");
      value = argv[++i];
    }
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
    else if (flag == "--model") o.model = value;
    else if (flag == "--backend") o.backend = value;
    else if (flag == "--transport") o.transport = value;
    else if (flag == "--optimizer") o.optimizer = value;
    else if (flag == "--layout") o.layout = value;
    else if (flag == "--precision") o.precision = value;
    else if (flag == "--epochs") o.epochs = positive(flag, value);
    else if (flag == "--batch-size") o.batch_size = positive(flag, value);
    else if (flag == "--log-every") o.log_every = positive(flag, value);
    else if (flag == "--time-backends") {
      o.time_backends = positive(flag, value);
      if (o.time_backends > towerpipe::max_time_backends)
        throw usage_error("--time-backends " + value + ": at most " + std::to_string(towerpipe::max_time_backends) +
                          " (each trial reduces the first step once more with every candidate backend)");
    }
    else if (flag == "--generated") {
      o.generated = positive(flag, value);
      if (o.generated > 10000000) throw usage_error("--generated " + value + ": at most 10000000 examples (784 floats each)");
    }
    else if (flag == "--seed") o.seed = whole_number(flag, value, true);
    else if (flag == "--timeline") o.timeline_path = path_value(flag, value);
    else if (flag == "--metrics") o.metrics_path = path_value(flag, value);
    else if (flag == "--checkpoint") o.checkpoint_dir = path_value(flag, value);
    else if (flag == "--data") o.data_dir = path_value(flag, value);
    else if (flag == "--lr") {
      std::size_t used = 0;
      try {
        o.lr = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(o.lr > 0)) throw usage_error("--lr needs a positive number, not '" + value + "'");
    }
  }
  const auto one_of = [](const std::string& flag, const std::string& value, const std::vector<std::string>& allowed) {
    for (const std::string& a : allowed) {
      if (value == a) return;
    }
    std::string list;
    for (const std::string& a : allowed) list += (list.empty() ? "" : " | ") + a;
    throw usage_error(flag + " '" + value + "' is not one of " + list);
  };
#if defined(TOWERPIPE_EXAMPLES_GPU)
  o.gpu_towers = !o.cpu_towers && visible_gpus() > 0;
#endif
  one_of("--transport", o.transport, {"mpi", "nccl"});
  if (o.was_given("--transport") && !o.ranks) throw usage_error("--transport chooses how --ranks exchange: it needs --ranks");
  if (o.transport == "nccl") {
#if !defined(TOWERPIPE_EXAMPLES_NCCL)
    throw usage_error("--transport nccl needs NCCL, which this build of the program lacks");
#endif
    if (!o.gpu_towers) throw usage_error("--transport nccl moves GPU towers' gradients, and there are no GPU towers here");
  }
  if (o.ranks) {
#if !defined(TOWERPIPE_EXAMPLES_MPI)
    throw usage_error("--ranks needs MPI, which this build of the program lacks (Debian: libopenmpi-dev)");
#endif
    if (o.compare_backends) throw usage_error("--ranks runs one training: it takes no --compare-backends");
    if (o.time_backends > 0)
      throw usage_error("--ranks trains with reduce::sharded, the only backend that spans processes: --time-backends has nothing to time");
    if (!o.backend.empty() && o.backend != "sharded" && o.backend != "auto")
      throw usage_error("--ranks trains with --backend sharded (which auto picks), not " + o.backend);
  }
  if (o.compare_backends) {
    for (const char* flag : {"--backend", "--timeline", "--metrics", "--checkpoint", "--no-overlap"}) {
      if (o.was_given(flag)) throw usage_error(std::string("--compare-backends runs several trainings: it takes no ") + flag);
    }
  }
  if (o.backend.empty()) o.backend = "auto";
  if (o.time_backends > 0 && o.backend != "auto")
    throw usage_error("--time-backends times reduce::automatic's candidates: it needs --backend auto, not " + o.backend);
  one_of("--model", o.model, {"mlp", "cnn"});
  std::vector<std::string> backend_names{"auto"};
  for (const towerpipe::backend_traits& b : towerpipe::registered_backends()) backend_names.push_back(b.name);
  one_of("--backend", o.backend, backend_names);
  one_of("--optimizer", o.optimizer, {"sgd", "momentum", "adam", "adamw"});
  one_of("--layout", o.layout, {"flat", "per_variable"});
  one_of("--precision", o.precision, {"fp32", "bf16", "fp16"});
  if (const char* only = layout_of_precision(o.precision)) {
    if (o.was_given("--layout") && o.layout != only)
      throw usage_error("--precision " + o.precision + " trains layout::" + only + " towers only (16-bit towers come in one layout "
                        "per precision: bf16 flat, fp16 per_variable): use --layout " + only + ", or --precision " +
                        (o.precision == "bf16" ? "fp16" : "bf16") + " or fp32 for layout::" + o.layout);
    o.layout = only;
  }
  const char* why_no_gpu = o.cpu_towers ? "--cpu-towers was given"
#if defined(TOWERPIPE_EXAMPLES_GPU)
                                        : "no GPU is visible";
#else
                                        : "this build of the program has no CUDA";
#endif
  for (const towerpipe::backend_traits& b : towerpipe::registered_backends()) {
    if (o.backend == b.name && !b.host_towers && !o.gpu_towers) throw usage_error("--backend " + o.backend + " needs GPU towers, and " + why_no_gpu);
  }
  if (!o.devices.empty() && !o.gpu_towers) throw usage_error(std::string("--devices needs GPU towers, and ") + why_no_gpu);
#if !defined(TOWERPIPE_EXAMPLES_CUDNN)
  if (o.model == "cnn" && o.gpu_towers)
    throw usage_error("--model cnn on GPU towers needs cuDNN, which this build of the program lacks; add --cpu-towers");
#endif
  if (o.resume && o.checkpoint_dir.empty()) throw usage_error("--resume needs --checkpoint DIR");
  if (o.lr < 0) o.lr = o.optimizer == "sgd" ? 0.1 : o.optimizer == "momentum" ? 0.05 : 1e-3;
  return o;
}

// fp32 towers in either layout build here; 16-bit ones, one layout per precision, in train_mixed.cpp
// (declared extern above).
template <class Optim>
run_result with_layout(const options& o, const image_dataset& data, const typename Optim::hyper_parameters& h) {
  if (o.precision == "bf16") return train_with_backend<Optim, bf16_layout>(o, data, h);
  if (o.precision == "fp16") return train_with_backend<Optim, fp16_layout>(o, data, h);
  if (o.layout == "flat") return train_with_backend<Optim, layout::flat<float>>(o, data, h);
  return train_with_backend<Optim, layout::per_variable<float>>(o, data, h);
}

run_result dispatch(const options& o, const image_dataset& data) {
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

// --compare-backends: the same training through every backend the towers allow, then one table. The
// tutorial's finding — the CPU parameter server against GPU:0 — reproduced and measured. reduce::host
// runs also with --no-overlap: it reduces buckets while the towers run (so do every other backend where
// no buffer is copied whole, p2p_tree not with poison_gradients).
int compare_backends(const options& given, const image_dataset& data) {
  std::vector<std::string> backends;  // every backend the towers allow, in the library's order
  for (const towerpipe::backend_traits& b : towerpipe::registered_backends()) {
    if (given.gpu_towers ? b.device_towers : b.host_towers) backends.push_back(b.name);
  }
  const std::vector<std::string> layouts = given.was_given("--layout") || given.precision != "fp32"
                                              ? std::vector<std::string>{given.layout}
                                              : std::vector<std::string>{"flat", "per_variable"};
  std::vector<run_result> results;
  for (const std::string& layout : layouts) {
    for (const std::string& backend : backends) {
      for (bool overlap : backend == "host" ? std::vector<bool>{true, false} : std::vector<bool>{true}) {
        options o = given;
        o.backend = backend;
        o.layout = layout;
        o.overlap = overlap;
        std::printf("== reduce::%s, layout::%s%s ==\n", backend.c_str(), layout.c_str(), overlap ? "" : ", --no-overlap");
        std::fflush(stdout);
        results.push_back(dispatch(o, data));
      }
    }
  }
  std::printf("\ncompare: %zu %s %s towers, %s, %s, %zu epochs of batch %zu, seed %llu\n", given.towers,
              given.precision.c_str(), given.gpu_towers ? "GPU" : "host", given.model.c_str(), given.optimizer.c_str(), given.epochs,
              given.batch_size, static_cast<unsigned long long>(given.seed));
  std::printf("| backend | layout | overlap | examples/s | step median ms | step p99 ms | reduce share | reduce during towers | "
              "test accuracy | parameters checksum |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---|\n");
  bool equal = true;
  for (const run_result& r : results) {
    std::printf("| %s | %s | %s | %.0f | %.3f | %.3f | %.1f%% | %.0f%% | %.2f%% | %016llx |\n", r.backend.c_str(),
                r.layout.c_str(), r.overlap ? "on" : "off", r.examples_per_second, r.median_ms, r.p99_ms,
                100.0 * r.reduce_share, 100.0 * r.share_during_towers, r.accuracy, static_cast<unsigned long long>(r.checksum));
    equal = equal && r.checksum == results.front().checksum;
  }
  std::printf("(step times without the first %zu steps; reduce share: average + apply + broadcast after the towers over the "
              "whole step; reduce during towers: the part of the reduction's time that ran during them)\n",
              step_times::warmup);
  std::printf(equal ? "checksums: all equal\n" : "checksums: DIFFER between backends\n");
  return equal ? 0 : 1;
}

}  // namespace

// --ranks: MPI for the program's lifetime, the process group, and stdout on rank 0 only.
struct processes_scope {
  explicit processes_scope(options& o, int& argc, char**& argv) {
#if defined(TOWERPIPE_EXAMPLES_MPI)
    if (!o.ranks) return;
    int threads = 0;  // SERIALIZED: reduce::sharded exchanges gradient buckets from its worker thread (comm/mpi.hpp)
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &threads);
    active = true;
    auto group = std::make_shared<towerpipe::mpi_process_group>(MPI_COMM_WORLD);
    o.rank = group->rank();
    o.processes = group->size();
    o.group = group;
#if defined(TOWERPIPE_EXAMPLES_GPU)
    // Processes on one machine take a GPU each (NCCL refuses two ranks on one GPU; staged exchanges
    // would share it), unless --devices says otherwise.
    if (o.gpu_towers && o.devices.empty()) o.devices = {local_rank() % visible_gpus()};
#endif
#if defined(TOWERPIPE_EXAMPLES_NCCL)
    if (o.transport == "nccl") o.group = nccl_group(MPI_COMM_WORLD, o.devices.empty() ? 0 : o.devices[0]);
#endif
    if (o.rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) throw std::runtime_error("cannot silence stdout");
    if (o.processes == 1)
      std::printf("note: --ranks in a single process (not started by mpirun -np N?): training as one process\n");
#else
    (void)o, (void)argc, (void)argv;
#endif
  }
  ~processes_scope() {
#if defined(TOWERPIPE_EXAMPLES_MPI)
    if (active) MPI_Finalize();
#endif
  }
#if defined(TOWERPIPE_EXAMPLES_MPI)
  // This process's rank among those on its machine.
  static int local_rank() {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int rank = 0;
    MPI_Comm_rank(node, &rank);
    MPI_Comm_free(&node);
    return rank;
  }
#endif
  // After an error a process may have left the others inside a collective: end them all.
  void abort_all(int status) const {
#if defined(TOWERPIPE_EXAMPLES_MPI)
    if (active) MPI_Abort(MPI_COMM_WORLD, status);
#else
    (void)status;
#endif
  }
  bool active = false;
};

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come, also into a file or a pipe
  std::unique_ptr<processes_scope> processes;
  try {
    options o = parse(argc, argv);
    processes = std::make_unique<processes_scope>(o, argc, argv);
    towerpipe_examples::use_single_threaded_gemm();
    const image_dataset data = o.generated > 0
                                   ? towerpipe_examples::generate_clusters(o.generated, std::max<std::size_t>(o.generated / 5, 100),
                                                                           784, 10, o.seed)
                                   : towerpipe_examples::load_fashion_mnist(o.data_dir);
    if (o.compare_backends) return compare_backends(o, data);
    dispatch(o, data);
    return 0;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    if (processes) processes->abort_all(1);
    return 1;
  }
}
