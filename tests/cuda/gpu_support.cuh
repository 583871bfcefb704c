#pragma once
// What the GPU tests (tests/cuda/test_*.cu, one translation unit per backend or feature so that the GPU
// build spreads over cores and none takes long alone) share: the test model, gradient plans written from
// the host, the host pipeline as the reference, and the checks every backend runs.
//
// Tower functions run on pool threads, where Catch assertions are unsafe: there they throw, which fails
// the step with the tower named.
//
// check_backend: a backend for GPU towers x layout x optimizer, for 1..8 towers on the GPU(s) present
// (several towers per device where there are fewer devices), against the exec::host pipeline: after 10
// steps on fresh random gradients every replica must equal the host's parameters bitwise. Replicas
// other than the root's are poisoned before each step, so a replica the broadcast misses shows. Each
// runs unchecked (one fused pass) and checked (screen + apply, kernels/screen.hpp) with clipping on and a
// NaN in one step, which every backend must skip, naming the tower, variable and element as the host does.
#include <towerpipe/cuda.cuh>
#include <towerpipe/io/checkpoint.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "reference_runs.hpp"
#include "test_support.hpp"

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

namespace gpu_tests {

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

const variable_set test_variables{{"w", {300, 70}}, {"b", {70}}, {"s", {}}, {"odd", {5003}}};
const std::vector<input_spec> test_inputs{{"x", dtype::float32, {1}}};

// Tower counts from min_towers() to max_towers(): 1 to 8 unless TOWERPIPE_TEST_MIN_TOWERS and
// TOWERPIPE_TEST_MAX_TOWERS say otherwise (the sanitizer runs, ~100x slower, take fewer; tests/run_gpu.sh's
// many_towers step 9 to 16 only).
inline std::size_t towers_from_environment(const char* name, std::size_t otherwise) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::strtoul(text, nullptr, 10) : otherwise;
}
inline std::size_t min_towers() { return towers_from_environment("TOWERPIPE_TEST_MIN_TOWERS", 1); }
inline std::size_t max_towers() { return towers_from_environment("TOWERPIPE_TEST_MAX_TOWERS", 8); }

// One step's gradients: [tower][variable]; a plan: [step][tower][variable].
using step_gradients = std::vector<std::vector<std::vector<float>>>;
using gradient_plan = std::vector<step_gradients>;

inline gradient_plan draw_plan(random_source& random, std::size_t towers, int steps) {
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
    for (std::size_t towers = min_towers(); towers <= max_towers(); ++towers) {
      check_backend<Reduce, optim::sgd, Layout>(towers, momentum, salt + towers, options);
      check_backend<Reduce, optim::adam, Layout>(towers, adam, salt + 10 + towers, options);
      check_backend<Reduce, optim::adamw, Layout>(towers, optim::adamw::hyper_parameters{}, salt + 20 + towers, options);
    }
  }
}



// Narrower vector I/O than the default policy's four floats.
struct vector_width_1 : multi_tensor_policy {
  static constexpr unsigned vector_elements = 1;
};
struct vector_width_2 : multi_tensor_policy {
  static constexpr unsigned vector_elements = 2;
};


// A kernel that keeps a tower's stream busy for about `cycles` clock cycles: the compute of a layer's
// backward, between two gradient_ready marks.
template <int = 0>
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
        spin_for<><<<1, 1, 0, tower.stream()>>>(200000);
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
      if (towers < min_towers()) continue;
      for (const bool direct : {true, false}) {
        for (const bool uneven : {false, true}) check_buckets<Reduce>(towers, direct, uneven, options, salt + towers);
      }
    }
  }
}



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
        spin_for<><<<1, 1, 0, tower.stream()>>>(200000);
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
  for (std::size_t towers = min_towers(); towers <= max_towers(); ++towers) {
    check_mixed_on_gpu<Reduce, bfloat16, layout::flat<bfloat16>>(towers, salt + towers, options, mark_buckets);
    check_mixed_on_gpu<Reduce, float16, layout::per_variable<float16>>(towers, salt + 20 + towers, options, mark_buckets);
  }
}


using small_trainer = pipeline<exec::cuda, reduce::device0, optim::adam, layout::flat<float>>;
const variable_set small_variables{{"w", {16}}};

// What the small tests' towers compute: a zero gradient for every variable, on the tower's stream.
template <class Context>
double write_zero_gradient(Context& tower) {
  for (std::size_t v = 0; v < tower.variables().count(); ++v)
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(tower.gradient(v).data(), 0, tower.variables()[v].size * sizeof(float), tower.stream()));
  return 0.0;
}

// `steps` steps of write_zero_gradient with `towers` towers and `Reduce`; returns the last step's stats.
template <class Reduce>
step_stats zero_gradient_steps(std::size_t towers, int steps, const pipeline_options& options = {},
                               const variable_set& variables = small_variables) {
  using trainer = pipeline<exec::cuda, Reduce, optim::adam, layout::flat<float>>;
  trainer p(variables, test_inputs, towers, optim::adam::hyper_parameters{}, options);
  const std::vector<float> x(2 * towers, 1.0f);
  batch b;
  b.add("x", x.data(), x.size(), {1});
  step_stats last;
  for (int s = 0; s < steps; ++s) last = p.step(b, write_zero_gradient<typename trainer::tower_context>);
  return last;
}


// Runs 3 steps of `towers` towers with a timeline, checked or unchecked; returns its spans.
template <class Reduce>
std::vector<timeline::span> traced_steps(std::size_t towers, bool checked = true, const variable_set& variables = small_variables) {
  timeline trace;
  pipeline_options options;
  options.trace = &trace;
  if (!checked) options.on_nonfinite = nonfinite_policy::unchecked;
  zero_gradient_steps<Reduce>(towers, 3, options, variables);
  return trace.spans();
}

// The names of the complete spans on `row` at `step`, sorted.
inline std::vector<std::string> span_names(const std::vector<timeline::span>& spans, std::int64_t step, const std::string& row) {
  std::vector<std::string> names;
  for (const timeline::span& s : spans)
    if (s.step == step && s.row == row && s.duration_us >= 0) names.push_back(s.name);
  std::sort(names.begin(), names.end());
  return names;
}

inline std::size_t count_spans(const std::vector<timeline::span>& spans, std::int64_t step, const std::string& row,
                         const std::string& name_prefix) {
  std::size_t count = 0;
  for (const timeline::span& s : spans) {
    if (s.step == step && s.row == row && s.name.rfind(name_prefix, 0) == 0 && s.duration_us >= 0) ++count;
  }
  return count;
}



// The second of two steps (the first warms up).
template <class Reduce>
step_stats one_step(std::size_t towers) {
  return zero_gradient_steps<Reduce>(towers, 2);
}



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


// Case `c` (tests/reference_runs.hpp) with `Reduce` on GPU towers against the host pipeline, step by
// step: parameters (the fp32 master), optimizer state and the step's report bitwise the host's.
template <class Reduce, class Layout, class Optim = optim::adam>
void check_on_gpu(std::size_t towers, const towerpipe_tests::run_case& c, std::uint64_t salt,
                  const variable_set& variables = test_variables) {
  random_source random(salt);
  INFO(Reduce::name << " " << Layout::name << " " << sizeof(typename Layout::value_type) << "-byte values, " << towers
                    << " GPU towers, seed " << random.seed());
  using trainer = pipeline<exec::cuda, Reduce, Optim, Layout>;
  const auto make = [&] {
    return std::make_unique<trainer>(variables, test_inputs, towers, typename Optim::hyper_parameters{}, c.options);
  };
  towerpipe_tests::compare_with_host<Layout, Optim>(variables, test_inputs, towers, c, random, make, [](int, trainer&) {});
}

// 16-bit GPU towers (bf16 flat, fp16 per_variable) through the steps' options, step by step against the
// host's mixed pipeline: a NaN and an infinity in one step (skipped; the key naming the tower, variable and
// element the host names), fp16 with dynamic loss scaling (overflowing steps skipped, the scale halved and
// grown again), gradient poisoning (the 16-bit poison pattern searched on the device), and a checkpoint
// saved after step 2 that a fresh GPU pipeline resumes from.
template <class Reduce>
void check_mixed_steps(std::uint64_t salt) {
  using towerpipe_tests::clipped;
  using towerpipe_tests::run_case;
  pipeline_options scaled;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  scaled.loss_scale.initial_scale = 1024;
  scaled.loss_scale.growth_interval = 2;
  pipeline_options poisoned = clipped({});
  poisoned.poison_gradients = true;
  check_on_gpu<Reduce, layout::flat<bfloat16>>(4, run_case{clipped({}), true, 4, 2}, salt);
  check_on_gpu<Reduce, layout::per_variable<float16>>(3, run_case{scaled, true, 6, 3}, salt + 1);
  check_on_gpu<Reduce, layout::flat<bfloat16>>(3, run_case{poisoned, false, 3}, salt + 2);
  check_on_gpu<Reduce, layout::per_variable<float16>>(2, run_case{poisoned, true, 3, 1}, salt + 3);
  check_on_gpu<Reduce, layout::flat<bfloat16>>(3, run_case{clipped({}), true, 4, -1, true}, salt + 4);
  check_on_gpu<Reduce, layout::per_variable<float16>>(2, run_case{scaled, false, 4, -1, true}, salt + 5);
}

}  // namespace gpu_tests
