#pragma once
// What the units of tests/mpi/sharded_equivalence.cpp share (see its top): the model, its tower and
// batches, the checks, and mode "equal" (every_optimizer). The host build is one unit; the GPU build
// (TOWERPIPE_TEST_GPU_TOWERS) compiles mode "equal" once per layout in units of its own
// (sharded_equivalence_gpu_<layout>.cu: the extern templates at the end), so that none takes long alone.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <towerpipe/comm/mpi.hpp>
#include <towerpipe/towerpipe.hpp>
#if defined(TOWERPIPE_TEST_GPU_TOWERS)
#include <cuda_runtime.h>

#include <towerpipe/cuda.cuh>
#endif

namespace towerpipe_mpi_test {

using namespace towerpipe;

// The sharded pipeline's towers: host, or (the GPU build) CUDA.
#if defined(TOWERPIPE_TEST_GPU_TOWERS)
using sharded_exec = exec::cuda;
#else
using sharded_exec = exec::host;
#endif

inline int rank = 0, processes = 1;
inline int failures = 0;
inline bool direct_device_access = true;  // the GPU build's mode "copied" turns it off

inline void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
  std::fflush(stdout);
}

inline constexpr std::size_t features = 7, targets = 5;

// A linear model with a scale vector: loss = mean over examples of 0.5 * |W x + b - y|^2 +
// 0.5 * sum_k (scale_k * x_0)^2; three variables of awkward sizes, so that the slices (which start where
// 2048-element screen tiles start) cut through "scale" and leave partial tiles.
inline variable_set model_variables(std::size_t scale_size = 9000) {
  variable_set v;
  v.add("w", {targets, features});
  v.add("b", {targets});
  v.add("scale", {scale_size});
  return v;
}
inline std::vector<input_spec> model_inputs() {
  return {{"x", dtype::float32, {features}}, {"y", dtype::float32, {targets}}};
}

// A tower's values as a host vector, and back: its memory is the host's for exec::host and its device's
// for exec::cuda (the GPU build, where cudaMemcpyDefault serves both). On the device, the
// copy waits for all the device's work first (the staged shard and the new parameters arrive on other
// streams) and is finished on return (a copy from pageable memory may return before it lands, and the
// reducer's streams do not wait for the default stream).
inline void copy_bytes(void* target, const void* source, std::size_t bytes) {
#if defined(TOWERPIPE_TEST_GPU_TOWERS)
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(target, source, bytes, cudaMemcpyDefault) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess)
    throw std::runtime_error("copy_bytes: cudaMemcpy");
#else
  std::memcpy(target, source, bytes);
#endif
}
template <class T>
std::vector<T> fetch(const T* values, std::size_t count) {
  std::vector<T> copy(count);
  copy_bytes(copy.data(), values, count * sizeof(T));
  return copy;
}
// G: float, or bfloat16 (mixed precision), rounded from float.
template <class G>
void store(G* target, const std::vector<double>& values, double divisor) {
  std::vector<G> rounded(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = G(static_cast<float>(values[i] / divisor));
  copy_bytes(target, rounded.data(), rounded.size() * sizeof(G));
}

// poison: write a NaN into element 3 of "scale" (a checked step must skip, naming this tower).
template <class Context>
double linear_tower(Context& tower, bool poison = false) {
  const auto x_view = tower.template input<float>("x");
  const std::size_t examples = x_view.examples();
  const std::vector<float> x = fetch(x_view.data(), examples * features);
  const std::vector<float> y = fetch(tower.template input<float>("y").data(), examples * targets);
  const auto widened = [](const auto& values) {
    std::vector<double> wide;
    for (const auto& v : values) wide.push_back(static_cast<double>(static_cast<float>(v)));
    return wide;
  };
  const std::vector<double> w = widened(fetch(tower.parameter(0).data(), targets * features));
  const std::vector<double> b = widened(fetch(tower.parameter(1).data(), targets));
  const std::vector<double> scale = widened(fetch(tower.parameter(2).data(), tower.parameter(2).size()));
  const double n = static_cast<double>(examples);
  std::vector<double> dw(targets * features, 0.0), db(targets, 0.0), ds(scale.size(), 0.0);
  double loss = 0;
  for (std::size_t e = 0; e < examples; ++e) {
    for (std::size_t o = 0; o < targets; ++o) {
      double z = b[o] - y[e * targets + o];
      for (std::size_t f = 0; f < features; ++f) z += w[o * features + f] * x[e * features + f];
      loss += 0.5 * z * z;
      db[o] += z;
      for (std::size_t f = 0; f < features; ++f) dw[o * features + f] += z * x[e * features + f];
    }
    for (std::size_t k = 0; k < scale.size(); ++k) {
      const double s = scale[k] * x[e * features];
      loss += 0.5 * s * s;
      ds[k] += s * x[e * features];
    }
  }
  if (poison) ds[3] = std::nan("");
  store(tower.gradient(0).data(), dw, n);
  store(tower.gradient(1).data(), db, n);
  store(tower.gradient(2).data(), ds, n);
  return loss / n;
}

// The whole step's batch, the same on every process: `examples` rows of x and y from the step number.
struct global_batch {
  std::vector<float> x, y;
  std::size_t examples;
  global_batch(int step, std::size_t count) : x(count * features), y(count * targets), examples(count) {
    std::uint64_t state = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(step + 1);
    const auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<float>(static_cast<double>(state >> 40) / static_cast<double>(1ull << 24) - 0.5);
    };
    for (float& v : x) v = next();
    for (float& v : y) v = next();
  }
  // Examples [first, first + count) as a batch.
  batch slice(std::size_t first, std::size_t count) const {
    batch b;
    b.add("x", x.data() + first * features, count, {features});
    b.add("y", y.data() + first * targets, count, {targets});
    return b;
  }
};

template <class Pipeline>
void initialize(Pipeline& p) {
  std::uint64_t seed = 12345;
  p.initialize([&](const variable&, tensor_view<float> values) {
    for (float& v : values) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(seed >> 40) / static_cast<double>(1ull << 24) - 0.5);
    }
  });
}

template <class A, class B>
bool same_bits(const A& a, const B& b, std::size_t& differing) {
  differing = 0;
  for (std::size_t v = 0; v < a.variables().count(); ++v) {
    const auto x = a.parameter(v), y = b.parameter(v);
    if (std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) ++differing;
  }
  return differing == 0;
}

// Optimizer state: a collective on the sharded pipeline (every process asks for every slot and variable).
template <class Sharded, class Single>
bool same_state(Sharded& sharded, const Single& single) {
  bool same = sharded.optimizer_state_slots() == single.optimizer_state_slots();
  for (std::size_t slot = 0; same && slot < single.optimizer_state_slots(); ++slot) {
    for (std::size_t v = 0; v < single.variables().count(); ++v) {
      const auto x = sharded.optimizer_state(slot, v), y = single.optimizer_state(slot, v);
      same = same && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    }
  }
  return same;
}

// checked: the default checked step with clipping, and at step 2 a NaN from the last tower of the last
// process, which both pipelines must skip and name alike.
template <class Optim, class Layout>
void equal_to_one_process(std::size_t local_towers, const typename Optim::hyper_parameters& h, bool uneven, bool checked,
                          const std::shared_ptr<process_group>& group) {
  const std::size_t towers = local_towers * static_cast<std::size_t>(processes);
  pipeline_options single_options, sharded_options;
  if (checked) {
    single_options.max_grad_norm = sharded_options.max_grad_norm = 0.05;
  } else {
    single_options.on_nonfinite = sharded_options.on_nonfinite = nonfinite_policy::unchecked;
  }
  single_options.host_threads = sharded_options.host_threads = 2;
  sharded_options.direct_device_access = direct_device_access;
  sharded_options.processes = group;
  using single_type = pipeline<exec::host, reduce::host, Optim, Layout>;
  using sharded_type = pipeline<sharded_exec, reduce::sharded, Optim, Layout>;
  single_type single(model_variables(), model_inputs(), towers, h, single_options);
  auto sharded = std::make_unique<sharded_type>(model_variables(), model_inputs(), local_towers, h, sharded_options);
  initialize(single);
  initialize(*sharded);
  const std::string name = std::string(Optim::name) + ", " + Layout::name + (uneven ? ", uneven" : ", even") +
                           (checked ? ", checked" : "") + ", " + std::to_string(local_towers) + " towers per process";
  const int poisoned_step = checked ? 2 : -1;

  // A step of the whole batch in one process, and of this process's part of it in the sharded pipeline.
  const auto examples = 3 * towers + (uneven ? towers / 2 + 1 : 0);
  const auto step_one = [&](auto& one, int step) {
    return one.step(global_batch(step, examples).slice(0, examples), [&](auto& tower) {
      return linear_tower(tower, step == poisoned_step && tower.tower() == towers - 1);
    });
  };
  const auto step_sharded = [&](auto& many, int step) {
    const std::vector<shard> shards = plan_split(examples, towers, split_policy::weighted);
    const std::size_t first = shards[static_cast<std::size_t>(rank) * local_towers].first;
    std::size_t count = 0;
    for (std::size_t t = 0; t < local_towers; ++t) count += shards[static_cast<std::size_t>(rank) * local_towers + t].examples;
    return many.step(global_batch(step, examples).slice(first, count), [&](auto& tower) {
      return linear_tower(tower, step == poisoned_step && rank == processes - 1 && tower.tower() == local_towers - 1);
    });
  };
  const auto step_both = [&](auto& one, auto& many, int step) {
    const step_stats a = step_one(one, step), b = step_sharded(many, step);
    check(b.examples == examples, name + ": the step counts every process's examples");
    check(std::abs(a.loss - b.loss) <= 1e-12 * std::abs(a.loss), name + ": the loss is the mean over every process");
    const std::string at = name + ": step " + std::to_string(step) + ": ";
    check(a.skipped == b.skipped && a.skipped == (step == poisoned_step), at + "skipped differently");
    check(a.nonfinite.has_value() == b.nonfinite.has_value() &&
              (!a.nonfinite || (a.nonfinite->variable == b.nonfinite->variable && a.nonfinite->element == b.nonfinite->element &&
                                a.nonfinite->tower == b.nonfinite->tower)),
          at + "the non-finite value is reported differently");
    const auto bits = [](const std::optional<double>& x) {
      std::uint64_t value = 0;
      if (x) std::memcpy(&value, &*x, sizeof value);
      return value;
    };
    check(a.gradient_norm.has_value() == b.gradient_norm.has_value() && bits(a.gradient_norm) == bits(b.gradient_norm) &&
              a.clip_coefficient == b.clip_coefficient,
          at + "the norm or the clipping differs");
  };

  std::size_t differing = 0;
  for (int step = 1; step <= 3; ++step) {
    step_both(single, *sharded, step);
    check(same_bits(single, *sharded, differing),
          name + ": step " + std::to_string(step) + ": " + std::to_string(differing) + " variable(s) differ from one process");
    check(same_state(*sharded, single), name + ": step " + std::to_string(step) + ": optimizer state differs");
  }

  // Checkpoints: written by R processes (every one takes part in gathering the state; each writes its
  // own copy), continued in one process; written by one process, continued in R.
  const std::string from_many = "sharded_" + std::to_string(processes) + "_" + std::to_string(rank) + ".ckpt";
  const std::string from_one = "single_" + std::to_string(processes) + "_" + std::to_string(rank) + ".ckpt";
  save_checkpoint(*sharded, from_many);
  save_checkpoint(single, from_one);
  single_type resumed_single(model_variables(), model_inputs(), towers, h, single_options);
  load_checkpoint(resumed_single, from_many);
  sharded = std::make_unique<sharded_type>(model_variables(), model_inputs(), local_towers, h, sharded_options);
  load_checkpoint(*sharded, from_one);
  for (int step = 4; step <= 5; ++step) {
    step_both(single, *sharded, step);
    step_one(resumed_single, step);
  }
  check(same_bits(single, *sharded, differing), name + ": after the checkpoints, the sharded run differs");
  check(same_bits(single, resumed_single, differing), name + ": a checkpoint of the sharded run resumes differently");
  std::remove(from_many.c_str());
  std::remove(from_one.c_str());
}

template <class Layout>
void every_optimizer(std::size_t local_towers, const std::shared_ptr<process_group>& group) {
  optim::sgd::hyper_parameters sgd;
  sgd.lr = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-3;
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  adam.weight_decay = 1e-3;
  optim::adamw::hyper_parameters adamw;
  adamw.lr = 0.01;
  constexpr bool mixed = !std::is_same<typename Layout::value_type, float>::value;
  for (bool uneven : {false, true}) {
    for (bool checked : {false, true}) {
      if (mixed && !checked) continue;  // a mixed-precision step is always a checked one
      equal_to_one_process<optim::sgd, Layout>(local_towers, sgd, uneven, checked, group);
      equal_to_one_process<optim::adam, Layout>(local_towers, adam, uneven, checked, group);
      equal_to_one_process<optim::adamw, Layout>(local_towers, adamw, uneven, checked, group);
    }
  }
}

#if defined(TOWERPIPE_TEST_GPU_TOWERS)
extern template void every_optimizer<layout::flat<float>>(std::size_t, const std::shared_ptr<process_group>&);
extern template void every_optimizer<layout::per_variable<float>>(std::size_t, const std::shared_ptr<process_group>&);
extern template void every_optimizer<layout::flat<bfloat16>>(std::size_t, const std::shared_ptr<process_group>&);
#endif

}  // namespace towerpipe_mpi_test
