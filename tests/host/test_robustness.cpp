// Construction and calling-contract failures: each is a towerpipe::error that says what and where,
// never a hang, a crash or a pipeline left half changed.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>

using namespace towerpipe;

namespace {

using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

batch ones(const std::vector<float>& x) {
  batch b;
  b.add("x", x, {1});
  return b;
}

}  // namespace

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

namespace {

// A process group of one process: enough to hand a pipeline pipeline_options::processes.
class one_process final : public process_group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one process"; }
  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char*) override {
    return {std::string(static_cast<const char*>(data), bytes)};
  }
  void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                  char* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>&, const char*) override {
    std::copy_n(send + send_offsets[0], send_bytes[0], recv + recv_offsets[0]);
  }
  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char*) override {
    std::copy_n(mine, block_bytes[0], out + block_offsets[0]);
  }
};

}  // namespace

TEST_CASE("pipeline_options::processes with a backend that does not span processes is refused at construction",
          "[robustness][pipeline]") {
  // Before, reduce::host ignored the group: under mpirun every rank trained alone and exited 0.
  pipeline_options options;
  options.processes = std::make_shared<one_process>();
  CHECK_THROWS_WITH(trainer({{"w", {2}}}, inputs, 2, {}, options),
                    Catch::Contains("pipeline_options::processes is set, but reduce::host does not span processes") &&
                        Catch::Contains("use reduce::sharded"));
  CHECK_NOTHROW(pipeline<exec::host, reduce::sharded, optim::sgd, layout::flat<float>>({{"w", {2}}}, inputs, 2, {}, options));
}
