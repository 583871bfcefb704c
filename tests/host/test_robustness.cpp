// Construction and calling-contract failures: each is a towerpipe::error that says what and where,
// never a hang, a crash or a pipeline left half changed.
#include <towerpipe/comm/thread_group.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::on_every_rank;

namespace {

using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

batch ones(const std::vector<float>& x) {
  batch b;
  b.add("x", x, {1});
  return b;
}

}  // namespace

// A reducer whose clean-up after a failed step fails too, as a device reducer's does after a sticky CUDA
// error (its own synchronisation reports the fault again).
namespace failing_cleanup {
struct policy {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "failing_cleanup";
};
template <class Optim, class Layout>
struct reducer : detail::host_reducer<Optim, Layout> {
  using detail::host_reducer<Optim, Layout>::host_reducer;
  void abandon(typename detail::host_reducer<Optim, Layout>::towers_type&) { detail::fail("the clean-up failed as well"); }
};
}  // namespace failing_cleanup

namespace towerpipe {
template <class Optim, class Layout>
struct reducer_for<exec::host, failing_cleanup::policy, Optim, Layout> {
  using type = failing_cleanup::reducer<Optim, Layout>;
};
}  // namespace towerpipe

TEST_CASE("a step fails with its first error when the reducer's clean-up fails too", "[robustness][pipeline]") {
  using cleanup_trainer = pipeline<exec::host, failing_cleanup::policy, optim::sgd, layout::flat<float>>;
  cleanup_trainer p({{"w", {2}}}, inputs, 2, {});
  const std::vector<float> x(4, 1.0f);
  const auto tower_1_breaks = [](cleanup_trainer::tower_context& tower) -> double {
    tower.zeroed_gradient(0);
    if (tower.tower() == 1) throw std::runtime_error("tower 1's model broke");
    return 0.0;
  };
  try {
    p.step(ones(x), tower_1_breaks);
    FAIL("the step did not fail");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CHECK(what.find("tower 1's model broke") != std::string::npos);
    CHECK(what.find("the clean-up failed as well") == std::string::npos);
  }
  CHECK(p.steps_done() == 0);
}

TEST_CASE("a pool that cannot start its threads throws instead of hanging", "[robustness][thread]") {
  // In a child process limited to one process per user (after dropping root, which ignores the limit),
  // ask for 64 threads; a hang is caught by the alarm, and reported as a failure here.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::alarm(30);
    if (::geteuid() == 0 && ::setuid(65534) != 0) ::_exit(3);
    const rlimit one{1, 1};
    if (::setrlimit(RLIMIT_NPROC, &one) != 0) ::_exit(4);
    try {
      pipeline_options options;
      options.host_threads = 64;
      trainer p({{"w", {4}}}, inputs, 2, {}, options);
      ::_exit(2);  // the limit did not bite
    } catch (const error& e) {
      ::_exit(std::string(e.what()).find("cannot start 64 host threads") != std::string::npos ? 0 : 5);
    } catch (...) {
      ::_exit(6);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  INFO("child status " << status << " (exit 2: the limit did not bite; signal: a hang or a crash)");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("many towers share the machine's cores by default, not a thread each", "[robustness][thread]") {
  trainer p({{"w", {2}}}, inputs, 2000, {});
  CHECK(p.execution_space().pool().threads() == std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<float> x(2000, 1.0f);
  const step_stats stats = p.step(ones(x), [](trainer::tower_context& tower) {
    tower.zeroed_gradient(0);
    return 1.0;
  });
  CHECK(stats.examples == 2000);
}

TEST_CASE("variable names with whitespace or control characters are rejected at declaration", "[robustness][core]") {
  variable_set variables;
  CHECK_THROWS_WITH(variables.add("conv 1", {3}), Catch::Contains("name 'conv 1' has whitespace or a control character at byte 4"));
  CHECK_THROWS_WITH(variables.add("bias\r", {3}), Catch::Contains("name 'bias\\x0d'"));
  CHECK_THROWS_WITH(variables.add("\tw", {3}), Catch::Contains("at byte 0"));
  CHECK(variables.add("layer1/conv.weight:0", {3}) == 0);
}

TEST_CASE("input specs: none, an empty name or a repeated name fail at construction", "[robustness][pipeline]") {
  const variable_set variables{{"w", {2}}};
  CHECK_THROWS_WITH(trainer(variables, {}, 2, {}), Catch::Contains("at least one input_spec"));
  CHECK_THROWS_WITH(trainer(variables, {{"", dtype::float32, {1}}}, 2, {}), Catch::Contains("input_spec #0 has an empty name"));
  CHECK_THROWS_WITH(trainer(variables, {{"x", dtype::float32, {1}}, {"y", dtype::int32, {1}}, {"x", dtype::int32, {1}}}, 2, {}),
                    Catch::Contains("input_spec #2 repeats the name 'x' of input_spec #0"));
}

TEST_CASE("a step from a second thread while one runs is an error, and the running step completes",
          "[robustness][pipeline][concurrent]") {
  trainer p({{"w", {2}}}, inputs, 2, {});
  const std::vector<float> x(4, 1.0f);
  std::atomic<bool> inside{false}, second_done{false};
  std::string second_error;
  std::thread second([&] {
    while (!inside.load()) std::this_thread::yield();
    try {
      p.step(ones(x), [](trainer::tower_context& tower) {
        tower.zeroed_gradient(0);
        return 0.0;
      });
    } catch (const error& e) {
      second_error = e.what();
    }
    second_done = true;
  });
  const step_stats first = p.step(ones(x), [&](trainer::tower_context& tower) {
    inside = true;
    while (!second_done.load()) std::this_thread::yield();
    tower.zeroed_gradient(0);
    return 0.0;
  });
  second.join();
  CHECK_THAT(second_error, Catch::Contains("pipeline::step called while another call on this pipeline runs"));
  CHECK(first.step == 1);
  CHECK(p.steps_done() == 1);
}

TEST_CASE("a tower function that calls step or set_parameter fails its step, naming the call",
          "[robustness][pipeline][concurrent]") {
  trainer p({{"w", {2}}}, inputs, 2, {});
  const std::vector<float> x(4, 1.0f), w{1.0f, 2.0f};
  CHECK_THROWS_WITH(p.step(ones(x),
                           [&](trainer::tower_context& tower) {
                             tower.zeroed_gradient(0);
                             if (tower.tower() == 1) p.set_parameter(0, w.data(), w.size());
                             return 0.0;
                           }),
                    Catch::Contains("tower 1") && Catch::Contains("pipeline::set_parameter called while another call"));
  CHECK(p.steps_done() == 0);
  CHECK(p.parameter(0)[1] == 0.0f);
  const step_stats next = p.step(ones(x), [](trainer::tower_context& tower) {
    tower.zeroed_gradient(0);
    return 0.0;
  });
  CHECK(next.step == 1);
}

TEST_CASE("step(batch, fn) from two threads at once runs whole or is refused whole: no batch stays staged",
          "[robustness][pipeline][concurrent]") {
  // Before, stage and step were two calls: a second thread between them left the first thread's batch
  // staged after its step was refused, and a later step trained on that batch's freed memory.
  trainer p({{"w", {2}}}, inputs, 2, {});
  std::atomic<int> done{0};
  const auto hammer = [&] {
    for (int i = 0; i < 300; ++i) {
      const std::vector<float> x(4, 1.0f);  // freed when this iteration ends
      try {
        p.step(ones(x), [](trainer::tower_context& tower) {
          tower.zeroed_gradient(0);
          return 0.0;
        });
        ++done;
      } catch (const error& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("called while another call on this pipeline runs"));
      }
    }
  };
  std::thread first(hammer), second(hammer);
  first.join();
  second.join();
  CHECK(p.execution_space().staged() == 0);
  CHECK(p.steps_done() == done.load());
}

TEST_CASE("a pipeline at 2^53 steps refuses to stage or step, and keeps its count", "[robustness][pipeline]") {
  trainer p({{"w", {2}}}, inputs, 2, {});
  const std::vector<float> x(4, 1.0f);
  const auto fn = [](trainer::tower_context& tower) {
    tower.zeroed_gradient(0);
    return 0.0;
  };
  p.restore_steps_done(trainer::max_steps - 1);
  p.stage(ones(x));  // the last step a pipeline counts
  CHECK_THROWS_WITH(p.stage(ones(x)), Catch::Contains("the pipeline has done 2^53 steps"));
  CHECK(p.step(fn).step == trainer::max_steps);
  CHECK_THROWS_WITH(p.step(ones(x), fn), Catch::Contains("the pipeline has done 2^53 steps"));
  CHECK(p.steps_done() == trainer::max_steps);
  CHECK(p.execution_space().staged() == 0);
}

TEST_CASE("pipeline_options::processes with a backend that does not span processes is refused at construction",
          "[robustness][pipeline]") {
  // Before, reduce::host ignored the group: under mpirun every rank trained alone and exited 0.
  pipeline_options options;
  options.processes = std::make_shared<detail::single_process>();
  CHECK_THROWS_WITH(trainer({{"w", {2}}}, inputs, 2, {}, options),
                    Catch::Contains("pipeline_options::processes is set, but reduce::host does not span processes") &&
                        Catch::Contains("use reduce::sharded"));
  CHECK_NOTHROW(pipeline<exec::host, reduce::sharded, optim::sgd, layout::flat<float>>({{"w", {2}}}, inputs, 2, {}, options));
}

namespace {

// reduce::sharded over ranks that are threads (comm/thread_group.hpp): the real exchange and the
// per-step agreements, in one process, under the sanitizers.
using sharded_trainer = pipeline<exec::host, reduce::sharded, optim::adam, layout::flat<float>>;
using one_process_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
const variable_set rank_variables{{"w", {3, 5}}, {"b", {7}}};

// A tower's gradient from its shard and the parameters alone: g_v[i] = mean_e x_e * (i + 1) + w_v[i] / 8.
template <class Context>
double shard_gradient(Context& tower) {
  const auto x = tower.template input<float>("x");
  double sum = 0;
  for (std::size_t e = 0; e < x.examples(); ++e) sum += x(e, 0);
  const double mean = sum / static_cast<double>(x.examples());
  for (std::size_t v = 0; v < tower.variables().count(); ++v) {
    const auto w = tower.parameter(v);
    const auto g = tower.gradient(v);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(mean * static_cast<double>(i + 1) + w[i] / 8.0);
  }
  return mean;
}

std::vector<float> step_inputs(int step, std::size_t examples) {
  std::vector<float> x(examples);
  for (std::size_t e = 0; e < examples; ++e) x[e] = static_cast<float>((step * 7 + static_cast<int>(e) * 3) % 11) - 5.0f;
  return x;
}

// This rank's part of the global batch x, as the pipeline cuts it (pipeline::process_part).
batch rank_part(const sharded_trainer& p, const std::vector<float>& x) {
  const batch_part part = p.process_part(x.size());
  batch b;
  b.add("x", x.data() + part.first, part.examples, {1});
  return b;
}

// What f throws as a towerpipe::error; "" where it returns.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return {};
}

// A tower of the rank tests.
double rank_tower(sharded_trainer::tower_context& tower) { return shard_gradient(tower); }

// One sharded_trainer of `towers` towers per rank over one thread group, each on a thread of its own,
// built with `options` and its rank's group; body(rank, pipeline) runs on each. Returns each rank's
// error message ("" where none).
template <class Body>
std::vector<std::string> on_every_rank_pipeline(std::size_t ranks, std::size_t towers, Body&& body,
                                                const pipeline_options& options = {}) {
  const auto group = thread_process_group::create(static_cast<int>(ranks));
  return on_every_rank(ranks, [&](std::size_t r) {
    pipeline_options with_group = options;
    with_group.processes = group[r];
    sharded_trainer p(rank_variables, inputs, towers, {}, with_group);
    body(r, p);
  });
}

}  // namespace

TEST_CASE("reduce::sharded over thread ranks equals one process with every tower, bitwise", "[robustness][sharded][ranks]") {
  for (std::size_t ranks : {std::size_t(2), std::size_t(3)}) {
    for (std::size_t towers : {std::size_t(1), std::size_t(2)}) {
      INFO(ranks << " ranks x " << towers << " towers");
      const std::size_t examples = 3 * ranks * towers + 1;  // uneven shards
      one_process_trainer single(rank_variables, inputs, ranks * towers, {});
      std::vector<std::vector<float>> expected;  // per step, every parameter end to end
      for (int step = 1; step <= 3; ++step) {
        const std::vector<float> x = step_inputs(step, examples);
        single.step(ones(x), [](one_process_trainer::tower_context& tower) { return shard_gradient(tower); });
        expected.emplace_back();
        for (std::size_t v = 0; v < rank_variables.count(); ++v)
          expected.back().insert(expected.back().end(), single.parameter(v).begin(), single.parameter(v).end());
      }
      std::vector<std::vector<std::vector<float>>> seen(ranks);
      const std::vector<std::string> errors = on_every_rank_pipeline(ranks, towers, [&](std::size_t r, sharded_trainer& p) {
        for (int step = 1; step <= 3; ++step) {
          const std::vector<float> x = step_inputs(step, examples);
          p.step(rank_part(p, x), rank_tower);
          seen[r].emplace_back();
          for (std::size_t v = 0; v < rank_variables.count(); ++v)
            seen[r].back().insert(seen[r].back().end(), p.parameter(v).begin(), p.parameter(v).end());
        }
      });
      for (std::size_t r = 0; r < ranks; ++r) {
        INFO("rank " << r);
        REQUIRE(errors[r].empty());
        for (std::size_t s = 0; s < expected.size(); ++s) CHECK(std::memcmp(seen[r][s].data(), expected[s].data(), expected[s].size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("over thread ranks, a tower that throws on one rank fails the step on every rank alike, and the next step runs",
          "[robustness][sharded][ranks]") {
  const std::size_t ranks = 3, examples = 12;
  std::vector<std::int64_t> steps(ranks);
  std::vector<std::string> failed(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, examples);
    p.step(rank_part(p, x), rank_tower);
    failed[r] = error_of([&] {
      p.step(rank_part(p, x), [&](sharded_trainer::tower_context& tower) {
        if (r == 1) throw std::runtime_error("boom");
        return shard_gradient(tower);
      });
    });
    p.step(rank_part(p, x), rank_tower);
    steps[r] = p.steps_done();
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(failed[r] == "towerpipe: step 2 failed on threads, 3 ranks (rank 1: tower 0 threw: boom); nothing was updated on any process");
    CHECK(steps[r] == 2);
  }
}

TEST_CASE("over thread ranks, a rank that stops is named by the others at the deadline", "[robustness][sharded][ranks]") {
  const std::size_t ranks = 3;
  const auto group = thread_process_group::create(static_cast<int>(ranks), std::chrono::milliseconds(300));
  const std::vector<std::string> errors = on_every_rank(ranks, [&](std::size_t r) {
    if (r == 2) return;  // never builds its pipeline
    pipeline_options options;
    options.processes = group[r];
    sharded_trainer p(rank_variables, inputs, 1, {}, options);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(errors[r], Catch::Contains("the configuration check before the first step did not complete within 0.3 s") &&
                              Catch::Contains("nothing came from rank(s) 2"));
  }
}

TEST_CASE("thread_process_group refuses ranks that make different calls or send other sizes than expected, on every rank",
          "[robustness][ranks]") {
  const auto group = thread_process_group::create(2);
  const std::vector<std::string> errors = on_every_rank(2, [&](std::size_t r) {
    std::vector<std::string> seen;
    const char bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char out[8] = {};
    const auto error_of = [&](auto&& call) {
      try {
        call();
      } catch (const error& e) {
        seen.push_back(e.what());
        return;
      }
      seen.push_back("no error");
    };
    // Different collectives in one round.
    error_of([&] { group[r]->all_gather(bytes, 4, r == 0 ? "gathering a" : "gathering b"); });
    // Rank 1 sends rank 0 three bytes where rank 0 expects two, and gives a block of 4 where rank 0 expects
    // 2: rank 0 fails, naming rank 1 (rank 1 received what it expected).
    error_of([&] { group[r]->all_to_all(bytes, {0, 4}, {r == 1 ? 3u : 2u, 2}, out, {0, 4}, {2, 2}, "exchanging"); });
    error_of([&] { group[r]->all_gather_blocks(bytes, out, {0, 4}, {2, r == 1 ? 4u : 2u}, "gathering blocks"); });
    if (seen[0].find("the ranks make different calls: rank 1 is gathering b, rank 0 is gathering a") == std::string::npos ||
        (r == 0) != (seen[1].find("rank 0: exchanging: rank 1 sent 3 bytes, 2 expected") != std::string::npos) ||
        (r == 0) != (seen[2].find("rank 0: gathering blocks: rank 1 gave 4 bytes, 2 expected") != std::string::npos))
      detail::fail("rank ", r, " saw: ", seen[0], " | ", seen[1], " | ", seen[2]);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
  }
}

TEST_CASE("over thread ranks, a batch refused on one rank fails the step on every rank alike, and the next step runs",
          "[robustness][sharded][ranks]") {
  const std::size_t ranks = 3, examples = 12;
  std::vector<std::int64_t> steps(ranks);
  std::vector<std::string> failed(ranks);
  std::vector<std::vector<float>> after(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, examples);
    p.step(rank_part(p, x), rank_tower);
    batch wrong;
    wrong.add("y", x.data(), 4, {1});  // no input "x"
    failed[r] = error_of([&] { p.step(r == 2 ? wrong : rank_part(p, x), rank_tower); });
    p.step(rank_part(p, x), rank_tower);
    steps[r] = p.steps_done();
    for (std::size_t v = 0; v < rank_variables.count(); ++v)
      after[r].insert(after[r].end(), p.parameter(v).begin(), p.parameter(v).end());
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK_THAT(failed[r], Catch::StartsWith("towerpipe: step 2: the batch was refused on threads, 3 ranks (rank 2: ") &&
                              Catch::Contains("lacks the declared input 'x'") && Catch::EndsWith("nothing was updated, and no batch stays staged, on any process"));
    CHECK(steps[r] == 2);
    CHECK(after[r] == after[0]);
  }
}

TEST_CASE("over thread ranks, batches that are not one process's cut of the global batch are refused on every rank",
          "[robustness][sharded][ranks]") {
  // The adopter's trap: a batch of 102 cut 51 + 51 for 2 ranks x 2 towers trains another model than one
  // process with 4 towers does (26/26/25/25: rank 0 needs 52, rank 1 needs 50).
  const std::size_t ranks = 2;
  std::vector<std::string> failed(ranks);
  std::vector<batch_part> parts(ranks);
  std::vector<std::int64_t> steps(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 2, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, 102);
    batch half;
    half.add("x", x.data() + 51 * r, 51, {1});
    failed[r] = error_of([&] { p.step(half, rank_tower); });
    parts[r] = p.process_part(102);
    p.step(rank_part(p, x), rank_tower);
    steps[r] = p.steps_done();
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(failed[r] ==
          "towerpipe: step 1: the processes' batches are not one batch of 102 examples cut as one process with all 4 towers "
          "would cut it: rank 0's towers have 26+25 examples where the cut gives them 26+26; stage each process's part of "
          "the global batch (pipeline::process_part(102) gives rank 0 52 examples); nothing was updated on any process");
    CHECK(steps[r] == 1);
  }
  CHECK((parts[0].first == 0 && parts[0].examples == 52));
  CHECK((parts[1].first == 52 && parts[1].examples == 50));
}

TEST_CASE("over thread ranks, a stage() refused or a step(fn) with nothing staged on one rank fails that step on every rank",
          "[robustness][sharded][ranks]") {
  // Before, the refused rank's batches were one behind the others' and trained on silently, or its
  // step(fn) failed alone while the others waited for it until the deadline.
  const std::size_t ranks = 2;
  std::vector<std::string> refused(ranks), unstaged(ranks);
  std::vector<std::int64_t> steps(ranks);
  std::vector<std::vector<float>> after(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, 8), y = step_inputs(2, 8);
    batch wrong;
    wrong.add("y", x.data(), 4, {1});
    // Rank 1's first batch is refused; rank 0 stages both: rank 0 would run x, rank 1 y.
    if (r == 1) CHECK_THROWS(p.stage(wrong));
    if (r == 0) p.stage(rank_part(p, x));
    p.stage(rank_part(p, y));
    refused[r] = error_of([&] { p.step(rank_tower); });
    // Every staged batch was dropped everywhere: rank 0 alone stages, rank 1 steps with nothing staged.
    if (r == 0) p.stage(rank_part(p, x));
    unstaged[r] = error_of([&] { p.step(rank_tower); });
    // In step again: both stage and step.
    p.stage(rank_part(p, x));
    p.step(rank_tower);
    steps[r] = p.steps_done();
    for (std::size_t v = 0; v < rank_variables.count(); ++v)
      after[r].insert(after[r].end(), p.parameter(v).begin(), p.parameter(v).end());
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(refused[r] ==
          "towerpipe: step 1: the batch was refused on threads, 2 ranks (rank 1: stage() refused a batch since the last step: "
          "batch lacks the declared input 'x'); nothing was updated, and no batch stays staged, on any process");
    CHECK(unstaged[r] ==
          "towerpipe: step 1: the batch was refused on threads, 2 ranks (rank 1: step(fn) needs a staged batch: call "
          "stage(batch) or step(batch, fn)); nothing was updated, and no batch stays staged, on any process");
    CHECK(steps[r] == 1);
    CHECK(after[r] == after[0]);
  }
}

TEST_CASE("reduce::sharded in one process drops a remainder as reduce::host does", "[robustness][sharded]") {
  pipeline_options options;
  options.split = split_policy::drop_remainder;
  sharded_trainer sharded(rank_variables, inputs, 2, {}, options);
  one_process_trainer host(rank_variables, inputs, 2, {}, options);
  const std::vector<float> x = step_inputs(1, 5);  // 5 over 2 towers: the last example is dropped
  CHECK(sharded.process_part(5).examples == 4);
  CHECK(sharded.step(ones(x), rank_tower).examples == 4);
  host.step(ones(x), [](one_process_trainer::tower_context& tower) { return shard_gradient(tower); });
  for (std::size_t v = 0; v < rank_variables.count(); ++v)
    CHECK(std::memcmp(sharded.parameter(v).data(), host.parameter(v).data(), rank_variables[v].size * sizeof(float)) == 0);
}

TEST_CASE("over thread ranks, optimizer state set on one rank only stops every rank at the next step",
          "[robustness][sharded][ranks]") {
  // As after one rank loaded another checkpoint: the parameters agree, the optimizer state does not.
  const std::size_t ranks = 2;
  std::vector<std::string> failed(ranks);
  std::vector<std::string> same_state(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, 8);
    std::vector<float> moment(7, 0.5f);
    moment[3] = r == 1 ? 0.25f : 0.5f;
    p.set_optimizer_state(0, 1, moment.data(), moment.size());
    failed[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
    moment[3] = 0.5f;  // now the same everywhere: the step runs
    p.set_optimizer_state(0, 1, moment.data(), moment.size());
    same_state[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK_THAT(failed[r], Catch::Contains("the processes differ at this step, which therefore runs on none: rank 1 has "
                                          "'optimizer state: set since the last step, digest "));
    CHECK(same_state[r].empty());
  }
}

TEST_CASE("over thread ranks, parameters set on one rank agree when every rank holds them, and else say how to recover",
          "[robustness][sharded][ranks]") {
  const std::size_t ranks = 2;
  std::vector<std::string> same(ranks), differing(ranks), retried(ranks), recovered(ranks);
  std::vector<std::vector<float>> end(ranks);
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, 8);
    p.step(rank_part(p, x), rank_tower);
    std::vector<float> w(p.parameter(0).begin(), p.parameter(0).end());
    if (r == 1) p.set_parameter(0, w.data(), w.size());  // the values every rank holds: nothing differs
    same[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
    w.assign(p.parameter(0).begin(), p.parameter(0).end());
    w[2] += 1.0f;
    if (r == 1) p.set_parameter(0, w.data(), w.size());  // one rank alone: refused, every later step too
    differing[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
    retried[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
    p.set_parameter(0, w.data(), w.size());  // the way out the message names: the same values on every rank
    recovered[r] = error_of([&] { p.step(rank_part(p, x), rank_tower); });
    end[r].assign(p.parameter(0).begin(), p.parameter(0).end());
  });
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(same[r].empty());
    for (const std::string& refused : {differing[r], retried[r]})
      CHECK_THAT(refused, Catch::Contains("the processes differ at this step, which therefore runs on none: parameters were set "
                                          "since the last step on rank(s) 1 and now differ: rank 1 has 'parameters: digest ") &&
                              Catch::Contains("set the same values on every process"));
    CHECK(recovered[r].empty());
  }
  CHECK(end[0] == end[1]);
}

TEST_CASE("over thread ranks, every rank staging the whole batch is refused naming the ranks, unless allowed",
          "[robustness][sharded][ranks]") {
  const std::size_t ranks = 3;
  for (const bool allowed : {false, true}) {
    INFO("identical_process_parts " << allowed);
    pipeline_options options;
    options.identical_process_parts = allowed;
    std::vector<std::string> whole(ranks), own(ranks);
    const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 1, [&](std::size_t r, sharded_trainer& p) {
      const std::vector<float> x = step_inputs(1, 4);
      whole[r] = error_of([&] { p.step(ones(x), rank_tower); });  // 4 examples each: a cut of 12 that passes the sizes
      own[r] = error_of([&] { p.step(rank_part(p, step_inputs(2, 12)), rank_tower); });
    }, options);
    for (std::size_t r = 0; r < ranks; ++r) {
      INFO("rank " << r);
      CHECK(errors[r].empty());
      if (allowed) {
        CHECK(whole[r].empty());
      } else {
        CHECK_THAT(whole[r], Catch::Contains("step 1: ranks 0 and 1 staged byte-identical parts of the batch") &&
                                 Catch::Contains("pipeline::process_part(12)") && Catch::Contains("identical_process_parts"));
      }
      CHECK(own[r].empty());
    }
  }
}

TEST_CASE("over thread ranks with drop_remainder, a process's batch that leaves examples out of its towers is refused",
          "[robustness][sharded][ranks]") {
  const std::size_t ranks = 2;
  std::vector<std::string> failed(ranks);
  std::vector<batch_part> parts(ranks);
  pipeline_options options;
  options.split = split_policy::drop_remainder;
  const std::vector<std::string> errors = on_every_rank_pipeline(ranks, 2, [&](std::size_t r, sharded_trainer& p) {
    const std::vector<float> x = step_inputs(1, 11);
    batch b;
    b.add("x", x.data() + 5 * r, r == 0 ? 5 : 6, {1});
    failed[r] = error_of([&] { p.step(b, rank_tower); });
    parts[r] = p.process_part(11);
  }, options);
  for (std::size_t r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK_THAT(failed[r], Catch::Contains("the batch was refused on threads, 2 ranks (rank 0: a batch of 5 examples over "
                                          "this process's 2 towers leaves 1 out"));
  }
  // 11 over 4 towers drops the last 3: rank 0 takes examples 0-3, rank 1 4-7.
  CHECK((parts[0].first == 0 && parts[0].examples == 4));
  CHECK((parts[1].first == 4 && parts[1].examples == 4));
}
