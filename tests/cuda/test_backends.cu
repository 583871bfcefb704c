// Tower functions run on pool threads, where Catch assertions are unsafe: there they throw, which fails
// the step with the tower named.
//
// Every backend for GPU towers (device0, p2p_tree, sharded, host) x layout x optimizer, for 1..8 towers on the GPU(s) present (several towers
// per device where there are fewer devices), against the exec::host pipeline: after 10 steps on fresh
// random gradients every replica must equal the host's parameters bitwise. Replicas other than the
// root's are poisoned before each step, so a replica the broadcast misses shows. Each runs unchecked (one
// fused pass) and checked (screen + apply, kernels/screen.hpp) with clipping on and a NaN in one step,
// which every backend must skip, naming the tower, variable and element as the host does.
#include <towerpipe/cuda.cuh>
#include <towerpipe/io/checkpoint.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <type_traits>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

namespace {

const variable_set test_variables{{"w", {300, 70}}, {"b", {70}}, {"s", {}}, {"odd", {5003}}};
const std::vector<input_spec> test_inputs{{"x", dtype::float32, {1}}};

// 8 unless TOWERPIPE_TEST_MAX_TOWERS says fewer (the sanitizer runs, which are ~100x slower).
std::size_t max_towers() {
  const char* text = std::getenv("TOWERPIPE_TEST_MAX_TOWERS");
  return text != nullptr ? std::strtoul(text, nullptr, 10) : 8;
}

// One step's gradients: [tower][variable]; a plan: [step][tower][variable].
using step_gradients = std::vector<std::vector<std::vector<float>>>;
using gradient_plan = std::vector<step_gradients>;

gradient_plan draw_plan(random_source& random, std::size_t towers, int steps) {
  gradient_plan plan(static_cast<std::size_t>(steps));
  for (auto& step : plan) {
    step.resize(towers);
    for (auto& tower : step) {
      for (const variable& v : test_variables) tower.push_back(random.wide(v.size));
    }
  }
  return plan;
}

// One step's gradients of one tower, from the plan: copied on the host, or to the tower's device.
template <class Context>
void write_host_gradients(Context& tower, const step_gradients& step) {
  for (std::size_t v = 0; v < test_variables.count(); ++v)
    tower.write_gradient(v, step[tower.tower()][v].data(), step[tower.tower()][v].size());
}
template <class Context>
void write_device_gradients(Context& tower, const step_gradients& step) {
  for (std::size_t v = 0; v < test_variables.count(); ++v) {
    const std::vector<float>& g = step[tower.tower()][v];
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(tower.gradient(v).data(), g.data(), g.size() * sizeof(float),
                                         cudaMemcpyHostToDevice, tower.stream()));
  }
  TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower.stream()));  // g lives on the host in the test's plan
}

// Runs plan steps [first, last) on a pipeline of examples x 1 input "x"; returns the last step's stats.
template <class Pipeline>
step_stats run_plan(Pipeline& p, const gradient_plan& plan, std::size_t first, std::size_t last, std::size_t examples) {
  const std::vector<float> x(examples, 1.0f);
  batch b;
  b.add("x", x.data(), examples, {1});
  step_stats stats;
  for (std::size_t s = first; s < last; ++s) {
    stats = p.step(b, [&](typename Pipeline::tower_context& tower) {
      if constexpr (std::is_same_v<typename Pipeline::exec_policy, exec::host>) write_host_gradients(tower, plan[s]);
      else write_device_gradients(tower, plan[s]);
      return 0.0;
    });
  }
  return stats;
}

template <class Optim>
std::vector<std::vector<float>> host_reference(const gradient_plan& plan, std::size_t towers, std::size_t examples,
                                               const typename Optim::hyper_parameters& h,
                                               const std::vector<std::vector<float>>& initial,
                                               const pipeline_options& options) {
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<float>>;
  pipeline_options host_options = options;
  host_options.time_backends = 0;  // reduce::automatic's only
  trainer p(test_variables, test_inputs, towers, h, host_options);
  for (std::size_t v = 0; v < initial.size(); ++v) p.set_parameter(v, initial[v].data(), initial[v].size());
  run_plan(p, plan, 0, plan.size(), examples);
  std::vector<std::vector<float>> result;
  for (std::size_t v = 0; v < test_variables.count(); ++v) result.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
  return result;
}

template <class Buffer>
std::vector<float> read_variable(const Buffer& buffer, std::size_t v) {
  std::vector<float> host(buffer.view(v).size());
  TOWERPIPE_CUDA_CHECK(cudaMemcpy(host.data(), buffer.data(v), host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

// The step of a checked run whose gradients hold a NaN: tower towers - 1, variable "odd", element 4000.
constexpr std::size_t nan_step = 3;

template <class Reduce, class Optim, class Layout>
void check_backend(std::size_t towers, const typename Optim::hyper_parameters& h, std::uint64_t salt,
                   const pipeline_options& options) {
  random_source random(salt);
  const bool checked = options.on_nonfinite != nonfinite_policy::unchecked;
  INFO(Reduce::name << " " << Optim::name << " " << Layout::name << ", " << towers << " towers, "
                    << (checked ? "checked and clipped" : "unchecked") << ", seed " << random.seed());
  const int steps = 10;
  const std::size_t examples = 3 * towers - 1;  // uneven: distinct weights
  gradient_plan plan = draw_plan(random, towers, steps);
  if (checked) plan[nan_step][towers - 1][3][4000] = std::nanf("");
  std::vector<std::vector<float>> initial;
  for (const variable& v : test_variables) initial.push_back(random.normal(v.size));
  const auto expected = host_reference<Optim>(plan, towers, examples, h, initial, options);

  using trainer = pipeline<exec::cuda, Reduce, Optim, Layout>;
  trainer p(test_variables, test_inputs, towers, h, options);
  for (std::size_t v = 0; v < initial.size(); ++v) p.set_parameter(v, initial[v].data(), initial[v].size());
  auto& space = p.execution_space();
  for (std::size_t s = 0; s < plan.size(); ++s) {
    for (std::size_t t = 1; t < towers; ++t) {
      // On the replica's own device, finished there: the towers' non-blocking streams do not wait for
      // the default stream, and cudaDeviceSynchronize waits for the current device only.
      const towerpipe::detail::device_guard on(space.device(t));
      for (std::size_t v = 0; v < test_variables.count(); ++v)
        TOWERPIPE_CUDA_CHECK(cudaMemset(space.replica(t).data(v), 0xFF, space.replica(t).view(v).size() * sizeof(float)));  // NaN
      REQUIRE_CUDA(cudaDeviceSynchronize());
    }
    const step_stats stats = run_plan(p, plan, s, s + 1, examples);
    if (checked && s == nan_step) {
      REQUIRE(stats.skipped);
      CHECK(stats.nonfinite->tower == std::optional<std::size_t>(towers - 1));
      CHECK(stats.nonfinite->variable_name == "odd");
      CHECK(stats.nonfinite->element == 4000);
      // A skipped step writes no replica: restore the poisoned ones from tower 0's.
      for (std::size_t t = 1; t < towers; ++t) {
        const towerpipe::detail::device_guard on(space.device(t));
        for (std::size_t v = 0; v < test_variables.count(); ++v)
          REQUIRE_CUDA(cudaMemcpy(space.replica(t).data(v), space.replica(0).data(v),
                                  space.replica(t).view(v).size() * sizeof(float), cudaMemcpyDefault));
        REQUIRE_CUDA(cudaDeviceSynchronize());  // a device-to-device cudaMemcpy may return before it is done
      }
    } else if (checked) {
      CHECK_FALSE(stats.skipped);
      CHECK(stats.clip_coefficient < 1.0);
    }
  }
  CHECK(p.steps_done() == (checked ? steps - 1 : steps));
  for (std::size_t t = 0; t < towers; ++t) {
    INFO("replica " << t);
    for (std::size_t v = 0; v < test_variables.count(); ++v)
      CHECK(first_bitwise_difference(read_variable(space.replica(t), v), expected[v]) == -1);
  }
}

// direct: pipeline_options::direct_device_access; false makes the backends copy every tower's buffers
// as they do between devices without peer access, which one GPU can then test.
template <class Reduce, class Layout>
void check_all_optimizers(std::uint64_t salt, bool direct = true) {
  optim::sgd::hyper_parameters momentum;
  momentum.lr = 0.05;
  momentum.momentum = 0.9;
  momentum.nesterov = true;
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.1;
  // The single fused pass, and the checked one (screen + apply) with clipping and a NaN step.
  pipeline_options unchecked, checked;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = 1.0;
  unchecked.direct_device_access = checked.direct_device_access = direct;
  for (const pipeline_options& options : {unchecked, checked}) {
    for (std::size_t towers = 1; towers <= max_towers(); ++towers) {
      check_backend<Reduce, optim::sgd, Layout>(towers, momentum, salt + towers, options);
      check_backend<Reduce, optim::adam, Layout>(towers, adam, salt + 10 + towers, options);
      check_backend<Reduce, optim::adamw, Layout>(towers, optim::adamw::hyper_parameters{}, salt + 20 + towers, options);
    }
  }
}

}  // namespace

TEST_CASE("device0 equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::device0, layout::flat<float>>(100);
}
TEST_CASE("device0 equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::device0, layout::per_variable<float>>(200);
}
TEST_CASE("sharded equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::sharded, layout::flat<float>>(300);
}
TEST_CASE("sharded equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::sharded, layout::per_variable<float>>(400);
}

TEST_CASE("device0, p2p_tree and sharded copying instead of addressing other towers' buffers equal the host bitwise",
          "[gpu][copies]") {
  check_all_optimizers<reduce::device0, layout::flat<float>>(500, false);
  check_all_optimizers<reduce::p2p_tree, layout::per_variable<float>>(600, false);
  check_all_optimizers<reduce::sharded, layout::flat<float>>(700, false);
  check_all_optimizers<reduce::sharded, layout::per_variable<float>>(800, false);
}

// Narrower vector I/O than the default policy's four floats.
struct vector_width_1 : multi_tensor_policy {
  static constexpr unsigned vector_elements = 1;
};
struct vector_width_2 : multi_tensor_policy {
  static constexpr unsigned vector_elements = 2;
};

TEST_CASE("device backends take the pipeline's options and narrower vectors, equal to the host pipeline bitwise",
          "[gpu][options]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  // Gradient poisoning, and dynamic loss scaling (its NaN step skipped, its scale grown every 3 steps);
  // both checked and clipped, against the host pipeline with the same options.
  pipeline_options poisoned, scaled;
  poisoned.poison_gradients = true;
  poisoned.max_grad_norm = scaled.max_grad_norm = 1.0;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  scaled.loss_scale.initial_scale = 2.0;
  scaled.loss_scale.growth_interval = 3;
  for (const pipeline_options& options : {poisoned, scaled}) {
    for (std::size_t towers : {std::size_t(1), std::size_t(3), std::size_t(4)}) {
      if (towers > max_towers()) continue;
      check_backend<reduce::device0, optim::adam, layout::flat<float>>(towers, adam, 900 + towers, options);
      check_backend<reduce::p2p_tree, optim::adam, layout::per_variable<float>>(towers, adam, 910 + towers, options);
      check_backend<reduce::sharded, optim::adam, layout::flat<float>>(towers, adam, 920 + towers, options);
    }
  }
  pipeline_options unchecked, checked;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = 1.0;
  for (const pipeline_options& options : {unchecked, checked}) {
    for (std::size_t towers : {std::size_t(1), std::size_t(2), std::size_t(5)}) {
      if (towers > max_towers()) continue;
      check_backend<reduce::device0_with<vector_width_1>, optim::adam, layout::flat<float>>(towers, adam, 930 + towers, options);
      check_backend<reduce::device0_with<vector_width_2>, optim::adam, layout::flat<float>>(towers, adam, 940 + towers, options);
    }
  }
}

// reduce::sharded holds on each tower's device only its slice of the state: whole 4096-element chunks
// (multi_tensor_policy), each owner within one chunk of an equal share of the parameters.
TEST_CASE("sharded spreads the optimizer state over the towers, about 1/N each", "[gpu][backends]") {
  // The owners' compact storage pads each variable to a multiple of 64 elements (plan/owner_slices.hpp).
  double parameters = 0.0;
  for (const variable& v : test_variables) parameters += static_cast<double>((v.size + 63) / 64 * 64);
  const double slot_bytes = 4.0 * parameters;  // fp32
  for (std::size_t towers = 1; towers <= max_towers(); ++towers) {
    pipeline<exec::cuda, reduce::sharded, optim::adam, layout::flat<float>> p(test_variables, test_inputs, towers, {});
    const std::vector<std::size_t> bytes = p.optimizer_state_bytes_per_tower();
    REQUIRE(bytes.size() == towers);
    double total = 0.0;
    for (std::size_t t = 0; t < towers; ++t) {
      INFO(towers << " towers, tower " << t << ": " << bytes[t] << " bytes");
      total += static_cast<double>(bytes[t]);
      CHECK(static_cast<double>(bytes[t]) <= 2.0 * (slot_bytes / static_cast<double>(towers) + 4.0 * 4096));
    }
    CHECK(total == 2.0 * slot_bytes);  // Adam's two slots, once in all
    std::printf("reduce::sharded, %zu towers: optimizer state per tower (bytes):", towers);
    for (std::size_t b : bytes) std::printf(" %zu", b);
    std::printf(" (device0 holds %.0f on tower 0)\n", 2.0 * slot_bytes);
  }
}
// One GPU: device0 (reduce/choice/chooser.hpp, rule 3); timing all four candidates on the first step
// (each trial from the step's start, compared bit for bit) leaves the run bitwise the host's.
TEST_CASE("reduce::automatic picks device0 on one GPU, and timing every candidate changes no bit", "[gpu][backends][automatic]") {
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  pipeline_options unchecked, checked;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = 1.0;
  for (pipeline_options options : {unchecked, checked}) {
    for (std::size_t trials : {0, 2}) {
      options.time_backends = trials;
      check_backend<reduce::automatic, optim::adam, layout::flat<float>>(4, adam, 900 + trials, options);
    }
  }
  pipeline_options one_device;
  one_device.devices = {0};
  pipeline<exec::cuda, reduce::automatic, optim::adam, layout::flat<float>> p(test_variables, test_inputs, 4, adam, one_device);
  CHECK(std::string(p.backend_name()) == "device0");
  CHECK(p.backend_reason().find("4 on GPU 0), one device") != std::string::npos);
}

TEST_CASE("p2p_tree equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::p2p_tree, layout::flat<float>>(300);
}
TEST_CASE("p2p_tree equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::p2p_tree, layout::per_variable<float>>(400);
}
TEST_CASE("reduce::host with GPU towers equals the host pipeline bitwise (flat)", "[gpu][backends]") {
  check_all_optimizers<reduce::host, layout::flat<float>>(500);
}
TEST_CASE("reduce::host with GPU towers equals the host pipeline bitwise (per_variable)", "[gpu][backends]") {
  check_all_optimizers<reduce::host, layout::per_variable<float>>(600);
}

namespace {

// A kernel that keeps a tower's stream busy for about `cycles` clock cycles: the compute of a layer's
// backward, between two gradient_ready marks.
__global__ void spin_for(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Gradient buckets (one variable a bucket) marked ready in reverse order while each tower's stream is
// kept busy between marks: every replica equals the unbucketed host pipeline bitwise, checked and
// unchecked; every backend takes every bucket during the towers, except where it copies whole buffers
// (no direct access to another tower's; reduce::host downloads them anyway) and p2p_tree with
// poison_gradients (its edges write partial sums into gradients the poison check reads at return).
// uneven: only the even towers mark; the odd ones complete every bucket by returning, before or after
// the even ones' marks (then a bucket's pass must wait for all of an odd tower's work).
template <class Reduce>
void check_buckets(std::size_t towers, bool direct, bool uneven, const pipeline_options& base, std::uint64_t salt) {
  random_source random(salt);
  INFO(Reduce::name << ", " << towers << " towers, direct " << direct << ", uneven " << uneven << ", seed " << random.seed());
  const std::size_t examples = 3 * towers - 1;
  const gradient_plan plan = draw_plan(random, towers, 4);
  std::vector<std::vector<float>> initial;
  for (const variable& v : test_variables) initial.push_back(random.normal(v.size));
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  const auto expected = host_reference<optim::adam>(plan, towers, examples, adam, initial, base);

  pipeline_options options = base;
  options.direct_device_access = direct;
  options.buckets.cap_bytes = 1;
  using trainer = pipeline<exec::cuda, Reduce, optim::adam, layout::flat<float>>;
  trainer p(test_variables, test_inputs, towers, adam, options);
  for (std::size_t v = 0; v < initial.size(); ++v) p.set_parameter(v, initial[v].data(), initial[v].size());
  const std::vector<float> x(examples, 1.0f);
  batch b;
  b.add("x", x.data(), examples, {1});
  for (const step_gradients& step : plan) {
    const step_stats stats = p.step(b, [&](typename trainer::tower_context& tower) {
      for (std::size_t v = test_variables.count(); v-- > 0;) {
        const std::vector<float>& g = step[tower.tower()][v];
        TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(tower.gradient(v).data(), g.data(), g.size() * sizeof(float),
                                             cudaMemcpyHostToDevice, tower.stream()));
        if (!uneven || tower.tower() % 2 == 0) tower.gradient_ready(v);
        spin_for<<<1, 1, 0, tower.stream()>>>(200000);
      }
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower.stream()));
      return 0.0;
    });
    // Without direct access the device backends copy other towers' buffers (a tower's own never).
    const bool overlapped = std::is_same_v<Reduce, reduce::host> ||
                            ((direct || towers == 1) && !(std::is_same_v<Reduce, reduce::p2p_tree> && base.poison_gradients));
    CHECK(stats.buckets == test_variables.count());
    if (uneven && towers > 1) CHECK(stats.buckets_during_towers <= (overlapped ? stats.buckets : 0));
    else CHECK(stats.buckets_during_towers == (overlapped ? stats.buckets : 0));
  }
  auto& space = p.execution_space();
  for (std::size_t t = 0; t < towers; ++t) {
    INFO("replica " << t);
    for (std::size_t v = 0; v < test_variables.count(); ++v)
      CHECK(first_bitwise_difference(read_variable(space.replica(t), v), expected[v]) == -1);
  }
}

template <class Reduce>
void check_buckets_everywhere(std::uint64_t salt) {
  pipeline_options unchecked, checked, poisoned;
  unchecked.on_nonfinite = nonfinite_policy::unchecked;
  checked.max_grad_norm = poisoned.max_grad_norm = 1.0;
  poisoned.poison_gradients = true;
  for (const pipeline_options& options : {unchecked, checked, poisoned}) {
    for (std::size_t towers = 1; towers <= max_towers(); towers *= 2) {
      for (const bool direct : {true, false}) {
        for (const bool uneven : {false, true}) check_buckets<Reduce>(towers, direct, uneven, options, salt + towers);
      }
    }
  }
}

}  // namespace

TEST_CASE("gradient buckets marked during the towers change no bit on any GPU backend", "[gpu][backends][overlap]") {
  check_buckets_everywhere<reduce::device0>(700);
  check_buckets_everywhere<reduce::p2p_tree>(710);
  check_buckets_everywhere<reduce::sharded>(720);
  check_buckets_everywhere<reduce::host>(730);
}

namespace {

// Mixed precision on GPU towers (any backend) against the host's mixed pipeline: the fp32 master
// bitwise, every replica's 16-bit patterns equal to the host towers' rounded copy.
// mark_buckets: one gradient bucket a variable, marked ready in reverse order while the tower's stream
// is kept busy between marks; with direct access every backend takes every bucket during the towers.
template <class Reduce, class Half, class Layout>
void check_mixed_on_gpu(std::size_t towers, std::uint64_t salt, const pipeline_options& gpu_options = {}, bool mark_buckets = false) {
  random_source random(salt);
  INFO(Reduce::name << " mixed " << Layout::name << ", " << towers << " towers, buckets " << mark_buckets << ", seed "
                    << random.seed());
  using host_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<Half>>;
  using gpu_trainer = pipeline<exec::cuda, Reduce, optim::adam, Layout>;
  pipeline_options options = gpu_options;
  options.max_grad_norm = 1.0;
  if (mark_buckets) options.buckets.cap_bytes = 1;
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  pipeline_options host_options;
  host_options.max_grad_norm = options.max_grad_norm;
  host_trainer reference(test_variables, test_inputs, towers, h, host_options);
  gpu_trainer p(test_variables, test_inputs, towers, h, options);
  for (std::size_t v = 0; v < test_variables.count(); ++v) {
    const std::vector<float> initial = random.normal(test_variables[v].size);
    reference.set_parameter(v, initial.data(), initial.size());
    p.set_parameter(v, initial.data(), initial.size());
  }
  const std::size_t examples = 3 * towers - 1;
  const std::vector<float> x(examples, 1.0f);
  batch b;
  b.add("x", x.data(), examples, {1});
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<std::vector<Half>>> g(towers);
    for (auto& tower : g) {
      for (const variable& v : test_variables) {
        std::vector<Half> values;
        for (float value : random.wide(v.size)) values.push_back(Half(value * 1e-3f));
        tower.push_back(values);
      }
    }
    reference.step(b, [&](typename host_trainer::tower_context& tower) {
      for (std::size_t v = 0; v < test_variables.count(); ++v)
        tower.write_gradient(v, g[tower.tower()][v].data(), g[tower.tower()][v].size());
      return 0.0;
    });
    const step_stats stats = p.step(b, [&](typename gpu_trainer::tower_context& tower) {
      for (std::size_t v = test_variables.count(); v-- > 0;) {
        const auto& values = g[tower.tower()][v];
        TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(tower.gradient(v).data(), values.data(), values.size() * sizeof(Half),
                                             cudaMemcpyHostToDevice, tower.stream()));
        if (!mark_buckets) continue;
        tower.gradient_ready(v);
        spin_for<<<1, 1, 0, tower.stream()>>>(200000);
      }
      TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower.stream()));
      return 0.0;
    });
    if (mark_buckets && options.direct_device_access) CHECK(stats.buckets_during_towers == stats.buckets);
  }
  for (std::size_t v = 0; v < test_variables.count(); ++v) {
    CHECK(first_bitwise_difference(p.parameter(v), reference.parameter(v)) == -1);
    const auto expected = reference.execution_space().shared_parameters().view(v);
    for (std::size_t t = 0; t < towers; ++t) {
      std::vector<Half> replica(expected.size());
      REQUIRE_CUDA(cudaMemcpy(replica.data(), p.execution_space().replica(t).data(v), replica.size() * sizeof(Half),
                              cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < replica.size(); ++i) REQUIRE(replica[i].bits == expected[i].bits);
    }
  }
}

// Each backend with bf16 (flat) and fp16 (per_variable) towers, 1..8 towers.
template <class Reduce>
void check_mixed_for_tower_counts(std::uint64_t salt, const pipeline_options& options = {}, bool mark_buckets = false) {
  for (std::size_t towers = 1; towers <= max_towers(); ++towers) {
    check_mixed_on_gpu<Reduce, bfloat16, layout::flat<bfloat16>>(towers, salt + towers, options, mark_buckets);
    check_mixed_on_gpu<Reduce, float16, layout::per_variable<float16>>(towers, salt + 20 + towers, options, mark_buckets);
  }
}

}  // namespace

TEST_CASE("device0 with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::device0>(700);
}

// Each owner keeps its slice of the fp32 master; the copying paths (direct_device_access off) copy the
// 16-bit gradients in and the rounded replicas out.
TEST_CASE("sharded with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::sharded>(750);
  pipeline_options copied;
  copied.direct_device_access = false;
  check_mixed_for_tower_counts<reduce::sharded>(800, copied);
}

// p2p_tree's fp32 partial sums beside the 16-bit gradients, in place and copied raw or as partials.
TEST_CASE("p2p_tree with bf16 and fp16 towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::p2p_tree>(740);
  pipeline_options copied;
  copied.direct_device_access = false;
  check_mixed_for_tower_counts<reduce::p2p_tree>(760, copied);
}

// 16-bit downloads and uploads, the fp32 master on the host.
TEST_CASE("reduce::host with bf16 and fp16 GPU towers equals the host's mixed-precision pipeline bitwise", "[gpu][backends]") {
  check_mixed_for_tower_counts<reduce::host>(780);
}

TEST_CASE("16-bit towers' gradient buckets taken during the towers change no bit on any GPU backend",
          "[gpu][backends][overlap]") {
  check_mixed_for_tower_counts<reduce::device0>(800, {}, true);
  check_mixed_for_tower_counts<reduce::p2p_tree>(820, {}, true);
  check_mixed_for_tower_counts<reduce::host>(840, {}, true);
  check_mixed_for_tower_counts<reduce::sharded>(860, {}, true);
}

// reduce::automatic with 16-bit GPU towers: on one GPU it runs device0, and timing every candidate on the
// first step (each trial compared bit for bit, the fp32 master too) leaves the run bitwise the host's.
TEST_CASE("reduce::automatic with bf16 towers: timing every candidate changes no bit", "[gpu][backends][automatic]") {
  pipeline_options timed;
  timed.time_backends = 2;
  for (std::size_t towers : {std::size_t{1}, std::size_t{4}})
    check_mixed_on_gpu<reduce::automatic, bfloat16, layout::flat<bfloat16>>(towers, 880 + towers, timed);
}

namespace {
using small_trainer = pipeline<exec::cuda, reduce::device0, optim::adam, layout::flat<float>>;
const variable_set small_variables{{"w", {16}}};

// What the small tests' towers compute: a zero gradient for "w", on the tower's stream.
template <class Context>
double write_zero_gradient(Context& tower) {
  TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(tower.gradient(0).data(), 0, 16 * sizeof(float), tower.stream()));
  return 0.0;
}

// `steps` steps of write_zero_gradient with `towers` towers and `Reduce`; returns the last step's stats.
template <class Reduce>
step_stats zero_gradient_steps(std::size_t towers, int steps, const pipeline_options& options = {}) {
  using trainer = pipeline<exec::cuda, Reduce, optim::adam, layout::flat<float>>;
  trainer p(small_variables, test_inputs, towers, optim::adam::hyper_parameters{}, options);
  const std::vector<float> x(2 * towers, 1.0f);
  batch b;
  b.add("x", x.data(), x.size(), {1});
  step_stats last;
  for (int s = 0; s < steps; ++s) last = p.step(b, write_zero_gradient<typename trainer::tower_context>);
  return last;
}
}  // namespace

TEST_CASE("shards reach their towers: row- and column-major, staged ahead, in order", "[gpu][staging]") {
  const std::size_t towers = 3, examples = 7, features = 4;
  small_trainer p(small_variables, {{"rows", dtype::float32, {features}}, {"cols", dtype::int32, {features}}}, towers,
                  optim::adam::hyper_parameters{});
  std::vector<float> rows(examples * features);
  std::vector<std::int32_t> cols(examples * features);
  const auto batch_of = [&](int offset) {
    for (std::size_t e = 0; e < examples; ++e) {
      for (std::size_t f = 0; f < features; ++f) {
        rows[e * features + f] = static_cast<float>(offset + 10 * e + f);
        cols[f * examples + e] = static_cast<std::int32_t>(offset + 10 * e + f);
      }
    }
  };
  std::vector<std::vector<float>> rows_seen(towers);
  std::vector<std::vector<std::int32_t>> cols_seen(towers);
  const auto read_shard = [&](small_trainer::tower_context& tower) {
    const auto r = tower.input<float>("rows");
    const auto c = tower.input<std::int32_t>("cols");
    rows_seen[tower.tower()].resize(r.examples() * features);
    cols_seen[tower.tower()].resize(c.examples() * features);
    if (c.example_stride() != 1 || c.feature_stride() != c.examples())
      throw std::logic_error("a column-major shard must arrive column-major with its own example count as stride");
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(rows_seen[tower.tower()].data(), r.data(), rows_seen[tower.tower()].size() * 4,
                                 cudaMemcpyDeviceToHost, tower.stream()));
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(cols_seen[tower.tower()].data(), c.data(), cols_seen[tower.tower()].size() * 4,
                                 cudaMemcpyDeviceToHost, tower.stream()));
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower.stream()));
    return write_zero_gradient(tower);
  };
  const auto check_seen = [&](int offset) {
    const std::size_t firsts[] = {0, 3, 5}, counts[] = {3, 2, 2};
    for (std::size_t t = 0; t < towers; ++t) {
      INFO("tower " << t << ", batch offset " << offset);
      for (std::size_t e = 0; e < counts[t]; ++e) {
        for (std::size_t f = 0; f < features; ++f) {
          const int expected = offset + static_cast<int>(10 * (firsts[t] + e) + f);
          CHECK(rows_seen[t][e * features + f] == static_cast<float>(expected));
          CHECK(cols_seen[t][f * counts[t] + e] == expected);
        }
      }
    }
  };
  batch b;
  b.add("rows", rows.data(), examples, {features}).add("cols", cols.data(), examples, {features}, storage_order::column_major);
  batch_of(0);
  p.stage(b);
  batch_of(1000);  // the first batch was packed at stage(): changing the host data now must not matter
  p.stage(b);
  p.step(read_shard);
  check_seen(0);
  p.step(read_shard);
  check_seen(1000);
}

TEST_CASE("a tower function returning nothing reports its loss through device_loss()", "[gpu][staging]") {
  small_trainer p(small_variables, test_inputs, 2, optim::adam::hyper_parameters{});
  const std::vector<float> x(4, 1.0f);
  batch b;
  b.add("x", x.data(), 4, {1});
  const step_stats stats = p.step(b, [](small_trainer::tower_context& tower) {
    const float loss = 1.5f + static_cast<float>(tower.tower());
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(tower.device_loss(), &loss, sizeof loss, cudaMemcpyHostToDevice, tower.stream()));
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(tower.stream()));
    write_zero_gradient(tower);
  });
  CHECK(stats.tower_loss == std::vector<double>{1.5, 2.5});
  CHECK(stats.loss == Approx(2.0));
}

TEST_CASE("bad towers and devices are clear errors, parameters stay and the pipeline still works", "[gpu][errors]") {
  int devices = 0;
  REQUIRE_CUDA(cudaGetDeviceCount(&devices));
  pipeline_options missing_device;
  missing_device.devices = {0, devices};
  CHECK_THROWS_WITH(small_trainer(small_variables, test_inputs, 2, optim::adam::hyper_parameters{}, missing_device),
                    Catch::Contains("tower 1: CUDA device " + std::to_string(devices) + " does not exist"));

  small_trainer p(small_variables, test_inputs, 2, optim::adam::hyper_parameters{});
  const std::vector<float> initial(16, 0.25f), x(4, 1.0f);
  p.set_parameter(0, initial.data(), initial.size());
  batch b;
  b.add("x", x.data(), 4, {1});
  const auto good = write_zero_gradient<small_trainer::tower_context>;
  CHECK_THROWS_WITH(p.step(b, [](small_trainer::tower_context&) { return 0.0; }),
                    Catch::Contains("tower 0 did not write the gradient of variable 'w'"));
  CHECK_THROWS_WITH(p.step(b, [&](small_trainer::tower_context& tower) -> double {
                      good(tower);
                      if (tower.tower() == 1) throw std::runtime_error("cuBLAS said no");
                      return 0.0;
                    }),
                    Catch::Contains("tower 1 threw: cuBLAS said no"));
  CHECK(p.steps_done() == 0);
  for (float v : p.parameter(0)) CHECK(v == 0.25f);
  p.step(b, good);
  CHECK(p.steps_done() == 1);
  // Zero gradients: Adam leaves the parameters where they were.
  for (float v : p.parameter(0)) CHECK(v == 0.25f);
}

namespace {

// Runs 3 steps of `towers` towers with a timeline; returns its spans.
template <class Reduce>
std::vector<timeline::span> traced_steps(std::size_t towers) {
  timeline trace;
  pipeline_options options;
  options.trace = &trace;
  zero_gradient_steps<Reduce>(towers, 3, options);
  return trace.spans();
}

std::size_t count_spans(const std::vector<timeline::span>& spans, std::int64_t step, const std::string& row,
                         const std::string& name_prefix) {
  std::size_t count = 0;
  for (const timeline::span& s : spans) {
    if (s.step == step && s.row == row && s.name.rfind(name_prefix, 0) == 0 && s.duration_us >= 0) ++count;
  }
  return count;
}

}  // namespace

TEST_CASE("the timeline holds what the devices ran, on the host clock", "[gpu][staging]") {
  const std::vector<timeline::span> spans = traced_steps<reduce::device0>(2);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    double split_start = -1, device_reduce_start = -1, device_reduce_end = -1;
    for (const timeline::span& s : spans) {
      if (s.step != step) continue;
      if (s.row == "split") split_start = s.start_us;
      if (s.row == "reduce (GPU)") {
        device_reduce_start = s.start_us;
        device_reduce_end = s.start_us + s.duration_us;
      }
    }
    for (std::size_t t = 0; t < 2; ++t) {
      INFO("tower " << t);
      CHECK(count_spans(spans, step, "tower " + std::to_string(t) + " (GPU)", "compute") == 1);
      CHECK(count_spans(spans, step, "tower " + std::to_string(t) + " (GPU copy)", "split copy") == 1);
    }
    REQUIRE(split_start >= 0);
    // The device's times, converted, fall after the step began (1 ms slack for the clock alignment).
    CHECK(device_reduce_start >= split_start - 1000);
    CHECK(device_reduce_end >= device_reduce_start);
  }
}

TEST_CASE("the timeline shows p2p_tree's edges and pulls on the towers' rows", "[gpu][staging]") {
  // 4 towers: round 0 edges 0+1 and 2+3, root edge 0+2, whose pass also writes towers 1 and 2 (tower 0's
  // children in the tree); tower 3 pulls from tower 2.
  const std::vector<timeline::span> spans = traced_steps<reduce::p2p_tree>(4);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    CHECK(count_spans(spans, step, "reduce (GPU)", "p2p_tree root") == 1);
    CHECK(count_spans(spans, step, "tower 0 (GPU)", "tree edge: + tower 1") == 1);
    CHECK(count_spans(spans, step, "tower 2 (GPU)", "tree edge: + tower 3") == 1);
    CHECK(count_spans(spans, step, "tower 1 (GPU)", "broadcast") == 0);
    CHECK(count_spans(spans, step, "tower 2 (GPU)", "broadcast") == 0);
    CHECK(count_spans(spans, step, "tower 3 (GPU)", "broadcast: pull from tower 2") == 1);
  }
}

namespace {

// The second of two steps (the first warms up).
template <class Reduce>
step_stats one_step(std::size_t towers) {
  return zero_gradient_steps<Reduce>(towers, 2);
}

}  // namespace

TEST_CASE("device backends time reduce and broadcast on the device, inside the step", "[gpu][staging]") {
  const step_stats device0 = one_step<reduce::device0>(3);
  CHECK(device0.stages.reduce > 0);
  CHECK(device0.stages.broadcast == 0);  // fused into the reduce kernel
  CHECK(device0.stages.reduce <= device0.seconds);
  const step_stats tree = one_step<reduce::p2p_tree>(4);
  CHECK(tree.stages.reduce > 0);
  CHECK(tree.stages.broadcast > 0);  // tower 3 pulls from tower 2
  CHECK(tree.stages.reduce + tree.stages.broadcast <= tree.seconds);
}

TEST_CASE("p2p_tree with two towers writes both replicas in the root's pass: no broadcast left", "[gpu][staging]") {
  CHECK(one_step<reduce::p2p_tree>(2).stages.broadcast == 0);
}

namespace {

// Host steps [0, 4), a checkpoint into a GPU pipeline with `Reduce` (other layout), steps [4, 8) there,
// a checkpoint back into a host pipeline, steps [8, 10): parameters and state bitwise those of 10 host
// steps without a break.
template <class Reduce>
void check_checkpoint_through_gpu(std::uint64_t salt) {
  using host_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
  using gpu_trainer = pipeline<exec::cuda, Reduce, optim::adam, layout::per_variable<float>>;
  random_source random(salt);
  INFO(Reduce::name << ", seed " << random.seed());
  const std::size_t towers = 3, examples = 8;
  const gradient_plan plan = draw_plan(random, towers, 10);
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  h.weight_decay = 0.1;
  const std::string path = "towerpipe_gpu_checkpoint_" + std::string(Reduce::name) + ".ckpt";

  host_trainer uninterrupted(test_variables, test_inputs, towers, h), first(test_variables, test_inputs, towers, h),
      last(test_variables, test_inputs, towers, h);
  for (std::size_t v = 0; v < test_variables.count(); ++v) {
    const std::vector<float> initial = random.normal(test_variables[v].size);
    uninterrupted.set_parameter(v, initial.data(), initial.size());
    first.set_parameter(v, initial.data(), initial.size());
  }
  run_plan(uninterrupted, plan, 0, 10, examples);
  run_plan(first, plan, 0, 4, examples);
  save_checkpoint(first, path);
  gpu_trainer middle(test_variables, test_inputs, towers, h);
  load_checkpoint(middle, path);
  run_plan(middle, plan, 4, 8, examples);
  save_checkpoint(middle, path);
  load_checkpoint(last, path);
  run_plan(last, plan, 8, 10, examples);
  std::remove(path.c_str());

  CHECK(last.steps_done() == 10);
  for (std::size_t v = 0; v < test_variables.count(); ++v) {
    INFO("variable " << test_variables[v].name);
    CHECK(first_bitwise_difference(last.parameter(v), uninterrupted.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < uninterrupted.optimizer_state_slots(); ++slot)
      CHECK(first_bitwise_difference(last.optimizer_state(slot, v), uninterrupted.optimizer_state(slot, v)) == -1);
  }
}

}  // namespace

TEST_CASE("a checkpoint moves between the host and every GPU backend, and the run resumes bitwise", "[gpu][checkpoint]") {
  check_checkpoint_through_gpu<reduce::device0>(700);
  check_checkpoint_through_gpu<reduce::p2p_tree>(800);
  check_checkpoint_through_gpu<reduce::sharded>(850);
  check_checkpoint_through_gpu<reduce::host>(900);
}
