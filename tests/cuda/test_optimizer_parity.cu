// The shared per-element functions (docs/guide.md, invariant 4) give the device bitwise the host's
// results: each optimizer's update over many steps, and the canonical tower sum.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cuda_runtime.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

#define REQUIRE_CUDA(call) REQUIRE((call) == cudaSuccess)

namespace {

template <class T>
std::vector<T> to_host(const thrust::device_vector<T>& values) {
  std::vector<T> host(values.size());
  thrust::copy(values.begin(), values.end(), host.begin());
  return host;
}

template <class T>
T* raw(thrust::device_vector<T>& values) {
  return thrust::raw_pointer_cast(values.data());
}

// steps x n gradients; state is slots x n.
template <class Optim>
__global__ void apply_steps(const typename Optim::template step_constants<float>* constants, int steps,
                            const float* grads, float* params, float* state, int n, int slots) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float p = params[i];
  float s[Optim::max_state_slots];
  for (int k = 0; k < slots; ++k) s[k] = state[k * n + i];
  for (int t = 0; t < steps; ++t) Optim::update(constants[t], grads[t * n + i], p, s);
  params[i] = p;
  for (int k = 0; k < slots; ++k) state[k * n + i] = s[k];
}

template <class Optim>
void check_parity(const typename Optim::hyper_parameters& h, std::uint64_t salt) {
  constexpr int n = 4099, steps = 50;
  random_source random(salt);
  INFO(Optim::name << ", seed " << random.seed());
  const int slots = Optim::state_slots(h);
  std::vector<typename Optim::template step_constants<float>> constants;
  for (int t = 1; t <= steps; ++t) constants.push_back(Optim::template constants<float>(h, t));
  const std::vector<float> grads = random.normal(static_cast<std::size_t>(n) * steps);
  std::vector<float> params = random.normal(n);
  std::vector<float> state(static_cast<std::size_t>(slots) * n, 0.0f);  // optimizer state starts at zero

  thrust::device_vector<typename Optim::template step_constants<float>> d_constants(constants);
  thrust::device_vector<float> d_grads(grads), d_params(params), d_state(state.empty() ? std::vector<float>(1) : state);
  apply_steps<Optim><<<(n + 255) / 256, 256>>>(raw(d_constants), steps, raw(d_grads), raw(d_params), raw(d_state), n, slots);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaDeviceSynchronize());

  for (int i = 0; i < n; ++i) {
    float s[Optim::max_state_slots];
    for (int k = 0; k < slots; ++k) s[k] = state[static_cast<std::size_t>(k) * n + i];
    for (int t = 0; t < steps; ++t) Optim::update(constants[t], grads[static_cast<std::size_t>(t) * n + i], params[i], s);
    for (int k = 0; k < slots; ++k) state[static_cast<std::size_t>(k) * n + i] = s[k];
  }
  CHECK(first_bitwise_difference(to_host(d_params), params) == -1);
  if (slots > 0) CHECK(first_bitwise_difference(to_host(d_state), state) == -1);
}

__global__ void canonical_sums(const float* values, const float* weights, int towers, int n, float* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = canonical_sum<float>(towers, [&](int t) { return detail::rounded_mul(weights[t], values[t * n + i]); });
}

}  // namespace

TEST_CASE("device optimizer updates equal the host's bitwise", "[gpu][optim]") {
  optim::sgd::hyper_parameters nesterov;
  nesterov.lr = 0.05;
  nesterov.momentum = 0.9;
  nesterov.nesterov = true;
  nesterov.weight_decay = 0.01;
  check_parity<optim::sgd>(optim::sgd::hyper_parameters{}, 1);
  check_parity<optim::sgd>(nesterov, 2);
  optim::adam::hyper_parameters adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.1;
  check_parity<optim::adam>(adam, 3);
  check_parity<optim::adamw>(optim::adamw::hyper_parameters{}, 4);
}

TEST_CASE("the device's canonical tower sum equals the host's bitwise", "[gpu][canonical]") {
  constexpr int n = 10007;
  random_source random(5);
  INFO("seed " << random.seed());
  for (int towers = 1; towers <= 9; ++towers) {
    INFO("towers " << towers);
    const std::vector<float> values = random.wide(static_cast<std::size_t>(towers) * n);
    const std::vector<float> weights = random.normal(static_cast<std::size_t>(towers));
    thrust::device_vector<float> d_values(values), d_weights(weights), d_out(n, std::nanf(""));
    canonical_sums<<<(n + 255) / 256, 256>>>(raw(d_values), raw(d_weights), towers, n, raw(d_out));
    REQUIRE_CUDA(cudaGetLastError());
    std::vector<float> expected(n);
    for (int i = 0; i < n; ++i)
      expected[i] = canonical_sum<float>(towers, [&](int t) { return detail::rounded_mul(weights[t], values[t * n + i]); });
    CHECK(first_bitwise_difference(to_host(d_out), expected) == -1);
  }
}
