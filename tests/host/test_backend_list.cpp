// A new backend is its own header and one line in the list of backends (reduce/choice/backends.hpp):
// shown with a throwaway backend, written below as its own header would be, and the library's list with
// one line added. reduce::automatic then takes it as a candidate, chooses it where its cost model wins,
// times it with the others, and trains bitwise as every backend does.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

// ---- its own header: the policy type with its traits, and its reducer for the towers it takes ----
namespace throwaway {

// reduce::host's pass under another name, for host towers only, costed as cheaper than reduce::host.
struct mirror {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "mirror";
  static constexpr backend_traits traits{name, true, false, false, 0.5, &reduce::host::one_device_bytes, &reduce::host::busiest_link_elements,
                                         true, "a throwaway backend of the test, costed at half of reduce::host"};
};

template <class Optim, class Layout>
struct mirror_reducer : detail::host_reducer<Optim, Layout> {
  using detail::host_reducer<Optim, Layout>::host_reducer;
  backend_choice choice() const { return detail::named_by_type(mirror::name); }
};

}  // namespace throwaway

namespace towerpipe {
template <class Optim, class Layout>
struct reducer_for<exec::host, throwaway::mirror, Optim, Layout> {
  using type = throwaway::mirror_reducer<Optim, Layout>;
};
}  // namespace towerpipe

// ---- the one line: the library's list, and the throwaway backend ----
using extended_backends = detail::backend_list<reduce::device0, reduce::p2p_tree, reduce::host, reduce::sharded, throwaway::mirror>;

// reduce::automatic over that list (what reduce::automatic is over the library's).
struct automatic_over_extended {
  using policy_kind = detail::reduce_policy_kind;
  static constexpr const char* name = "automatic";
};
namespace towerpipe {
template <class Optim, class Layout>
struct reducer_for<exec::host, automatic_over_extended, Optim, Layout> {
  using type = typename detail::automatic_for<exec::host, Optim, Layout, extended_backends>::type;
};
}  // namespace towerpipe

namespace {

const variable_set list_variables{{"w", {40, 30}}, {"b", {30}}};
const std::vector<input_spec> list_inputs{{"x", dtype::float32, {1}}};

template <class Reduce>
using trainer = pipeline<exec::host, Reduce, optim::adam, layout::flat<float>>;

template <class A, class B>
void train_alike(A& a, B& b, std::uint64_t salt) {
  random_source random(salt);
  for (std::size_t v = 0; v < list_variables.count(); ++v) {
    const std::vector<float> values = random.normal(list_variables[v].size);
    a.set_parameter(v, values.data(), values.size());
    b.set_parameter(v, values.data(), values.size());
  }
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = random.normal(7);
    batch examples;
    examples.add("x", x.data(), x.size(), {1});
    const auto gradient = [](auto& tower) {
      const float mean = towerpipe_tests::shard_mean(tower, "x");
      for (std::size_t v = 0; v < 2; ++v) {
        const auto p = tower.parameter(v);
        auto g = tower.gradient(v);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.5f * p[i] + mean * static_cast<float>(i % 5);
      }
      return static_cast<double>(mean);
    };
    a.step(examples, gradient);
    b.step(examples, gradient);
  }
  for (std::size_t v = 0; v < list_variables.count(); ++v) CHECK(first_bitwise_difference(a.parameter(v), b.parameter(v)) == -1);
}

TEST_CASE("a backend added by its own header and one list line is a candidate of reduce::automatic", "[backend_list]") {
  std::vector<std::string> listed;
  extended_backends::for_each([&](auto backend) { listed.push_back(decltype(backend)::name); });
  CHECK(listed == std::vector<std::string>{"device0", "p2p_tree", "host", "sharded", "mirror"});

  // Host towers take host, sharded and mirror; its cost model wins.
  trainer<automatic_over_extended> chosen(list_variables, list_inputs, 3, {});
  CHECK(chosen.backend_name() == "mirror");
  CHECK(chosen.backend_reason().find("a throwaway backend of the test") != std::string::npos);
  trainer<reduce::host> host(list_variables, list_inputs, 3, {});
  train_alike(chosen, host, 1);

  // Timed with the others, bitwise equal to them, whichever is kept.
  pipeline_options timed;
  timed.time_backends = 2;
  trainer<automatic_over_extended> timing(list_variables, list_inputs, 2, {}, timed);
  trainer<reduce::host> plain(list_variables, list_inputs, 2, {});
  train_alike(timing, plain, 2);
  CHECK(timing.backend_reason().find("mirror ") != std::string::npos);
}

}  // namespace
