// reduce::sharded across MPI processes (run under mpirun; ctest mpi.*). Modes:
//
//   equal L      every process runs L host towers; after every step the parameters and the optimizer
//                state equal, bit for bit, those of one process with all R * L towers on the whole
//                batch (computed here on every process) — for SGD with momentum, Adam and AdamW, both
//                layouts and bf16 towers (mixed precision), even and uneven batches, unchecked steps and
//                checked ones (clipping, and a NaN skipped and named alike); a checkpoint written by R processes continues in one
//                process, and one written by one process continues in R, bitwise.
//   mismatch     the last process declares a variable of another shape: every process fails at
//                construction with the same message naming that rank, the variable and both shapes.
//   disagree     processes that stop agreeing fail together, with one message: clipping set on one
//                process only (at construction), a schedule (set_hyper) on one process only, a tower that
//                throws on rank 0 (nothing updated anywhere, the next step runs on all), a batch refused on
//                the last process, batches not cut as one process would cut them, the last process
//                resumed from an older checkpoint, or one that set other parameters after the same load.
//   stalled      the last process never joins the pipeline (it sleeps 40 s, as if stuck elsewhere): the
//                others fail with the deadline's error within seconds (3 s here) instead of hanging, and
//                name the rank nothing came from. (A process that
//                leaves through MPI_Finalize meets the same deadline, but Debian's OpenMPI 4.1.4 mpirun
//                then hangs or crashes in its own teardown in about 1 run of 10 under load, after every
//                process has reported and aborted; that would make the test flaky, not the library.)
//   fault W R…   a rank stops inside its tower during a step whose buckets are exchanged while the towers
//                run (MPI_THREAD_SERIALIZED): W "before" stops it before it marks any gradient ready, W
//                "after" once it has marked every one (its worker thread exchanges them); R… the
//                stopped ranks, comma-separated. Every other rank must fail that step within 1.5
//                deadlines (3 s here) of its start, naming exactly the stopped ranks as those nothing
//                came from, and prints "rank R: fault: reported ..." (tests/mpi/expect_fault.cmake).
//   short        2 processes; rank 1 sends rank 0 one byte of an exchange where rank 0 expects two (the
//                ranks are not making the same call): rank 0 fails naming rank 1 and both sizes, and its
//                group is broken; rank 1's next call fails naming rank 0 as the one that gave up first;
//                both print "rank R: short: all checks passed" (tests/mpi/expect_every_rank.cmake).
//
// The GPU build (sharded_equivalence_gpu.cu, TOWERPIPE_TEST_GPU_TOWERS) runs the sharded pipeline's towers
// on GPUs (reduce/sharded/device_towers_across_processes.hpp) against the same host reference: mode "equal" exchanges
// through pinned host memory over MPI (several processes may share a GPU), mode "nccl L" through NCCL
// (one GPU per process; built only where CMake found NCCL, TOWERPIPE_TEST_NCCL, else it exits with 77),
// mode "copied L" as "equal" with pipeline_options::direct_device_access off
// (the towers' buffers copied, as between devices without peer access). Without a CUDA device it exits
// with 77 (skipped). What the modes share is in sharded_equivalence.hpp; the GPU build compiles mode
// "equal" once per layout in units of their own (sharded_equivalence_gpu_<layout>.cu).
//
// Exit status 0: every check held on this process. Failures print "rank R: ..." lines.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "sharded_equivalence.hpp"
#if defined(TOWERPIPE_TEST_GPU_TOWERS) && defined(TOWERPIPE_TEST_NCCL)
#include <towerpipe/comm/nccl_over_mpi.cuh>
#endif

namespace towerpipe_mpi_test {
namespace {

// Every process must fail with the same message, which names the rank, the variable and both shapes.
void mismatch(const std::shared_ptr<process_group>& group) {
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  options.processes = group;
  const bool odd_one = rank == processes - 1;
  try {
    pipeline<sharded_exec, reduce::sharded, optim::adam, layout::flat<float>> p(model_variables(odd_one ? 9001 : 9000),
                                                                                model_inputs(), 1, {}, options);
    check(false, "a process with another variable shape was accepted");
  } catch (const towerpipe::error& e) {
    const std::string expected = "the processes differ before the first step: rank " + std::to_string(processes - 1) +
                                 " has 'variable 2: 'scale' [9001]' where rank 0 has 'variable 2: 'scale' [9000]'";
    check(std::string(e.what()).find(expected) != std::string::npos, std::string("unexpected message: ") + e.what());
    std::printf("rank %d: refused as expected: %s\n", rank, e.what());
  }
}

// Expects `f` to throw a towerpipe::error containing every one of `parts` on this process.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts, const std::string& what) {
  try {
    f();
    check(false, what + ": no error");
  } catch (const towerpipe::error& e) {
    for (const std::string& part : parts)
      check(std::string(e.what()).find(part) != std::string::npos, what + ": unexpected message: " + e.what());
    std::printf("rank %d: %s: refused as expected: %s\n", rank, what.c_str(), e.what());
  }
}

// Processes that stop agreeing, and one whose towers fail: every process fails the same step with the
// same message, nothing changes anywhere, and the next step runs on all of them.
void disagree(const std::shared_ptr<process_group>& group) {
  check(processes >= 2, "disagree needs two processes or more");
  using sharded_type = pipeline<sharded_exec, reduce::sharded, optim::adam, layout::flat<float>>;
  const bool odd_one = rank == processes - 1;
  pipeline_options options;
  options.max_grad_norm = 0.05;
  options.processes = group;
  // A setting outside the variables: clipping on one process only.
  pipeline_options clipped_differently = options;
  if (odd_one) clipped_differently.max_grad_norm = 0.5;
  expect_error([&] { sharded_type(model_variables(), model_inputs(), 1, {}, clipped_differently); },
               {"differ before the first step: rank " + std::to_string(processes - 1) + " has 'max_grad_norm: 0.5"},
               "max_grad_norm on one process");

  sharded_type p(model_variables(), model_inputs(), 1, {}, options);
  initialize(p);
  const std::size_t examples = 4 * static_cast<std::size_t>(processes);
  const auto step = [&](int number, bool fail_here = false) {
    return p.step(global_batch(number, examples).slice(4 * static_cast<std::size_t>(rank), 4), [&](auto& tower) {
      if (fail_here) throw std::runtime_error("this tower's data loader broke");
      return linear_tower(tower);
    });
  };
  step(1);
  // A schedule applied on one process only.
  optim::adam::hyper_parameters h;
  h.lr = odd_one ? 0.002 : 0.001;
  p.set_hyper(h);
  expect_error([&] { step(2); }, {"the processes differ at this step", "rank " + std::to_string(processes - 1) + " has 'optimizer: lr=0.002"}, "set_hyper on one process");
  check(p.steps_done() == 1, "the refused step changed the step count");
  p.set_hyper(optim::adam::hyper_parameters{});
  step(2);
  // One process's tower throws: every process fails that step alike, and carries on together.
  std::vector<std::vector<float>> before;
  for (std::size_t v = 0; v < p.variables().count(); ++v) before.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
  expect_error([&] { step(3, rank == 0); },
               {"step 3 failed on", "rank 0: tower 0", "this tower's data loader broke", "nothing was updated on any process"},
               "a tower that throws on rank 0");
  check(p.steps_done() == 2, "the failed step changed the step count");
  for (std::size_t v = 0; v < p.variables().count(); ++v)
    check(std::memcmp(before[v].data(), p.parameter(v).data(), before[v].size() * sizeof(float)) == 0, "the failed step changed a parameter");
  step(3);
  // A batch refused on one process (no inputs at all): every process fails that step alike.
  const auto step_on = [&](const batch& b) { return p.step(b, [](auto& tower) { return linear_tower(tower); }); };
  expect_error([&] { step_on(odd_one ? batch() : global_batch(4, examples).slice(4 * static_cast<std::size_t>(rank), 4)); },
               {"step 4: the batch was refused on", "rank " + std::to_string(processes - 1) + ": ", "nothing was updated, and no batch stays staged, on any process"},
               "a batch refused on one process");
  // Parts that are not one process's cut of the global batch: rank 0 takes 5, the last process 3.
  const std::size_t first = rank == 0 ? 0 : 4 * static_cast<std::size_t>(rank) + 1;
  const std::size_t count = rank == 0 ? 5 : odd_one ? 3 : 4;
  expect_error([&] { step_on(global_batch(4, examples).slice(first, count)); },
               {"step 4: the processes' batches are not one batch of " + std::to_string(examples), "rank 0's towers have 5 examples where the cut gives them 4"},
               "batches cut otherwise than one process would");
  check(p.steps_done() == 3, "a refused step changed the step count");
  // Resuming: the last process loads an older checkpoint than the others.
  const std::string older = "disagree_older_" + std::to_string(rank) + ".ckpt", newer = "disagree_newer_" + std::to_string(rank) + ".ckpt";
  save_checkpoint(p, older);
  step(4);
  save_checkpoint(p, newer);
  sharded_type resumed(model_variables(), model_inputs(), 1, {}, options);
  load_checkpoint(resumed, odd_one ? older : newer);
  expect_error([&] { resumed.step(global_batch(5, examples).slice(4 * static_cast<std::size_t>(rank), 4), [](auto& tower) { return linear_tower(tower); }); },
               {"the processes differ at this step", "rank " + std::to_string(processes - 1) + " has 'step: 4'"},
               "a process resumed from an older checkpoint");
  // The same step count and optimizer state but other parameters: a process that set its own after the load.
  sharded_type fresh(model_variables(), model_inputs(), 1, {}, options);
  load_checkpoint(fresh, newer);
  if (odd_one) initialize(fresh);
  expect_error([&] { fresh.step(global_batch(5, examples).slice(4 * static_cast<std::size_t>(rank), 4), [](auto& tower) { return linear_tower(tower); }); },
               {"the processes differ at this step", "parameters were set since the last step on rank(s) ", "set the same values on every process"},
               "a process that set other parameters after loading");
  std::remove(older.c_str());
  std::remove(newer.c_str());
}

// The ranks listed in `text` ("1,3").
std::vector<int> rank_list(const std::string& text) {
  std::vector<int> ranks;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    ranks.push_back(std::stoi(text.substr(at, comma - at)));
    at = comma + 1;
  }
  return ranks;
}

#if defined(TOWERPIPE_TEST_COVERAGE)
extern "C" void __gcov_dump(void);  // libgcov's
#endif

// Ends the whole job after a deadline error (MPI is in no state to finalise, so MPI_Abort), first writing
// this process's line counts where the build measures coverage (tests/coverage.sh): MPI_Abort kills the
// processes before their exit handlers would write them, and the deadline paths would count as never run.
[[noreturn]] void end_job(int status) {
#if defined(TOWERPIPE_TEST_COVERAGE)
  __gcov_dump();
#endif
  MPI_Abort(MPI_COMM_WORLD, status);
  std::abort();  // MPI_Abort does not return
}

// Mode "short": see the top. Ends the job as a program ends once its group is broken.
void short_message(const std::shared_ptr<mpi_process_group>& group) {
  check(processes == 2, "short: 2 processes");
  const auto start = std::chrono::steady_clock::now();
  const char bytes[2] = {1, 2};
  char out[4] = {};
  const auto error_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "no error";
  };
  // Each rank sends itself 2 bytes and the other rank 2, except that rank 1 sends rank 0 only 1.
  const std::vector<std::size_t> send_bytes{rank == 1 ? 1u : 2u, 2};
  const std::string exchanged =
      error_of([&] { group->all_to_all(bytes, {0, 0}, send_bytes, out, {0, 2}, {2, 2}, "exchanging"); });
  const std::string after = error_of([&] { group->all_gather(bytes, 2, "gathering after"); });
  if (rank == 0) {
    check(exchanged.find("rank 0: exchanging: rank 1 sent 1 bytes, 2 expected (the ranks are not making the same call)") !=
              std::string::npos,
          "short: rank 0's exchange: " + exchanged);
    check(after.find("rank 0: gathering after: the process group failed earlier (rank 0: exchanging: rank 1 sent 1") !=
              std::string::npos,
          "short: rank 0's next call: " + after);
  } else {
    check(exchanged == "no error", "short: rank 1's exchange: " + exchanged);
    check(after.find("rank 1 of 2: gathering after stopped: rank 0 gave up first (rank 0: exchanging: rank 1 sent 1") !=
              std::string::npos,
          "short: rank 1's next call: " + after);
  }
  std::printf("rank %d: short: %s\n", rank, failures == 0 ? "all checks passed" : "FAILED");
  std::fflush(stdout);
  std::this_thread::sleep_until(start + 2 * group->deadline());  // the other rank has printed by then
  end_job(failures == 0 ? 3 : 4);
}

// Mode "fault": see the top.
void fault(const std::shared_ptr<mpi_process_group>& group, const std::string& when, const std::vector<int>& stopped) {
  check(when == "before" || when == "after", "fault: 'before' or 'after', not '" + when + "'");
  const bool stops = std::find(stopped.begin(), stopped.end(), rank) != stopped.end();
  using sharded_type = pipeline<sharded_exec, reduce::sharded, optim::sgd, layout::flat<float>>;
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  options.processes = group;
  options.buckets.groups = {{"scale"}, {"b"}, {"w"}};  // one bucket each, marked ready in that order
  check(group->callable_from_any_thread(), "fault: MPI was not initialised with MPI_THREAD_SERIALIZED");
  sharded_type p(model_variables(), model_inputs(), 1, {}, options);
  initialize(p);
  const std::size_t examples = 4 * static_cast<std::size_t>(processes);
  const auto step = [&](int number, bool stop_here) {
    return p.step(global_batch(number, examples).slice(4 * static_cast<std::size_t>(rank), 4), [&](auto& tower) {
      if (stop_here && when == "before") std::this_thread::sleep_for(std::chrono::seconds(120));
      const double loss = linear_tower(tower);
      for (const char* name : {"scale", "b", "w"}) tower.gradient_ready(name);
      if (stop_here) std::this_thread::sleep_for(std::chrono::seconds(120));
      return loss;
    });
  };
  step(1, false);  // every rank, buckets and all
  std::string dead;
  for (int r : stopped) dead += (dead.empty() ? "" : ", ") + std::to_string(r);
  const double deadline = std::chrono::duration<double>(group->deadline()).count();
  const auto start = std::chrono::steady_clock::now();
  try {
    step(2, stops);
    check(false, "fault: step 2 completed although rank(s) " + dead + " stopped");
  } catch (const towerpipe::error& e) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string message = e.what();
    // Every "nothing came from rank(s) ..." in the message (another rank's, quoted, among them) names
    // exactly the stopped ranks.
    const std::string clause = "nothing came from rank(s) ";
    std::size_t named = 0;
    for (std::size_t at = message.find(clause); at != std::string::npos; at = message.find(clause, at + 1)) {
      const std::size_t begin = at + clause.size();
      const std::size_t end = std::min({message.find(')', begin), message.find(';', begin), message.size()});
      check(message.substr(begin, end - begin) == dead,
            "fault: the message names rank(s) " + message.substr(begin, end - begin) + ", not exactly " + dead + ": " + message);
      ++named;
    }
    check(named > 0, "fault: the message names no rank: " + message);
    check(seconds < 1.5 * deadline, "fault: reported after " + std::to_string(seconds) + " s, the deadline is " +
                                        std::to_string(deadline) + " s: " + message);
    std::printf("rank %d: fault: reported after %.2f s (deadline %.0f s): %s\n", rank, seconds, deadline, e.what());
    std::fflush(stdout);
  }
  std::printf("rank %d: fault: %s\n", rank, failures == 0 ? "all checks passed" : "FAILED");
  std::fflush(stdout);
  // Every other survivor has reported by twice the deadline (or failed its own check): then the job ends,
  // as a program ends after a deadline error (MPI is of no use after it).
  std::this_thread::sleep_until(start + 2 * group->deadline());
  end_job(failures == 0 ? 3 : 4);
}

}  // namespace
}  // namespace towerpipe_mpi_test

using namespace towerpipe_mpi_test;

int main(int argc, char** argv) {
  int threads = 0;  // SERIALIZED: reduce::sharded exchanges gradient buckets from its worker thread (comm/mpi.hpp)
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &threads);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &processes);
  std::string mode = argc > 1 ? argv[1] : "equal";
#if defined(TOWERPIPE_TEST_GPU_TOWERS)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rank %d: no CUDA device: skipped\n", rank);
    MPI_Finalize();
    return 77;
  }
#endif
  try {
    const auto mpi_group =
        std::make_shared<mpi_process_group>(MPI_COMM_WORLD, std::chrono::seconds(mode == "stalled" || mode == "fault" || mode == "short" ? 3 : 60));
    std::shared_ptr<process_group> group = mpi_group;
    if (mode == "stalled" && rank == processes - 1) {
      std::this_thread::sleep_for(std::chrono::seconds(40));
      MPI_Finalize();
      return 0;
    }
#if defined(TOWERPIPE_TEST_GPU_TOWERS)
    if (mode == "nccl") {  // the same checks with NCCL moving the device buffers (one GPU per process)
#if defined(TOWERPIPE_TEST_NCCL)
      group = nccl_process_group_over_mpi(MPI_COMM_WORLD, rank % devices);
      mode = "equal";
#else
      std::printf("rank %d: built without NCCL (TOWERPIPE_ENABLE_NCCL=OFF or NCCL not found): mode nccl skipped\n", rank);
      MPI_Finalize();
      return 77;
#endif
    } else if (mode == "copied") {  // the same, copying the towers' buffers as without peer access
      direct_device_access = false;
      mode = "equal";
    }
#endif
    if (mode == "equal") {
      const std::size_t local_towers = argc > 2 ? std::stoul(argv[2]) : 1;
      every_optimizer<layout::flat<float>>(local_towers, group);
      every_optimizer<layout::per_variable<float>>(local_towers, group);
      every_optimizer<layout::flat<bfloat16>>(local_towers, group);
    } else if (mode == "mismatch") {
      mismatch(group);
    } else if (mode == "disagree") {
      disagree(group);
    } else if (mode == "fault") {
      fault(mpi_group, argc > 2 ? argv[2] : "", rank_list(argc > 3 ? argv[3] : std::to_string(processes - 1)));
    } else if (mode == "short") {
      short_message(mpi_group);
    } else if (mode == "stalled") {
      pipeline_options options;
      options.on_nonfinite = nonfinite_policy::unchecked;
      options.processes = group;
      pipeline<sharded_exec, reduce::sharded, optim::sgd, layout::flat<float>> p(model_variables(), model_inputs(), 1, {}, options);
      check(false, "a pipeline was built although a process had left");
    } else {
      check(false, "unknown mode " + mode);
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: error: %s\n", rank, e.what());
    std::fflush(stdout);
    end_job(3);
  }
  if (failures == 0) std::printf("rank %d: all checks passed (%s)\n", rank, mode.c_str());
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
