// The canonical summation order (docs/guide.md, invariant 2): the tree sum written here from its
// definition must equal what the library computes, bitwise, directly and through whole pipelines.
#include <towerpipe/kernels/agents.hpp>
#include <towerpipe/plan/canonical_order.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::bits_of;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

namespace {

// The definition, literally: s_i = w_i * g_i; in round r every i divisible by 2^(r+1) with
// i + 2^r < N does s_i = s_i + s_(i + 2^r); the result is s_0. volatile keeps each operation rounded.
float definition_tree_sum(const std::vector<float>& weights, const std::vector<float>& values) {
  std::vector<float> s(values.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    volatile float product = weights[i] * values[i];
    s[i] = product;
  }
  for (std::size_t stride = 1; stride < s.size(); stride *= 2) {
    for (std::size_t i = 0; i + stride < s.size(); i += 2 * stride) {
      volatile float total = s[i] + s[i + stride];
      s[i] = total;
    }
  }
  return s[0];
}

}  // namespace

TEST_CASE("canonical_sum equals the definition's tree for 1..33 towers", "[canonical]") {
  random_source random(1);
  INFO("seed " << random.seed());
  bool order_mattered = false;
  for (int towers = 1; towers <= 33; ++towers) {
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<float> values = random.wide(static_cast<std::size_t>(towers));
      const std::vector<float> weights = random.normal(static_cast<std::size_t>(towers));
      const float library = canonical_sum<float>(towers, [&](int i) {
        return detail::rounded_mul(weights[static_cast<std::size_t>(i)], values[static_cast<std::size_t>(i)]);
      });
      INFO("towers " << towers << ", trial " << trial);
      REQUIRE(bits_of(library) == bits_of(definition_tree_sum(weights, values)));
      volatile float left_to_right = 0.0f;
      for (int i = 0; i < towers; ++i) left_to_right = left_to_right + weights[static_cast<std::size_t>(i)] * values[static_cast<std::size_t>(i)];
      order_mattered = order_mattered || bits_of(left_to_right) != bits_of(library);
    }
  }
  // The inputs are chosen so that the order shows: a left-to-right sum must differ somewhere.
  CHECK(order_mattered);
}

TEST_CASE("canonical_block_sum equals the definition's tree element by element for 1..33 towers", "[canonical]") {
  random_source random(2);
  INFO("seed " << random.seed());
  constexpr std::size_t block = 16, count = 13;  // a block the loops do not fill
  for (int towers = 1; towers <= 33; ++towers) {
    const std::size_t n = static_cast<std::size_t>(towers);
    const std::vector<float> values = random.wide(n * count);  // tower t's block at t * count
    const std::vector<float> weights = random.normal(n);
    float scratch[32][block];
    detail::canonical_block_sum(towers, count, scratch, [&](int tower, float* out) {
      const std::size_t t = static_cast<std::size_t>(tower);
      for (std::size_t k = 0; k < count; ++k) out[k] = detail::rounded_mul(weights[t], values[t * count + k]);
    });
    for (std::size_t k = 0; k < count; ++k) {
      std::vector<float> column(n);
      for (std::size_t t = 0; t < n; ++t) column[t] = values[t * count + k];
      INFO("towers " << towers << ", element " << k);
      REQUIRE(bits_of(scratch[0][k]) == bits_of(definition_tree_sum(weights, column)));
    }
  }
}

TEST_CASE("canonical_slots bounds the stack depth of the tree", "[canonical]") {
  for (int towers = 1; towers <= 100; ++towers) {
    int depth = 0, deepest = 0;
    canonical_tree_reduce(
        towers, [&](int, int slot) { deepest = std::max(deepest, slot + 1); ++depth; },
        [&](int left, int right) {
          REQUIRE(right == left + 1);
          --depth;
        });
    INFO("towers " << towers);
    CHECK(depth == 1);
    CHECK(deepest <= canonical_slots(towers));
  }
  CHECK(canonical_slots(1) == 1);
  CHECK(canonical_slots(2) == 2);
  CHECK(canonical_slots(4) == 3);
  CHECK(canonical_slots(8) == 4);
  CHECK(canonical_slots(9) == 5);
}

namespace {

// A pipeline whose towers write fixed per-tower gradients; with SGD, lr = 1 and zero parameters one step
// leaves p = 0 - 1 * avg = -avg exactly, so the parameters show the reduction bit for bit.
template <class Layout, class Optim>
std::vector<std::vector<float>> train_on_fixed_gradients(std::size_t towers, const variable_set& variables,
                                                         const std::vector<std::vector<std::vector<float>>>& grads,
                                                         const typename Optim::hyper_parameters& h, int steps,
                                                         std::size_t examples, std::size_t threads = 0) {
  using trainer = pipeline<exec::host, reduce::host, Optim, Layout>;
  pipeline_options options;
  options.host_threads = threads;
  trainer p(variables, {{"x", dtype::float32, {1}}}, towers, h, options);
  const std::vector<float> x(examples, 1.0f);
  batch b;
  b.add("x", x.data(), examples, {1});
  for (int s = 0; s < steps; ++s) {
    p.step(b, [&](typename trainer::tower_context& tower) {
      for (std::size_t v = 0; v < variables.count(); ++v) {
        const std::vector<float>& g = grads[tower.tower()][v];
        tower.write_gradient(v, g.data(), g.size());
      }
      return 0.0;
    });
  }
  std::vector<std::vector<float>> result;
  for (std::size_t v = 0; v < variables.count(); ++v) result.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
  return result;
}

std::vector<std::vector<std::vector<float>>> draw_gradients(random_source& random, std::size_t towers,
                                                            const variable_set& variables) {
  std::vector<std::vector<std::vector<float>>> grads(towers);
  for (auto& tower : grads) {
    for (const variable& v : variables) tower.push_back(random.wide(v.size));
  }
  return grads;
}

}  // namespace

TEMPLATE_TEST_CASE("a host pipeline averages in the canonical order, bitwise, for 1..9 towers", "[canonical][pipeline]",
                   layout::flat<float>, layout::per_variable<float>) {
  random_source random(2);
  INFO("seed " << random.seed());
  // 70001 elements span several reduction chunks and a partial block.
  const variable_set variables{{"big", {70001}}, {"small", {5}}};
  optim::sgd::hyper_parameters sgd;
  sgd.lr = 1.0;
  for (std::size_t towers = 1; towers <= 9; ++towers) {
    INFO("towers " << towers);
    const auto grads = draw_gradients(random, towers, variables);
    // An uneven batch: weights b_i / B differ between towers.
    const std::size_t examples = 2 * towers + 1;
    const std::vector<shard> shards = plan_split(examples, towers, split_policy::weighted);
    std::vector<float> weights;
    for (const shard& s : shards) weights.push_back(static_cast<float>(s.weight));
    const auto params = train_on_fixed_gradients<TestType, optim::sgd>(towers, variables, grads, sgd, 1, examples);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      for (std::size_t k = 0; k < variables[v].size; ++k) {
        std::vector<float> column(towers);
        for (std::size_t t = 0; t < towers; ++t) column[t] = grads[t][v][k];
        const float expected = -definition_tree_sum(weights, column);
        if (bits_of(params[v][k]) != bits_of(expected)) {
          FAIL("variable " << variables[v].name << " element " << k << ": " << params[v][k] << " != " << expected);
        }
      }
    }
  }
}

TEST_CASE("repeated runs, thread counts and layouts give bitwise-equal parameters", "[canonical][pipeline]") {
  random_source random(3);
  INFO("seed " << random.seed());
  const variable_set variables{{"w", {300, 217}}, {"b", {217}}, {"s", {}}};
  const std::size_t towers = 5;
  const auto grads = draw_gradients(random, towers, variables);
  optim::adam::hyper_parameters adam;
  adam.lr = 0.01;
  adam.weight_decay = 0.1;
  const auto reference = train_on_fixed_gradients<layout::flat<float>, optim::adam>(towers, variables, grads, adam, 3, 13);
  for (int run = 0; run < 20; ++run) {
    const std::size_t threads = 1 + static_cast<std::size_t>(run % 7);
    INFO("run " << run << ", " << threads << " threads");
    const auto again = train_on_fixed_gradients<layout::flat<float>, optim::adam>(towers, variables, grads, adam, 3, 13, threads);
    for (std::size_t v = 0; v < variables.count(); ++v) CHECK(first_bitwise_difference(again[v], reference[v]) == -1);
  }
  const auto per_variable =
      train_on_fixed_gradients<layout::per_variable<float>, optim::adam>(towers, variables, grads, adam, 3, 13);
  for (std::size_t v = 0; v < variables.count(); ++v) CHECK(first_bitwise_difference(per_variable[v], reference[v]) == -1);
}

// The tree as the device reducers run it (plan/canonical_order.hpp canonical_tree_rounds, the edges
// of kernels/agents.hpp), one round after another.
TEST_CASE("the tree rounds reproduce the canonical sum bitwise", "[multi_tensor][canonical]") {
  using namespace towerpipe::detail;
  random_source random(60);
  INFO("seed " << random.seed());
  for (int towers = 2; towers <= 17; ++towers) {
    INFO("towers " << towers);
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<float> raw = random.wide(static_cast<std::size_t>(towers));
      const std::vector<float> weights = random.normal(static_cast<std::size_t>(towers));
      const float expected = canonical_sum<float>(
          towers, [&](int t) { return detail::rounded_mul(weights[static_cast<std::size_t>(t)], raw[static_cast<std::size_t>(t)]); });
      float* pointers[32];
      for (int t = 0; t < towers; ++t) pointers[t] = &raw[static_cast<std::size_t>(t)];
      // Full precision: the partial sums live in the raw gradients' buffers (tree_operands).
      const tree_operands<float> operands{{pointers, 1}, {pointers, 1}};
      const auto rounds = canonical_tree_rounds<float>(towers, weights);
      float result = 0;
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        for (const tree_edge<float>& edge : rounds[r]) {
          nonfinite_key unchecked = no_nonfinite;
          const float combined = edge.combine<1>(operands, 0, 0, unchecked).value[0];
          if (r + 1 == rounds.size()) {
            REQUIRE(edge.left == 0);
            result = combined;
          } else {
            raw[static_cast<std::size_t>(edge.left)] = combined;
          }
        }
      }
      REQUIRE(bits_of(result) == bits_of(expected));
    }
  }
}
