// The simulated devices (include/towerpipe/exec/simulated/): each check fires on a seeded GPU mistake and
// stays quiet on correct use under seeds 1..8; values the devices compute are checked against values
// this file computes on its own (small dyadic numbers, exact in any order).

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "towerpipe/executor/simulated/executor.hpp"
#include "towerpipe/optim/adam.hpp"
#include "towerpipe/optim/sgd.hpp"
#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/launch_policy.hpp"
#include "towerpipe/kernels/process_agents.hpp"
#include "towerpipe/kernels/screen.hpp"

namespace {

using towerpipe::error;
using towerpipe::multi_tensor_policy;
using towerpipe::detail::element_range;
using towerpipe::detail::lanes;
using towerpipe::detail::load_lanes;
using towerpipe::detail::operand_access;
using towerpipe::detail::simulated_executor;
using towerpipe::detail::store_lanes;
using towerpipe::detail::tensor_chunk;
using Catch::Matchers::Contains;
using exec_t = simulated_executor;
using view = towerpipe::detail::pointer_table<float>;
using const_view = towerpipe::detail::pointer_table<const float>;

constexpr std::uint64_t seeds = 8;

std::shared_ptr<towerpipe::sim::machine> make_machine(int devices, std::uint64_t seed, std::set<std::pair<int, int>> peers = {}) {
  towerpipe::sim::machine_config config;
  config.devices = devices;
  config.peers = std::move(peers);
  config.seed = seed;
  return std::make_shared<towerpipe::sim::machine>(config);
}

std::set<std::pair<int, int>> all_pairs(int devices) {
  std::set<std::pair<int, int>> pairs;
  for (int a = 0; a < devices; ++a) {
    for (int b = 0; b < devices; ++b) {
      if (a != b) pairs.insert({a, b});
    }
  }
  return pairs;
}

// out = factor * in, role 0 of each; `honest` false leaves `out` out of the declaration.
struct scale_agent {
  using value_type = float;
  const_view in;
  view out;
  float factor;
  bool honest = true;

  template <unsigned W>
  void process(int v, unsigned i) const {
    lanes<float, W> x = load_lanes<W>(in.at(0, v) + i);
    for (unsigned l = 0; l < W; ++l) x.value[l] *= factor;
    store_lanes<W>(out.at(0, v) + i, x);
  }
  template <class F>
  void operands(F&& f) const {
    f(in, 0, 1, operand_access::read);
    if (honest) f(out, 0, 1, operand_access::write);
  }
};

// x = x + 1 in place, but declared as a read only.
struct increment_declared_as_read {
  using value_type = float;
  view x;

  template <unsigned W>
  void process(int v, unsigned i) const {
    lanes<float, W> y = load_lanes<W>(x.at(0, v) + i);
    for (unsigned l = 0; l < W; ++l) y.value[l] += 1.0f;
    store_lanes<W>(x.at(0, v) + i, y);
  }
  template <class F>
  void operands(F&& f) const {
    f(x, 0, 1, operand_access::read);
  }
};

struct scalar_policy : multi_tensor_policy {
  static constexpr unsigned vector_elements = 1;
};

std::vector<tensor_chunk> chunks_of(std::size_t elements) {
  return towerpipe::detail::make_chunk_table(std::vector<element_range>{{0, 0, elements}}, multi_tensor_policy::chunk_elements);
}

// One float buffer on a device and its one-variable pointer table.
struct device_buffer {
  exec_t::device_memory_space::owner<float> data;
  exec_t::pointer_table<float> table;
  device_buffer(const exec_t& exec, int device, std::size_t elements, int table_device)
      : data(exec.device_memory(device).allocate<float>(elements, 256)), table(exec, {data.get()}, 1, table_device) {}
  device_buffer(const exec_t& exec, int device, std::size_t elements) : device_buffer(exec, device, elements, device) {}
};

std::vector<float> iota_values(std::size_t n) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 97) - 48.0f;
  return values;
}

// Runs `body` and returns the text of the towerpipe::error it throws ("" when none).
template <class Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("simulated devices: a reader stream without the event wait races with the writer, naming both ops", "[simulation]") {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    for (const bool waits : {true, false}) {
      CAPTURE(waits);
      const exec_t exec(make_machine(1, seed));
      const exec_t::stream writer(exec, 0, "writer"), reader(exec, 0, "reader");
      const exec_t::event written(exec, 0);
      const std::size_t n = 1000;
      const auto a = exec.device_memory(0).allocate<float>(n, 256);
      const auto b = exec.device_memory(0).allocate<float>(n, 256);
      exec.fill_async(a.get(), n, 2.0f, writer);
      exec.record(written, writer);
      if (waits) exec.wait(reader, written);
      exec.copy_async(b.get(), a.get(), n * sizeof(float), reader);
      std::string found = error_of([&] { exec.synchronize(writer); });
      const std::string second = error_of([&] { exec.synchronize(reader); });
      if (found.empty()) found = second;
      if (waits) {
        REQUIRE(found.empty());
        std::vector<float> host(n);
        exec.copy_to_host_now(host.data(), b.get(), n * sizeof(float));
        REQUIRE(host == std::vector<float>(n, 2.0f));
      } else {
        REQUIRE_THAT(found, Contains("race on device 0's allocation"));
        REQUIRE_THAT(found, Contains("fill_async"));
        REQUIRE_THAT(found, Contains("stream 'writer'"));
        REQUIRE_THAT(found, Contains("copy_async"));
        REQUIRE_THAT(found, Contains("stream 'reader'"));
        REQUIRE_THAT(found, Contains("bytes [0, 4000)"));
      }
    }
  }
}

TEST_CASE("simulated devices: interleaving is real: without the wait the copied values depend on the seed", "[simulation]") {
  std::set<float> copied;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    const exec_t exec(make_machine(1, seed));
    const exec_t::stream writer(exec, 0, "writer"), reader(exec, 0, "reader");
    const auto a = exec.device_memory(0).allocate<float>(16, 256);
    const auto b = exec.device_memory(0).allocate<float>(16, 256);
    exec.fill_async(a.get(), 16, 7.0f, writer);
    exec.copy_async(b.get(), a.get(), 16 * sizeof(float), reader);  // no wait: races with the fill
    int races = 0;
    for (const exec_t::stream* s : {&writer, &reader}) {
      if (error_of([&] { exec.synchronize(*s); }).find("race") != std::string::npos) ++races;
    }
    REQUIRE(races == 1);  // found once, by whichever synchronisation ran the second op
    float host[16];
    exec.copy_to_host_now(host, b.get(), sizeof host);
    copied.insert(host[0]);
  }
  REQUIRE(copied == std::set<float>{0.0f, 7.0f});  // the copy ran before the fill under some seeds, after under others
}

TEST_CASE("simulated devices: a host read needs a synchronisation with the stream that wrote", "[simulation]") {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(2, seed));
    const exec_t::stream s(exec, 0, "filler"), other(exec, 1, "other");
    const auto buffer = exec.device_memory(0).allocate<float>(64, 256);
    const auto elsewhere = exec.device_memory(1).allocate<float>(64, 256);
    float host[64];
    exec.fill_async(buffer.get(), 64, 3.0f, s);
    // Still pending:
    REQUIRE_THAT(error_of([&] { exec.copy_to_host_now(host, buffer.get(), sizeof host); }),
                 Contains("still pending") && Contains("fill_async") && Contains("copy_to_host_now"));
    // Maybe run by another device's synchronisation (the seed decides), but the host is not ordered after it:
    exec.memset_async(elsewhere.get(), 0, sizeof host, other);
    exec.synchronize_device(1);
    REQUIRE_THAT(error_of([&] { exec.copy_to_host_now(host, buffer.get(), sizeof host); }), Contains("race") && Contains("fill_async"));
    exec.synchronize(s);
    exec.copy_to_host_now(host, buffer.get(), sizeof host);
    REQUIRE(host[0] == 3.0f);
    REQUIRE(host[63] == 3.0f);
  }
}

TEST_CASE("simulated devices: pinned memory that a stream touches needs the host to be ordered around it", "[simulation]") {
  const exec_t exec(make_machine(1, 3));
  const exec_t::stream s(exec, 0, "upload");
  const exec_t::event done(exec, 0);
  const auto pinned = exec.pinned_memory().allocate<float>(32);
  const auto device = exec.device_memory(0).allocate<float>(32, 256);
  exec.host_writes(pinned.get(), 32 * sizeof(float));  // before the copy is enqueued: ordered
  for (int i = 0; i < 32; ++i) pinned[static_cast<std::size_t>(i)] = static_cast<float>(i);
  exec.copy_async(device.get(), pinned.get(), 32 * sizeof(float), s);
  exec.record(done, s);
  REQUIRE_THAT(error_of([&] { exec.host_writes(pinned.get(), 32 * sizeof(float)); }), Contains("still pending") && Contains("host_writes"));
  exec.synchronize(done);
  exec.host_writes(pinned.get(), 32 * sizeof(float));
  REQUIRE_THAT(error_of([&] { exec.host_reads(device.get(), 4); }), Contains("the host cannot touch"));
}

TEST_CASE("simulated devices: a launch reaches another device's memory only with peer access enabled", "[simulation]") {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(2, seed, {{0, 1}}));
    const std::size_t n = 5000;
    const device_buffer in(exec, 1, n, 0), out(exec, 0, n);  // `in` lives on device 1, its table on device 0
    const exec_t::chunk_table table(exec, chunks_of(n), 0);
    const exec_t::stream s(exec, 0, "root");
    const exec_t::device_guard on(exec, 0);
    const auto launch = [&] { table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 2.0f}, s); };
    REQUIRE_THAT(error_of(launch), Contains("device 0 has no peer access to device 1's memory") && Contains("launch of scale_agent"));
    REQUIRE(exec.enable_peer_access({0, 1}) == std::set<std::pair<int, int>>{{0, 1}});  // (1, 0) is not in the machine
    const std::vector<float> values = iota_values(n);
    exec.copy_to_device_now(in.data.get(), values.data(), n * sizeof(float));
    launch();
    exec.synchronize(s);
    std::vector<float> host(n);
    exec.copy_to_host_now(host.data(), out.data.get(), n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(host[i] == 2.0f * values[i]);
  }
}

TEST_CASE("simulated devices: a launch may not reach host memory", "[simulation]") {
  const exec_t exec(make_machine(1, 1));
  const auto pinned = exec.pinned_memory().allocate<float>(4096);
  const exec_t::pointer_table<float> in(exec, {pinned.get()}, 1, 0);
  const device_buffer out(exec, 0, 4096);
  std::vector<float> pageable(4096);
  const exec_t::pointer_table<float> pageable_in(exec, {pageable.data()}, 1, 0);
  const exec_t::chunk_table table(exec, chunks_of(4096), 0);
  const exec_t::stream s(exec, 0);
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(scale_agent{in.const_view(), out.table.view(), 1.0f}, s); }),
               Contains("pinned host allocation") && Contains("host memory, not memory of device 0"));
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(scale_agent{pageable_in.const_view(), out.table.view(), 1.0f}, s); }),
               Contains("pageable host memory"));
}

TEST_CASE("simulated devices: a store range that is not vector-aligned is refused at launch", "[simulation]") {
  const exec_t exec(make_machine(1, 1));
  const std::size_t n = 4100;
  const auto data = exec.device_memory(0).allocate<float>(n + 4, 256);
  const device_buffer in(exec, 0, n);
  const exec_t::pointer_table<float> shifted(exec, {data.get() + 1}, 1, 0);  // 4 bytes past a 256-byte boundary
  const exec_t::chunk_table table(exec, chunks_of(n), 0);
  const exec_t::stream s(exec, 0);
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), shifted.view(), 1.0f}, s); }),
               Contains("is not 16-byte aligned") && Contains("role 0, variable 0, element 0"));
  // Reading through a misaligned vector is fine (CUB falls back to scalar loads), and so is a policy of single elements.
  table.launch<multi_tensor_policy>(scale_agent{shifted.const_view(), in.table.view(), 1.0f}, s);
  table.launch<scalar_policy>(scale_agent{in.table.const_view(), shifted.view(), 1.0f}, s);
  exec.synchronize(s);
}

TEST_CASE("simulated devices: a range past the end of its allocation is refused", "[simulation]") {
  const exec_t exec(make_machine(1, 1));
  const device_buffer in(exec, 0, 4096), out(exec, 0, 4000);
  const exec_t::chunk_table table(exec, chunks_of(4096), 0), too_long(exec, chunks_of(4100), 0);
  const exec_t::stream s(exec, 0);
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s); }),
               Contains("role 0, variable 0, element 0") && Contains("bytes [0, 16384) run past the end of device 0's allocation") &&
                   Contains("(16000 bytes)"));
  // A chunk that starts where the allocation ends:
  REQUIRE_THAT(error_of([&] { too_long.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), in.table.view(), 1.0f}, s); }),
               Contains("element 4096") && Contains("0 bytes past the end of device 0's allocation"));
  const auto small = exec.device_memory(0).allocate<float>(8, 256);
  REQUIRE_THAT(error_of([&] { exec.memset_async(small.get(), 0, 64, s); }), Contains("run past the end"));
  REQUIRE_THAT(error_of([&] { exec.copy_async(small.get(), in.data.get(), 64, s); }), Contains("destination") && Contains("run past the end"));
  REQUIRE_THAT(error_of([&] { too_long.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s, {1, 3}); }),
               Contains("chunks [1, 3) launched from a chunk table of 2"));
}

TEST_CASE("simulated devices: a launch needs its stream's device current, and the table on that device", "[simulation]") {
  const exec_t exec(make_machine(2, 1));
  const device_buffer in(exec, 1, 4096), out(exec, 1, 4096);
  const exec_t::chunk_table table(exec, chunks_of(4096), 1);
  const exec_t::stream s1(exec, 1, "tower 1"), s0(exec, 0, "tower 0");
  const scale_agent agent{in.table.const_view(), out.table.view(), 1.0f};
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(agent, s1); }),
               Contains("while device 0 is current") && Contains("device_guard"));
  {
    const exec_t::device_guard on(exec, 0);
    REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(agent, s0); }),
                 Contains("a chunk table of device 1 launched on stream 'tower 0'"));
  }
  const exec_t::device_guard on(exec, 1);
  table.launch<multi_tensor_policy>(agent, s1);
  exec.synchronize(s1);
  REQUIRE_THAT(error_of([&] { exec_t::device_guard bad(exec, 2); }), Contains("simulated device 2 does not exist"));
}

TEST_CASE("simulated devices: an agent touching what its operands() does not declare is stopped", "[simulation]") {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(1, seed));
    const device_buffer in(exec, 0, 4096), out(exec, 0, 4096);
    const exec_t::chunk_table table(exec, chunks_of(4096), 0);
    const exec_t::stream s(exec, 0);
    scale_agent liar{in.table.const_view(), out.table.view(), 1.0f};
    liar.honest = false;
    table.launch<multi_tensor_policy>(liar, s);
    REQUIRE_THAT(error_of([&] { exec.synchronize(s); }),
                 Contains("launch of scale_agent") && Contains("writes 16 bytes at 0x") &&
                     Contains("bytes [0, 16) of device 0's allocation") &&
                     Contains("outside what its operands() declares for writing") && Contains("the nearest declared range is"));
    table.launch<multi_tensor_policy>(increment_declared_as_read{in.table.view()}, s);
    REQUIRE_THAT(error_of([&] { exec.synchronize(s); }),
                 Contains("increment_declared_as_read") && Contains("declares for writing") && Contains("(read)"));
    table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s);
    exec.synchronize(s);  // an honest agent passes
  }
}

TEST_CASE("simulated devices: a pointer table without an entry the agent declares is refused", "[simulation]") {
  const exec_t exec(make_machine(1, 1));
  const device_buffer in(exec, 0, 4096);
  const exec_t::pointer_table<float> empty(exec, {nullptr}, 1, 0);
  const exec_t::chunk_table table(exec, chunks_of(4096), 0);
  const exec_t::stream s(exec, 0);
  REQUIRE_THAT(error_of([&] { table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), empty.view(), 1.0f}, s); }),
               Contains("has no pointer for variable 0") && Contains("dereference null"));
}

TEST_CASE("simulated devices: a correct pipeline of two devices passes under every seed with the same values", "[simulation]") {
  const std::size_t n = 10000;
  const std::vector<float> input = iota_values(n);
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(2, seed, all_pairs(2)));
    exec.enable_peer_access({0, 1});
    const exec_t::stream producer(exec, 0, "producer"), consumer(exec, 1, "consumer");
    const exec_t::event produced(exec, 0), consumed(exec, 1);
    const device_buffer a0(exec, 0, n), b0(exec, 0, n), a1(exec, 1, n), b1(exec, 1, n);
    const exec_t::chunk_table table0(exec, chunks_of(n), 0), table1(exec, chunks_of(n), 1);
    const auto pinned = exec.pinned_memory().allocate<float>(n);
    exec.copy_to_device_now(a0.data.get(), input.data(), n * sizeof(float));
    for (int round = 0; round < 2; ++round) {
      {
        const exec_t::device_guard on(exec, 0);
        if (round > 0) exec.wait(producer, consumed);  // b0 is read by the consumer's peer copy of the last round
        table0.launch<multi_tensor_policy>(scale_agent{a0.table.const_view(), b0.table.view(), 2.0f}, producer);
        exec.record(produced, producer);
      }
      {
        const exec_t::device_guard on(exec, 1);
        exec.wait(consumer, produced);
        exec.copy_peer_async(a1.data.get(), 1, b0.data.get(), 0, n * sizeof(float), consumer);
        exec.record(consumed, consumer);
        table1.launch<multi_tensor_policy>(scale_agent{a1.table.const_view(), b1.table.view(), 2.0f}, consumer);
        exec.copy_async(pinned.get(), b1.data.get(), n * sizeof(float), consumer);
      }
    }
    exec.synchronize(consumer);
    exec.host_reads(pinned.get(), n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) REQUIRE(pinned[i] == 4.0f * input[i]);
    exec.machine().check();
  }
}

TEST_CASE("simulated devices: the library's fused agent on four towers over two devices, as a step of towers and a root", "[simulation]") {
  using agent_t = towerpipe::detail::fused_apply_agent<towerpipe::optim::sgd, float, 0>;
  using apply_t = towerpipe::detail::optimizer_apply<towerpipe::optim::sgd, float>;
  const std::vector<std::size_t> sizes{3000, 4096, 9001, 17};
  const int towers = 4;
  const auto device_of = [](int tower) { return tower / 2; };
  const auto gradient = [](int t, std::size_t v, std::size_t i) { return static_cast<float>((int(i % 13) - 6) * (t + 1) + int(v)) * 0.25f; };
  const auto parameter = [](std::size_t v, std::size_t i) { return static_cast<float>(int(i % 29) - int(v)); };
  towerpipe::optim::sgd::hyper_parameters h;
  h.lr = 0.5;
  h.momentum = 0.5;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    for (const bool waits_for_all : {true, false}) {
      CAPTURE(seed, waits_for_all);
      const exec_t exec(make_machine(2, seed, all_pairs(2)));
      exec.enable_peer_access({0, 1});
      std::vector<element_range> whole;
      for (std::size_t v = 0; v < sizes.size(); ++v) whole.push_back({v, 0, sizes[v]});
      const std::vector<tensor_chunk> chunks = towerpipe::detail::make_chunk_table(whole, multi_tensor_policy::chunk_elements);
      // Per tower and variable: a gradient and a replica on the tower's device; state on the root.
      std::vector<exec_t::device_memory_space::owner<float>> owners;
      std::vector<float*> gradients, replicas, state;
      const auto allocate = [&](int device, std::size_t count) {
        owners.push_back(exec.device_memory(device).allocate<float>(count, 256));
        return owners.back().get();
      };
      for (int t = 0; t < towers; ++t) {
        for (std::size_t v = 0; v < sizes.size(); ++v) gradients.push_back(allocate(device_of(t), sizes[v]));
      }
      for (int t = 0; t < towers; ++t) {
        for (std::size_t v = 0; v < sizes.size(); ++v) {
          replicas.push_back(allocate(device_of(t), sizes[v]));
          std::vector<float> p(sizes[v]);
          for (std::size_t i = 0; i < sizes[v]; ++i) p[i] = parameter(v, i);
          exec.copy_to_device_now(replicas.back(), p.data(), sizes[v] * sizeof(float));
        }
      }
      for (std::size_t v = 0; v < sizes.size(); ++v) state.push_back(allocate(0, sizes[v]));
      const int variables = static_cast<int>(sizes.size());
      const exec_t::pointer_table<float> gradient_table(exec, gradients, variables, 0), replica_table(exec, replicas, variables, 0),
          state_table(exec, state, variables, 0), no_master(exec, {}, variables, 0);
      const exec_t::chunk_table table(exec, chunks, 0);
      std::vector<exec_t::stream> tower_streams;
      std::vector<exec_t::event> ready;
      for (int t = 0; t < towers; ++t) {
        tower_streams.emplace_back(exec, device_of(t), ("tower " + std::to_string(t)).c_str());
        ready.emplace_back(exec, device_of(t));
      }
      const exec_t::stream root(exec, 0, "root");
      const exec_t::event applied(exec, 0);
      std::string found;
      for (std::int64_t step = 1; step <= 2; ++step) {
        // The towers write their gradients on the host, as their streams (exec::simulated's tower functions).
        for (int t = 0; t < towers; ++t) {
          for (std::size_t v = 0; v < sizes.size(); ++v) {
            float* g = gradients[std::size_t(t) * sizes.size() + v];
            exec.stream_host_access(tower_streams[std::size_t(t)], g, sizes[v] * sizeof(float), operand_access::write);
            for (std::size_t i = 0; i < sizes[v]; ++i) g[i] = gradient(t, v, i) * static_cast<float>(step);
          }
          exec.record(ready[std::size_t(t)], tower_streams[std::size_t(t)]);
        }
        const exec_t::device_guard on(exec, 0);
        for (int t = 0; t < towers; ++t) {
          if (waits_for_all || t != 3) exec.wait(root, ready[std::size_t(t)]);
        }
        agent_t agent{gradient_table.const_view(), towers, {}, apply_t{replica_table.view(), state_table.view(), towers, 1,
                                                                      towerpipe::optim::sgd::constants<float>(h, step), no_master.view()}};
        for (int t = 0; t < towers; ++t) agent.weights[t] = 0.25f;
        table.launch<multi_tensor_policy>(agent, root);
        exec.record(applied, root);
        for (const exec_t::stream& s : tower_streams) exec.wait(s, applied);  // the next gradients after this step's reads
        const std::string e = error_of([&] { exec.synchronize(applied); });
        if (found.empty()) found = e;
      }
      if (!waits_for_all) {
        REQUIRE_THAT(found, Contains("race on device 1's allocation") && Contains("host access as stream 'tower 3'") &&
                                Contains("launch of fused_apply_agent"));
        continue;
      }
      REQUIRE(found.empty());
      // Independently: two SGD steps with momentum 0.5, lr 0.5; the gradient of step s is s * (mean over towers).
      for (int t = 0; t < towers; ++t) {
        for (std::size_t v = 0; v < sizes.size(); ++v) {
          std::vector<float> host(sizes[v]);
          exec.copy_to_host_now(host.data(), replicas[std::size_t(t) * sizes.size() + v], sizes[v] * sizeof(float));
          for (std::size_t i = 0; i < sizes[v]; ++i) {
            double mean = 0;
            for (int u = 0; u < towers; ++u) mean += 0.25 * gradient(u, v, i);
            const double b1 = mean, p1 = parameter(v, i) - 0.5 * b1;
            const double b2 = 0.5 * b1 + 2 * mean, p2 = p1 - 0.5 * b2;
            REQUIRE(host[i] == static_cast<float>(p2));
          }
        }
      }
    }
  }
}

TEST_CASE("simulated devices: the screen runs the lane program per tile and lowers the key", "[simulation]") {
  using source_t = towerpipe::detail::tower_average_source<float, 0, towerpipe::detail::weight_array<float>>;
  const std::vector<std::size_t> sizes{5000, 2048, 3};
  const int towers = 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto gradient = [](int t, std::size_t v, std::size_t i) { return static_cast<float>(int((i + v) % 9) - 4 + t); };
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(1, seed));
    towerpipe::variable_set variables;
    for (std::size_t v = 0; v < sizes.size(); ++v) variables.add("v" + std::to_string(v), {sizes[v]});
    std::vector<exec_t::device_memory_space::owner<float>> owners;
    std::vector<float*> gradients, averaged;
    for (int t = 0; t <= towers; ++t) {
      for (std::size_t v = 0; v < sizes.size(); ++v) {
        owners.push_back(exec.device_memory(0).allocate<float>(sizes[v], 256));
        std::vector<float> values(sizes[v]);
        for (std::size_t i = 0; i < sizes[v]; ++i) values[i] = gradient(t, v, i);
        if (t == 2 && v == 1) values[5] = nan;
        if (t < towers) exec.copy_to_device_now(owners.back().get(), values.data(), sizes[v] * sizeof(float));
        (t < towers ? gradients : averaged).push_back(owners.back().get());
      }
    }
    const int count = static_cast<int>(sizes.size());
    const exec_t::pointer_table<float> gradient_table(exec, gradients, count, 0), average_table(exec, averaged, count, 0);
    const exec_t::screen screen(exec, variables, 0);
    const exec_t::stream s(exec, 0, "screen");
    const exec_t::device_guard on(exec, 0);
    screen.reset(s);
    source_t source{gradient_table.const_view(), towers, {}};
    for (int t = 0; t < towers; ++t) source.weights.value[t] = 0.5f;
    screen.launch(source, average_table.view(), s);
    REQUIRE_THAT(error_of([&] { (void)screen.results(); }), Contains("race") && Contains("still pending"));  // not synchronised yet
    exec.synchronize(s);  // the same race is not reported again from the launch's side
    const towerpipe::detail::screen_partials partials = screen.results();
    const auto place = towerpipe::detail::decode_nonfinite_key(partials.first_nonfinite);
    REQUIRE(place.variable == 1);
    REQUIRE(place.element == 5);
    REQUIRE(place.tower == 2);
    // Tile sums: squares of the average (exact in any order: halves of small integers).
    REQUIRE(partials.tile_sums.size() == 3 + 1 + 1);
    std::size_t tile = 0;
    for (std::size_t v = 0; v < sizes.size(); ++v) {
      for (std::size_t first = 0; first < sizes[v]; first += 2048, ++tile) {
        double expected = 0;
        for (std::size_t i = first; i < std::min(sizes[v], first + 2048); ++i) {
          double mean = 0;
          for (int t = 0; t < towers; ++t) mean += 0.5 * gradient(t, v, i);
          expected += (v == 1 && i == 5) ? std::numeric_limits<double>::quiet_NaN() : mean * mean;
        }
        if (std::isnan(expected)) REQUIRE(std::isnan(partials.tile_sums[tile]));
        else REQUIRE(partials.tile_sums[tile] == expected);
      }
    }
  }
}

TEST_CASE("simulated devices: a host access as a stream runs the stream's work first and is the stream's own", "[simulation]") {
  const exec_t exec(make_machine(1, 5));
  const exec_t::stream s(exec, 0, "tower 0");
  const auto buffer = exec.device_memory(0).allocate<float>(8, 256);
  exec.fill_async(buffer.get(), 8, 5.0f, s);
  exec.stream_host_access(s, buffer.get(), 8 * sizeof(float), operand_access::read_write);
  REQUIRE(buffer[0] == 5.0f);  // the fill ran first
  buffer[0] = 6.0f;
  float host[8];
  // The host did not synchronise with the stream, whose own access that was:
  REQUIRE_THAT(error_of([&] { exec.copy_to_host_now(host, buffer.get(), sizeof host); }),
               Contains("host access as stream 'tower 0'") && Contains("copy_to_host_now"));
  exec.synchronize(s);
  exec.copy_to_host_now(host, buffer.get(), sizeof host);
  REQUIRE(host[0] == 6.0f);
}

TEST_CASE("simulated devices: a violation found while freeing is kept for machine::check()", "[simulation]") {
  const auto machine = make_machine(2, 2);
  const exec_t exec(machine);
  const exec_t::stream other(exec, 1, "other device");
  auto source = exec.device_memory(0).allocate<float>(64, 256);
  const auto target = exec.device_memory(1).allocate<float>(64, 256);
  exec.copy_async(target.get(), source.get(), 64 * sizeof(float), other);
  source.reset();  // drains device 0 and the copy that reads the memory, but the host never waited for device 1
  REQUIRE_THAT(error_of([&] { machine->check(); }),
               Contains("while freeing memory") && Contains("race on device 0's allocation") && Contains("free of device 0's allocation"));
  machine->check();  // thrown once
  // ... or by the next call of the executor.
  auto again = exec.device_memory(0).allocate<float>(64, 256);
  exec.copy_async(target.get(), again.get(), 64 * sizeof(float), other);
  again.reset();
  REQUIRE_THAT(error_of([&] { exec.synchronize(other); }), Contains("while freeing memory"));
  // With the synchronisation, the free is quiet.
  auto fine = exec.device_memory(0).allocate<float>(64, 256);
  exec.copy_async(target.get(), fine.get(), 64 * sizeof(float), other);
  exec.synchronize(other);
  fine.reset();
  machine->check();
}

TEST_CASE("simulated devices: seconds_between needs both records complete as far as the host knows", "[simulation]") {
  const exec_t exec(make_machine(1, 1));
  const exec_t::stream s(exec, 0);
  const exec_t::event start(exec, 0, true), end(exec, 0, true), untimed(exec, 0);
  const device_buffer in(exec, 0, 8192), out(exec, 0, 8192);
  const exec_t::chunk_table table(exec, chunks_of(8192), 0);
  REQUIRE_THAT(error_of([&] { (void)exec.seconds_between(start, end); }), Contains("never been recorded"));
  exec.record(start, s);
  table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s);
  exec.record(end, s);
  exec.synchronize(start);
  REQUIRE_THAT(error_of([&] { (void)exec.seconds_between(start, end); }), Contains("not complete as far as the host knows"));
  exec.synchronize(end);
  const double seconds = exec.seconds_between(start, end);
  REQUIRE(seconds > 0);
  REQUIRE(seconds < 1e-3);
  exec.record(untimed, s);
  exec.synchronize(s);
  REQUIRE_THAT(error_of([&] { (void)exec.seconds_between(start, untimed); }), Contains("created without timing"));
  // The clock converts device times to host times through an origin it waited for.
  const exec_t::clock clock(exec, 0, s);
  exec.record(start, s);
  table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s);
  exec.record(end, s);
  exec.synchronize(end);
  REQUIRE(clock.host_time(end) - clock.host_time(start) ==
          std::chrono::duration_cast<towerpipe::timeline::clock::duration>(std::chrono::duration<double>(exec.seconds_between(start, end))));
}

TEST_CASE("simulated devices: fill, find_first and batches of copies", "[simulation]") {
  const exec_t exec(make_machine(2, 4, all_pairs(2)));
  const exec_t::stream s(exec, 0);
  const auto words = exec.device_memory(0).allocate<std::uint32_t>(100, 256);
  const auto peer = exec.device_memory(1).allocate<std::uint32_t>(100, 256);
  exec.fill_async(words.get(), 100, 0xDEADu, s);
  exec.memset_async(words.get() + 40, 0, 4 * sizeof(std::uint32_t), s);
  const exec_t::find_scratch scratch(exec, 0);
  REQUIRE(exec.find_first(words.get(), 100, 0u, s, scratch) == 40);
  REQUIRE(exec.find_first(words.get(), 100, 7u, s, scratch) == 100);
  REQUIRE_THAT(error_of([&] { exec.fill_async(peer.get(), 100, 1u, s); }), Contains("device 0 has no peer access to device 1's memory"));
  exec.enable_peer_access({0, 1});
  exec.fill_async(peer.get(), 100, 1u, s);
  std::uint32_t a[4] = {1, 2, 3, 4};
  const auto pinned = exec.pinned_memory().allocate<std::uint32_t>(4);
  std::copy(a, a + 4, pinned.get());
  void* const dsts[] = {words.get(), words.get() + 50};
  const void* const srcs[] = {pinned.get(), peer.get()};
  const std::size_t bytes[] = {4 * sizeof(std::uint32_t), 2 * sizeof(std::uint32_t)};
  exec.copy_batch_async(dsts, srcs, bytes, 2, s);
  REQUIRE_THAT(error_of([&] { exec.copy_batch_async(dsts, srcs, bytes, 0, s); }), Contains("an empty batch"));
  const std::size_t no_bytes[] = {4 * sizeof(std::uint32_t), 0};
  REQUIRE_THAT(error_of([&] { exec.copy_batch_async(dsts, srcs, no_bytes, 2, s); }), Contains("range 1 of 2 has no bytes"));
  std::vector<std::uint32_t> host(100);
  exec.synchronize(s);
  exec.copy_to_host_now(host.data(), words.get(), 100 * sizeof(std::uint32_t));
  REQUIRE(host[0] == 1);
  REQUIRE(host[3] == 4);
  REQUIRE(host[4] == 0xDEADu);
  REQUIRE(host[40] == 0);
  REQUIRE(host[50] == 1);
  REQUIRE(host[52] == 0xDEADu);
  // A pageable source is staged before copy_async returns, as CUDA does: a later write to it is not copied.
  std::uint32_t pageable[2] = {9, 9};
  exec.copy_async(words.get() + 60, pageable, sizeof pageable, s);
  pageable[0] = 5;
  exec.synchronize(s);
  exec.copy_to_host_now(host.data(), words.get(), 100 * sizeof(std::uint32_t));
  REQUIRE(host[60] == 9);
  REQUIRE(host[61] == 9);
  REQUIRE_THAT(error_of([&] { exec.copy_peer_async(words.get(), 1, peer.get(), 1, 8, s); }),
               Contains("the destination is device 0's allocation") && Contains("not memory of device 1"));
  REQUIRE_THAT(error_of([&] { exec.copy_async(words.get() + 1, words.get(), 8, s); }), Contains("overlap"));
  // A copy into pageable memory returns once it has landed, as CUDA's does; a fill of nothing is nothing.
  std::uint32_t landed[2] = {};
  exec.copy_async(landed, words.get(), sizeof landed, s);
  REQUIRE(landed[0] == 1);
  REQUIRE(landed[1] == 2);
  exec.fill_async(words.get(), 0, 7u, s);
  // What asynchronous and synchronous copies refuse: pageable memory where CUDA needs device or pinned
  // memory, device memory where host memory is meant.
  REQUIRE_THAT(error_of([&] { exec.memset_async(pageable, 0, sizeof pageable, s); }),
               Contains("is pageable host memory; asynchronous work needs device or pinned memory"));
  REQUIRE_THAT(error_of([&] { exec.copy_to_host_now(host.data(), pageable, sizeof pageable); }),
               Contains("the device side at") && Contains("is not device memory (pageable host memory"));
  REQUIRE_THAT(error_of([&] { exec.copy_to_host_now(peer.get(), words.get(), 8); }),
               Contains("the host side is") && Contains("not host memory"));
}

TEST_CASE("simulated devices: an event is recorded and timed on its own device only", "[simulation]") {
  const exec_t exec(make_machine(2, 1));
  const exec_t::stream on_0(exec, 0), on_1(exec, 1);
  const exec_t::event start(exec, 0, true), end(exec, 1, true);
  REQUIRE_THAT(error_of([&] { exec.record(end, on_0); }), Contains("of device 1 recorded on") && Contains("(the same device required)"));
  exec.record(start, on_0);
  exec.record(end, on_1);
  exec.synchronize(start);
  exec.synchronize(end);
  REQUIRE_THAT(error_of([&] { (void)exec.seconds_between(start, end); }), Contains("is of device 0") && Contains("of device 1"));
}

TEST_CASE("simulated devices: op counts", "[simulation]") {
  const auto machine = make_machine(2, 1, all_pairs(2));
  const exec_t exec(machine);
  const exec_t::stream s0(exec, 0), s1(exec, 1);
  const exec_t::event e(exec, 0), never(exec, 1);
  const device_buffer in(exec, 0, 4096), out(exec, 0, 4096);
  const auto remote = exec.device_memory(1).allocate<float>(4096, 256);
  const exec_t::chunk_table table(exec, chunks_of(4096), 0);
  REQUIRE(machine->counts().copies == 2);  // the two pointer tables' uploads
  machine->reset_counts();
  const exec_t::device_guard on(exec, 0);
  exec.memset_async(in.data.get(), 0, 4096 * sizeof(float), s0);
  exec.fill_async(out.data.get(), 4096, 1.0f, s0);
  table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s0);
  table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 1.0f}, s0, {0, 0});  // empty: nothing
  exec.record(e, s0);
  exec.wait(s1, e);
  exec.wait(s1, never);  // never recorded: no wait, but a call
  exec.copy_peer_async(remote.get(), 1, out.data.get(), 0, 4096 * sizeof(float), s1);
  exec.copy_async(remote.get(), out.data.get(), 0, s1);  // no bytes: nothing
  exec.synchronize(s1);
  exec.synchronize(e);
  const towerpipe::sim::op_counts counts = machine->counts();
  REQUIRE(counts.launches == 1);
  REQUIRE(counts.copies == 1);
  REQUIRE(counts.memsets == 2);
  REQUIRE(counts.records == 1);
  REQUIRE(counts.waits == 2);
  REQUIRE(counts.host_syncs == 2);
  machine->reset_counts();
  REQUIRE(machine->counts().launches == 0);
}

TEST_CASE("simulated devices: host threads call one executor at once", "[simulation]") {
  const exec_t exec(make_machine(2, 6));
  const int threads = 4;
  const std::size_t n = 4096 + 100;
  std::atomic<int> correct{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      const int device = w % 2;
      const exec_t::stream s(exec, device, "worker");
      const device_buffer in(exec, device, n), out(exec, device, n);
      const exec_t::chunk_table table(exec, chunks_of(n), device);
      const auto pinned = exec.pinned_memory().allocate<float>(n);
      const exec_t::device_guard on(exec, device);
      bool good = true;
      for (int round = 1; round <= 5; ++round) {
        exec.fill_async(in.data.get(), n, static_cast<float>(round + w), s);
        table.launch<multi_tensor_policy>(scale_agent{in.table.const_view(), out.table.view(), 3.0f}, s);
        exec.copy_async(pinned.get(), out.data.get(), n * sizeof(float), s);
        exec.synchronize(s);
        exec.host_reads(pinned.get(), n * sizeof(float));
        good = good && pinned[0] == 3.0f * static_cast<float>(round + w) && pinned[n - 1] == pinned[0];
      }
      if (good) ++correct;
    });
  }
  for (std::thread& t : workers) t.join();
  REQUIRE(correct == threads);
  exec.machine().check();
}

TEST_CASE("simulated devices: sixteen towers on sixteen devices, 30,000 elements, eight seeds", "[simulation]") {
  using agent_t = towerpipe::detail::fused_apply_agent<towerpipe::optim::sgd, float, 0>;
  using apply_t = towerpipe::detail::optimizer_apply<towerpipe::optim::sgd, float>;
  const std::vector<std::size_t> sizes{12000, 9000, 5000, 3000, 1000};
  const int towers = 16;
  const auto gradient = [](int t, std::size_t v, std::size_t i) { return static_cast<float>(int((i * 7 + v) % 11) - 5 + t % 3); };
  towerpipe::optim::sgd::hyper_parameters h;
  h.lr = 0.5;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(towers, seed, all_pairs(towers)));
    std::vector<int> devices(towers);
    for (int t = 0; t < towers; ++t) devices[std::size_t(t)] = t;
    exec.enable_peer_access(devices);
    const int variables = static_cast<int>(sizes.size());
    std::vector<element_range> whole;
    for (std::size_t v = 0; v < sizes.size(); ++v) whole.push_back({v, 0, sizes[v]});
    const std::vector<tensor_chunk> chunks = towerpipe::detail::make_chunk_table(whole, multi_tensor_policy::chunk_elements);
    std::vector<exec_t::device_memory_space::owner<float>> owners;
    std::vector<float*> gradients, replicas;
    std::vector<exec_t::stream> streams;
    std::vector<exec_t::event> ready;
    for (int t = 0; t < towers; ++t) {
      streams.emplace_back(exec, t, "tower");
      ready.emplace_back(exec, t);
      for (std::size_t v = 0; v < sizes.size(); ++v) {
        owners.push_back(exec.device_memory(t).allocate<float>(sizes[v], 256));
        gradients.push_back(owners.back().get());
        std::vector<float> values(sizes[v]);
        for (std::size_t i = 0; i < sizes[v]; ++i) values[i] = gradient(t, v, i);
        exec.copy_to_device_now(gradients.back(), values.data(), sizes[v] * sizeof(float));
      }
    }
    for (int t = 0; t < towers; ++t) {
      for (std::size_t v = 0; v < sizes.size(); ++v) {
        owners.push_back(exec.device_memory(t).allocate<float>(sizes[v], 256));
        replicas.push_back(owners.back().get());
      }
    }
    const exec_t::pointer_table<float> gradient_table(exec, gradients, variables, 0), replica_table(exec, replicas, variables, 0),
        none(exec, {}, variables, 0);
    const exec_t::chunk_table table(exec, chunks, 0);
    const exec_t::stream root(exec, 0, "root");
    const exec_t::event applied(exec, 0);
    for (int t = 0; t < towers; ++t) {
      exec.fill_async(replicas[std::size_t(t) * sizes.size()], sizes[0], 1.0f, streams[std::size_t(t)]);
      exec.record(ready[std::size_t(t)], streams[std::size_t(t)]);
    }
    const exec_t::device_guard on(exec, 0);
    for (const exec_t::event& e : ready) exec.wait(root, e);
    agent_t agent{gradient_table.const_view(), towers, {},
                  apply_t{replica_table.view(), none.view(), towers, 0, towerpipe::optim::sgd::constants<float>(h, 1), none.view()}};
    for (int t = 0; t < towers; ++t) agent.weights[t] = 0.0625f;
    table.launch<multi_tensor_policy>(agent, root);
    exec.record(applied, root);
    exec.synchronize(applied);
    for (int t : {0, 7, 15}) {
      for (std::size_t v = 0; v < sizes.size(); ++v) {
        std::vector<float> host(sizes[v]);
        exec.copy_to_host_now(host.data(), replicas[std::size_t(t) * sizes.size() + v], sizes[v] * sizeof(float));
        for (std::size_t i = 0; i < sizes[v]; i += 37) {
          double mean = 0;
          for (int u = 0; u < towers; ++u) mean += 0.0625 * gradient(u, v, i);
          REQUIRE(host[i] == static_cast<float>((v == 0 ? 1.0 : 0.0) - 0.5 * mean));
        }
      }
    }
  }
}

namespace {

using towerpipe::bfloat16;
using towerpipe::detail::nonfinite_key;

// Host storage for a pointer table: one vector per (role, variable), some entries left null.
template <class U>
struct host_table {
  std::vector<std::vector<U>> storage;
  std::vector<U*> pointers;
  int variables;
  host_table(int roles, const std::vector<std::size_t>& sizes, float value, std::set<int> null_roles = {})
      : variables(static_cast<int>(sizes.size())) {
    for (int r = 0; r < roles; ++r) {
      for (std::size_t v = 0; v < sizes.size(); ++v) {
        storage.emplace_back(sizes[v], U(value));
        pointers.push_back(null_roles.count(r) != 0 ? nullptr : storage.back().data());
      }
    }
  }
  towerpipe::detail::pointer_table<U> view() { return {pointers.data(), variables}; }
  towerpipe::detail::pointer_table<const U> const_view() { return {pointers.data(), variables}; }
};

using byte_ranges = std::vector<std::pair<std::uintptr_t, std::uintptr_t>>;

byte_ranges normalized(byte_ranges ranges) {
  std::sort(ranges.begin(), ranges.end());
  byte_ranges out;
  for (const auto& r : ranges) {
    if (!out.empty() && r.first <= out.back().second) out.back().second = std::max(out.back().second, r.second);
    else out.push_back(r);
  }
  return out;
}

// What the agent's host I/O actually touched.
struct touched_bytes final : towerpipe::detail::access_recorder {
  byte_ranges reads, writes;
  bool on_access(const void* address, std::size_t bytes, operand_access access) noexcept override {
    const auto lo = reinterpret_cast<std::uintptr_t>(address);
    if (access != operand_access::write) reads.push_back({lo, lo + bytes});
    if (access != operand_access::read) writes.push_back({lo, lo + bytes});
    return true;
  }
};

// What the agent's operands() declares over `chunks`, by the definition in kernels/agents.hpp.
struct declared_bytes {
  const std::vector<tensor_chunk>* chunks;
  byte_ranges reads, writes;
  void add(std::uintptr_t lo, std::uintptr_t hi, operand_access access) {
    if (access != operand_access::write) reads.push_back({lo, hi});
    if (access != operand_access::read) writes.push_back({lo, hi});
  }
  template <class U>
  void operator()(const towerpipe::detail::pointer_table<U>& table, int first_role, int roles, operand_access access) {
    for (int role = first_role; role < first_role + roles; ++role) {
      for (const tensor_chunk& c : *chunks) {
        const auto lo = reinterpret_cast<std::uintptr_t>(table.at(role, c.variable) + c.first);
        add(lo, lo + c.count * sizeof(U), access);
      }
    }
  }
  template <class U>
  void operator()(const U* word, std::size_t bytes, operand_access access) {
    add(reinterpret_cast<std::uintptr_t>(word), reinterpret_cast<std::uintptr_t>(word) + bytes, access);
  }
};

template <class Agent>
void require_exact_declaration(const Agent& agent, const std::vector<tensor_chunk>& chunks) {
  touched_bytes touched;
  {
    const towerpipe::detail::scoped_access_recorder on(touched);
    for (const tensor_chunk& chunk : chunks)  // 5 threads, each its share of every chunk in groups of 4
      for (unsigned thread = 0; thread < 5; ++thread) towerpipe::detail::process_chunk<4>(agent, chunk, thread, 5);
  }
  declared_bytes declared{&chunks, {}, {}};
  agent.operands(declared);
  REQUIRE(normalized(touched.reads) == normalized(declared.reads));
  REQUIRE(normalized(touched.writes) == normalized(declared.writes));
}

template <class Source, class T>
void require_exact_source_declaration(const Source& source, const towerpipe::detail::pointer_table<T>& averaged,
                                      const std::vector<tensor_chunk>& tiles) {
  touched_bytes touched;
  {
    const towerpipe::detail::scoped_access_recorder on(touched);
    for (const tensor_chunk& tile : tiles) (void)towerpipe::detail::screen_tile_as_a_warp(source, averaged, tile);
  }
  declared_bytes declared{&tiles, {}, {}};
  source.operands(declared);
  declared(averaged, 0, 1, operand_access::write);  // the screen's own store
  REQUIRE(normalized(touched.reads) == normalized(declared.reads));
  REQUIRE(normalized(touched.writes) == normalized(declared.writes));
}

}  // namespace

TEST_CASE("simulated devices: every agent and screen source of the library declares exactly what it touches", "[simulation]") {
  namespace d = towerpipe::detail;
  namespace optim = towerpipe::optim;
  const std::vector<std::size_t> sizes{4100, 37};
  std::vector<element_range> whole;
  for (std::size_t v = 0; v < sizes.size(); ++v) whole.push_back({v, 0, sizes[v]});
  const std::vector<tensor_chunk> chunks = d::make_chunk_table(whole, multi_tensor_policy::chunk_elements);
  const std::vector<tensor_chunk> tiles = d::make_chunk_table(whole, d::screen_tile_elements);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  optim::sgd::hyper_parameters sgd;
  sgd.momentum = 0.9;
  const auto sgd_constants = optim::sgd::constants<float>(sgd, 1);
  const auto adam_constants = optim::adam::constants<float>(optim::adam::hyper_parameters{}, 1);

  SECTION("fused_apply_agent, full and mixed precision") {
    host_table<float> gradients(3, sizes, 1.0f), replicas(3, sizes, 2.0f), state(1, sizes, 0.0f), none(0, sizes, 0.0f);
    d::fused_apply_agent<optim::sgd, float, 0> agent{gradients.const_view(), 3, {0.5f, 0.25f, 0.25f},
                                                    {replicas.view(), state.view(), 3, 1, sgd_constants, none.view()}};
    require_exact_declaration(agent, chunks);
    host_table<float> average(1, sizes, 1.0f), master(1, sizes, 2.0f), moments(2, sizes, 0.0f);
    host_table<bfloat16> stored(2, sizes, 2.0f);
    const d::fused_apply_agent<optim::adam, float, 1, bfloat16> mixed{
        average.const_view(), 1, {1.0f}, {stored.view(), moments.view(), 2, 2, adam_constants, master.view()}};
    require_exact_declaration(mixed, chunks);
  }
  SECTION("the p2p tree's rounds and root, with raw operands and partial sums") {
    host_table<bfloat16> raw(3, sizes, 1.0f);
    host_table<float> sums(3, sizes, 0.5f, {1});  // tower 1 has no partial sum
    raw.storage[1 * sizes.size() + 1][3] = bfloat16(nan);
    nonfinite_key key = d::no_nonfinite;
    const d::tree_operands<float, bfloat16> tree{raw.const_view(), sums.view()};
    require_exact_declaration(d::tree_round_agent<float, bfloat16>{tree, {0, 1, true, true, 0.5f, 0.5f}, &key}, chunks);
    REQUIRE(key != d::no_nonfinite);
    require_exact_declaration(d::tree_round_agent<float, bfloat16>{tree, {0, 2, false, false, 1.0f, 1.0f}, nullptr}, chunks);
    host_table<float> raw32(2, sizes, 1.0f), replicas(2, sizes, 3.0f), state(1, sizes, 0.0f);
    const d::tree_operands<float> tree32{raw32.const_view(), raw32.view()};
    require_exact_declaration(d::tree_root_agent<optim::sgd, float>{tree32, {0, 1, false, true, 1.0f, 0.5f},
                                                                    {replicas.view(), state.view(), 2, 1, sgd_constants, state.view()}},
                              chunks);
  }
  SECTION("copy_agent") {
    host_table<float> source(1, sizes, 1.5f), targets(3, sizes, 0.0f);
    host_table<bfloat16> narrow(2, sizes, 0.0f);
    require_exact_declaration(d::copy_agent<float>{source.const_view(), targets.view(), 3}, chunks);
    require_exact_declaration(d::copy_agent<float, bfloat16>{source.const_view(), narrow.view(), 2}, chunks);
  }
  SECTION("reduce::sharded's agents and source") {
    host_table<float> gradients(3, sizes, 1.0f), rows(3, sizes, 0.0f), replicas(1, sizes, 1.0f), none(0, sizes, 0.0f);
    gradients.storage[2 * sizes.size()][4099] = nan;
    nonfinite_key key = d::no_nonfinite;
    const d::weight_array<float> weights{{0.25f, 0.25f, 0.5f}};
    require_exact_declaration(d::contribution_agent<float>{gradients.const_view(), 3, true, weights, 4, rows.view(), &key}, chunks);
    require_exact_declaration(d::contribution_agent<float>{gradients.const_view(), 3, false, weights, 4, rows.view(), &key}, chunks);
    REQUIRE(key != d::no_nonfinite);
    const d::rows_sum_source<float> sum{rows.const_view(), 3};
    require_exact_declaration(d::rows_apply_agent<optim::sgd, float>{sum, {replicas.view(), none.view(), 1, 0, sgd_constants, none.view()}},
                              chunks);
    host_table<float> averaged(1, sizes, 0.0f);
    require_exact_source_declaration(sum, averaged.view(), tiles);
  }
  SECTION("the screen's sources, with and without a running sum") {
    host_table<float> gradients(2, sizes, 1.0f), averaged(1, sizes, 4.0f);
    const float weights[] = {0.5f, 0.5f};
    const d::tower_average_source<float, 0, const float*> tower{gradients.const_view(), 2, weights};
    require_exact_source_declaration(tower, averaged.view(), tiles);
    host_table<bfloat16> raw(2, sizes, 1.0f);
    host_table<float> sums(2, sizes, 1.0f, {1});
    const d::edge_average_source<float, bfloat16> edge{{raw.const_view(), sums.view()}, {0, 1, false, true, 1.0f, 0.5f}};
    d::accumulating_source<d::edge_average_source<float, bfloat16>, float> accumulating{edge, averaged.view(), {}};
    require_exact_source_declaration(accumulating, averaged.view(), tiles);
    accumulating.step.first = false;
    require_exact_source_declaration(accumulating, averaged.view(), tiles);
  }
}

namespace {

// Lowers a key word to the least index of a non-finite input, as the tree's rounds lower theirs.
struct lower_key_agent {
  using value_type = float;
  const_view in;
  towerpipe::detail::nonfinite_key* key;

  template <unsigned W>
  void process(int v, unsigned i) const {
    towerpipe::detail::nonfinite_key first = towerpipe::detail::no_nonfinite;
    towerpipe::detail::note_nonfinite(load_lanes<W>(in.at(0, v) + i), v, i, 0, first);
    if (first != towerpipe::detail::no_nonfinite) towerpipe::detail::record_nonfinite(key, first);
  }
  template <class F>
  void operands(F&& f) const {
    f(in, 0, 1, operand_access::read);
    f(key, sizeof(towerpipe::detail::nonfinite_key), operand_access::read_write);
  }
};

}  // namespace

TEST_CASE("simulated devices: atomic key updates from unordered streams do not race, a plain access to the key does", "[simulation]") {
  using towerpipe::detail::nonfinite_key;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const exec_t exec(make_machine(1, seed));
    const exec_t::screen screen(exec, std::vector<tensor_chunk>{}, 0);  // its key word
    const exec_t::stream a(exec, 0, "a"), b(exec, 0, "b"), keeper(exec, 0, "keeper");
    const exec_t::event reset(exec, 0), lowered(exec, 0);
    const device_buffer x(exec, 0, 5000), y(exec, 0, 5000);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    exec.copy_to_device_now(x.data.get() + 4321, &nan, sizeof nan);
    exec.copy_to_device_now(y.data.get() + 17, &nan, sizeof nan);
    const exec_t::chunk_table table(exec, chunks_of(5000), 0);
    const exec_t::device_guard on(exec, 0);
    screen.reset(keeper);
    exec.record(reset, keeper);
    exec.wait(a, reset);
    exec.wait(b, reset);
    table.launch<multi_tensor_policy>(lower_key_agent{x.table.const_view(), screen.first_nonfinite()}, a);
    table.launch<multi_tensor_policy>(lower_key_agent{y.table.const_view(), screen.first_nonfinite()}, b);
    exec.record(lowered, a);
    exec.wait(keeper, lowered);  // but not for b
    screen.read_key(keeper);
    std::string found = error_of([&] { exec.synchronize(a); });
    const std::string second = error_of([&] { exec.synchronize(b); });
    const std::string third = error_of([&] { exec.synchronize(keeper); });
    for (const std::string* e : {&second, &third}) found += *e;
    REQUIRE_THAT(found, Contains("race on device 0's allocation") && Contains("updates atomically") && Contains("stream 'b'") &&
                            Contains("copy_async") && Contains("stream 'keeper'"));
    REQUIRE_THAT(found, !Contains("stream 'a'"));  // a and b lowered the key at once: atomics
    std::vector<nonfinite_key> key(1);
    exec.copy_to_host_now(key.data(), screen.first_nonfinite(), sizeof(nonfinite_key));
    REQUIRE(key[0] == towerpipe::detail::make_nonfinite_key(0, 17, 0));
  }
}
