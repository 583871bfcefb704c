// Overlapping the reduction with the towers' backward pass (plan/buckets.hpp, pipeline/step_parts.hpp):
// the bucket plan against hand-derived cases, the readiness count, the marking contract's errors, and
// the guarantee — a step whose towers mark their gradients ready bucket by bucket ends bitwise where the
// unbucketed step does, for every bucket size, optimizer, layout, precision and checked or unchecked
// step — and what a tower failing after a bucket went leaves behind.
#include <towerpipe/towerpipe.hpp>
#include <towerpipe/comm/thread_group.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::on_every_rank;

namespace {

using detail::bucket_plan;
using detail::make_bucket_plan;

const variable_set plan_variables{{"a", {10}}, {"b", {20}}, {"c", {5}}, {"d", {100}}};

TEST_CASE("the default bucket plan cuts the reversed variables greedily at the byte cap", "[overlap][buckets]") {
  // float gradients: a 40 B, b 80 B, c 20 B, d 400 B. Reversed: d (400 > 100: alone), c + b (100), a.
  gradient_buckets options;
  options.cap_bytes = 100;
  const bucket_plan plan = make_bucket_plan(plan_variables, options, sizeof(float));
  REQUIRE(plan.buckets == std::vector<std::vector<std::size_t>>{{3}, {2, 1}, {0}});
  REQUIRE(plan.bucket_of == std::vector<std::size_t>{2, 1, 1, 0});

  options.cap_bytes = 1;  // one variable a bucket
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3}, {2}, {1}, {0}});
  options.cap_bytes = 540;  // everything fits: 540 B in all
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3, 2, 1, 0}});
  options.cap_bytes = 539;
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3, 2, 1}, {0}});
  // 16-bit gradients halve the bytes: d 200 B, c + b + a 70 B.
  options.cap_bytes = 200;
  REQUIRE(make_bucket_plan(plan_variables, options, 2).buckets == std::vector<std::vector<std::size_t>>{{3}, {2, 1, 0}});
}

TEST_CASE("the first bucket has a cap of its own, 1 MiB by default as DDP's, so a small model is several buckets",
          "[overlap][buckets]") {
  gradient_buckets options;
  options.cap_bytes = 539;
  options.first_cap_bytes = 420;  // d + c = 420 B fit the first; b + a = 120 B the next
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3, 2}, {1, 0}});
  options.first_cap_bytes = 100;  // d alone (a variable above the cap is a bucket of its own)
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3}, {2, 1, 0}});
  options.first_cap_bytes = 1000;  // never above cap_bytes: d + c + b = 500 B, then a
  REQUIRE(make_bucket_plan(plan_variables, options, sizeof(float)).buckets ==
          std::vector<std::vector<std::size_t>>{{3, 2, 1}, {0}});
  options.first_cap_bytes = 0;
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4), Catch::Contains("first_cap_bytes must be positive"));

  // Three float variables of 1 MiB each under the defaults: c fills the 1 MiB first bucket, b and a the next.
  const variable_set mib{{"a", {1 << 18}}, {"b", {1 << 18}}, {"c", {1 << 18}}};
  REQUIRE(make_bucket_plan(mib, gradient_buckets{}, sizeof(float)).buckets == std::vector<std::vector<std::size_t>>{{2}, {1, 0}});
}

TEST_CASE("explicit bucket groups are taken as given, and bad groups are refused naming the variable", "[overlap][buckets]") {
  gradient_buckets options;
  options.groups = {{"b", "d"}, {"a"}, {"c"}};
  const bucket_plan plan = make_bucket_plan(plan_variables, options, sizeof(float));
  REQUIRE(plan.buckets == std::vector<std::vector<std::size_t>>{{1, 3}, {0}, {2}});
  REQUIRE(plan.bucket_of == std::vector<std::size_t>{1, 0, 2, 0});

  options.groups = {{"b", "d"}, {"a", "zz"}, {"c"}};
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4), Catch::Contains("groups[1] names 'zz'"));
  options.groups = {{"b", "d"}, {"a", "b"}, {"c"}};
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4),
                    Catch::Contains("groups[1] names 'b', which groups[0] holds already"));
  options.groups = {{"b", "d"}, {"a"}};
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4), Catch::Contains("leave out variable 'c'"));
  options.groups = {{"b", "d", "a", "c"}, {}};
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4), Catch::Contains("groups[1] is empty"));
  options.groups.clear();
  options.cap_bytes = 0;
  CHECK_THROWS_WITH(make_bucket_plan(plan_variables, options, 4), Catch::Contains("cap_bytes must be positive"));

  // The pipeline refuses them at construction, whatever the backend.
  pipeline_options bad;
  bad.buckets.groups = {{"w"}};
  using trainer = pipeline<exec::host, reduce::sharded, optim::sgd, layout::flat<float>>;
  CHECK_THROWS_WITH(trainer({{"w", {3}}, {"b", {1}}}, {{"x", dtype::float32, {1}}}, 2, optim::sgd::hyper_parameters{}, bad),
                    Catch::Contains("leave out variable 'b'"));
}

TEST_CASE("a bucket is ready at the mark that completes it for the last tower, once", "[overlap][buckets]") {
  gradient_buckets options;
  options.cap_bytes = 100;
  const bucket_plan plan = make_bucket_plan(plan_variables, options, sizeof(float));  // {d}, {c, b}, {a}
  detail::bucket_readiness readiness(plan, 2);
  REQUIRE(readiness.mark(0, 3) == detail::no_bucket);  // tower 1 has not marked d
  REQUIRE(readiness.mark(1, 2) == detail::no_bucket);  // c, but not b
  REQUIRE(readiness.mark(1, 3) == 0);                   // d: both towers now
  REQUIRE(readiness.mark(0, 1) == detail::no_bucket);
  REQUIRE(readiness.mark(1, 1) == detail::no_bucket);  // tower 1 completes {c, b}; tower 0 lacks c
  REQUIRE(readiness.mark(0, 2) == 1);
  REQUIRE(readiness.mark(1, 0) == detail::no_bucket);
  REQUIRE(readiness.mark(0, 0) == 2);
  readiness.reset();
  REQUIRE(readiness.mark(0, 3) == detail::no_bucket);
  REQUIRE(readiness.mark(1, 3) == 0);
}

// A small model whose trajectory depends on its parameters: a big variable of several host chunks, and
// small ones.
const variable_set model{{"embed", {300, 250}}, {"w1", {64, 33}}, {"b1", {64}}, {"w2", {10, 64}}, {"b2", {10}}};
const std::vector<input_spec> model_inputs{{"x", dtype::float32, {1}}};

// The gradient of element k: a pull towards zero plus a tower- and step-dependent wave.
float gradient_value(float parameter, std::size_t k, std::size_t tower, std::int64_t step, float x) {
  return 0.01f * parameter + 0.001f * x * std::sin(0.37f * static_cast<float>(k) + 1.3f * static_cast<float>(tower) +
                                                  0.7f * static_cast<float>(step));
}

// Runs `steps` steps. marking: the towers mark each variable ready right after writing it, last variable
// first (as a backward pass goes; first_variable_first: the other way), and let time pass so that the
// buckets are reduced while they run.
// Across processes (thread ranks) a tower's global index is rank * towers + its own, and each process
// stages its part of the batch. Returns whether every step reduced its buckets during the towers when
// they were marked (and none when not): checked by the caller, on the test's thread.
template <class Trainer>
[[nodiscard]] bool train(Trainer& p, int steps, bool marking, std::size_t rank = 0, bool first_variable_first = false) {
  bool as_expected = true;
  using stored = typename Trainer::stored_type;
  const std::vector<float> x{1.0f, 0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.5f, 3.0f, -2.0f};
  batch whole;
  whole.add("x", x, {1});
  const batch_part part = p.process_part(whole.examples());
  const batch b = whole.slice(part.first, part.examples);
  for (int s = 0; s < steps; ++s) {
    const std::int64_t step = p.steps_done() + 1;
    const step_stats stats = p.step(b, [&](typename Trainer::tower_context& tower) {
      const float first_x = tower.template input<float>("x")(0, 0);
      const std::size_t global_tower = rank * tower.towers() + tower.tower();
      const std::size_t count = tower.variables().count();
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t v = first_variable_first ? i : count - 1 - i;
        const auto parameter = tower.parameter(v);
        const auto gradient = tower.gradient(v);
        for (std::size_t k = 0; k < gradient.size(); ++k)
          gradient[k] = stored(gradient_value(static_cast<float>(parameter[k]), k, global_tower, step, first_x));
        if (marking) {
          tower.gradient_ready(v);
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
      return 0.0;
    });
    const bool overlapping = marking && p.options().overlap_reduction &&
                             (p.options().accumulation_steps == 1 || stats.micro_batch == 1);
    // The bucket the last mark completes overlaps nothing: no tower has backward work left then.
    as_expected = as_expected && stats.buckets_during_towers == (overlapping ? stats.buckets - 1 : 0);
  }
  return as_expected;
}

template <class Trainer>
std::unique_ptr<Trainer> make_trainer(std::size_t towers, const typename Trainer::hyper_parameters& h,
                                      const pipeline_options& options) {
  auto p = std::make_unique<Trainer>(model, model_inputs, towers, h, options);
  std::uint64_t seed = 5;
  p->initialize([&](const variable&, tensor_view<float> values) {
    for (float& value : values) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      value = static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 24) - 0.5f;
    }
  });
  return p;
}

template <class Trainer>
void require_bitwise_equal(const Trainer& a, const Trainer& b) {
  REQUIRE(a.steps_done() == b.steps_done());
  for (std::size_t v = 0; v < model.count(); ++v) {
    INFO("variable " << model[v].name);
    REQUIRE(first_bitwise_difference(a.parameter(v), b.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < a.optimizer_state_slots(); ++slot)
      REQUIRE(first_bitwise_difference(a.optimizer_state(slot, v), b.optimizer_state(slot, v)) == -1);
  }
}

// Marked and bucketed (one variable a bucket, a few, one bucket; and overlap switched off) against the
// unbucketed step of towers that mark nothing.
template <class Trainer>
void check_buckets_change_no_bit(const typename Trainer::hyper_parameters& h, pipeline_options options, int steps = 4) {
  const auto reference = make_trainer<Trainer>(3, h, options);
  REQUIRE(train(*reference, steps, false));
  for (const std::size_t cap : {std::size_t(1), std::size_t(9000), std::size_t(1) << 30}) {
    for (const bool overlap : {true, false}) {
      INFO("cap_bytes " << cap << ", overlap_reduction " << overlap);
      options.buckets.cap_bytes = cap;
      options.overlap_reduction = overlap;
      const auto marked = make_trainer<Trainer>(3, h, options);
      REQUIRE(train(*marked, steps, true));
      require_bitwise_equal(*marked, *reference);
    }
  }
  options.buckets.groups = {{"w1", "b2"}, {"embed"}, {"b1", "w2"}};  // explicit, out of order
  options.overlap_reduction = true;
  const auto grouped = make_trainer<Trainer>(3, h, options);
  REQUIRE(train(*grouped, steps, true));
  require_bitwise_equal(*grouped, *reference);
}

pipeline_options unchecked() {
  pipeline_options options;
  options.on_nonfinite = nonfinite_policy::unchecked;
  return options;
}

template <class Layout>
using adam_trainer = pipeline<exec::host, reduce::host, optim::adam, Layout>;

TEMPLATE_TEST_CASE("buckets reduced during the towers change no bit: checked and unchecked, both layouts", "[overlap]",
                   layout::flat<float>, layout::per_variable<float>) {
  check_buckets_change_no_bit<adam_trainer<TestType>>(optim::adam::hyper_parameters{}, {});
  check_buckets_change_no_bit<adam_trainer<TestType>>(optim::adam::hyper_parameters{}, unchecked());
}

template <class Layout>
using sharded_trainer = pipeline<exec::host, reduce::sharded, optim::adam, Layout>;

TEST_CASE("reduce::sharded in one process: buckets change no bit", "[overlap][sharded]") {
  check_buckets_change_no_bit<sharded_trainer<layout::flat<float>>>(optim::adam::hyper_parameters{}, {});
  check_buckets_change_no_bit<sharded_trainer<layout::per_variable<float>>>(optim::adam::hyper_parameters{}, unchecked());
  check_buckets_change_no_bit<sharded_trainer<layout::flat<bfloat16>>>(optim::adam::hyper_parameters{}, {});
}

template <class Trainer>
void require_parameters_equal(const std::vector<std::unique_ptr<Trainer>>& ranked, const adam_trainer<layout::flat<float>>& reference) {
  for (std::size_t v = 0; v < model.count(); ++v) {
    INFO("variable " << model[v].name);
    for (std::size_t r = 0; r < ranked.size(); ++r) REQUIRE(first_bitwise_difference(ranked[r]->parameter(v), reference.parameter(v)) == -1);
  }
}

// Each bucket's exchange starts while the towers run, once it and every bucket before it are in
// (reduce/sharded/host_towers.hpp). Rank 1's towers here finish the buckets in the opposite order to
// rank 0's, so that its worker holds them until the first is in, and with explicit groups the
// processes' first bucket is not the one their towers finish first.
template <class Trainer>
void check_ranks_change_no_bit() {
  constexpr std::size_t ranks = 2, towers = 2;
  for (const pipeline_options& base : {pipeline_options{}, unchecked()}) {
    for (const bool grouped : {false, true}) {
      INFO("checked " << (base.on_nonfinite != nonfinite_policy::unchecked) << ", grouped " << grouped);
      const auto reference = make_trainer<adam_trainer<layout::flat<float>>>(ranks * towers, {}, base);
      REQUIRE(train(*reference, 3, false));
      const auto group = thread_process_group::create(static_cast<int>(ranks));
      std::vector<std::unique_ptr<Trainer>> ranked(ranks);
      std::vector<char> overlapped(ranks, 0);
      const std::vector<std::string> errors = on_every_rank(ranks, [&](std::size_t r) {
        pipeline_options options = base;
        options.processes = group[r];
        options.buckets.cap_bytes = 1;
        if (grouped) options.buckets.groups = {{"w1", "b2"}, {"embed"}, {"b1", "w2"}};
        ranked[r] = make_trainer<Trainer>(towers, {}, options);
        overlapped[r] = train(*ranked[r], 3, true, r, r == 1);
      });
      REQUIRE(errors == std::vector<std::string>(ranks));
      REQUIRE(overlapped == std::vector<char>(ranks, 1));
      require_parameters_equal(ranked, *reference);
    }
  }
}

TEST_CASE("reduce::sharded across processes (thread ranks): buckets change no bit, one process's result", "[overlap][sharded][ranks]") {
  check_ranks_change_no_bit<sharded_trainer<layout::flat<float>>>();
}

// reduce::automatic picks reduce::sharded across processes and passes the settling on to it.
TEST_CASE("reduce::automatic across processes (thread ranks): buckets change no bit, one process's result",
          "[overlap][automatic][ranks]") {
  check_ranks_change_no_bit<pipeline<exec::host, reduce::automatic, optim::adam, layout::flat<float>>>();
}

// A tower failing on one process after some buckets were exchanged: every process fails the step alike
// (step/processes.hpp), none waits for an exchange the other will not make, nothing changes on any
// (the owners update only after the agreement), and the next step goes on from there.
TEST_CASE("reduce::sharded across processes: a tower failing after buckets were exchanged changes nothing on any process",
          "[overlap][sharded][ranks][errors]") {
  constexpr std::size_t ranks = 2, towers = 2;
  for (const pipeline_options& base : {pipeline_options{}, unchecked()}) {
    INFO("checked " << (base.on_nonfinite != nonfinite_policy::unchecked));
    const auto reference = make_trainer<adam_trainer<layout::flat<float>>>(ranks * towers, {}, base);
    REQUIRE(train(*reference, 2, false));
    const auto group = thread_process_group::create(static_cast<int>(ranks), std::chrono::seconds(20));
    std::vector<std::unique_ptr<sharded_trainer<layout::flat<float>>>> ranked(ranks);
    std::vector<std::vector<std::vector<float>>> before(ranks), after(ranks);
    std::vector<std::string> failures(ranks);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::string> errors = on_every_rank(ranks, [&](std::size_t r) {
      pipeline_options options = base;
      options.processes = group[r];
      options.buckets.cap_bytes = 1;
      ranked[r] = make_trainer<sharded_trainer<layout::flat<float>>>(towers, {}, options);
      sharded_trainer<layout::flat<float>>& p = *ranked[r];
      if (!train(p, 1, true, r)) throw std::runtime_error("step 1's buckets did not go during the towers");
      for (std::size_t v = 0; v < model.count(); ++v) before[r].emplace_back(p.parameter(v).begin(), p.parameter(v).end());
      const std::vector<float> x{1.0f, 0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.5f, 3.0f, -2.0f};  // a batch does not own its data
      batch whole;
      whole.add("x", x, {1});
      const batch_part part = p.process_part(whole.examples());
      try {
        p.step(whole.slice(part.first, part.examples), [&](auto& tower) {
          for (std::size_t v = tower.variables().count(); v-- > 0;) {  // the last three variables, each a bucket
            if (v == 1 && r == 1 && tower.tower() == 1) throw std::runtime_error("layer gone");
            for (auto& g : tower.gradient(v)) g = 0.25f;
            tower.gradient_ready(v);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
          return 0.0;
        });
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
      for (std::size_t v = 0; v < model.count(); ++v) after[r].emplace_back(p.parameter(v).begin(), p.parameter(v).end());
      if (!train(p, 1, true, r)) throw std::runtime_error("step 2's buckets did not go during the towers");
    });
    REQUIRE(errors == std::vector<std::string>(ranks));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));  // nobody waited for a deadline
    for (std::size_t r = 0; r < ranks; ++r) {
      INFO("rank " << r);
      CHECK_THAT(failures[r], Catch::Contains("layer gone") && !Catch::Contains("had applied"));
      REQUIRE(after[r] == before[r]);
    }
    require_parameters_equal(ranked, *reference);  // the failed step left no trace
  }
}

TEST_CASE("buckets change no bit for SGD with momentum and AdamW", "[overlap]") {
  optim::sgd::hyper_parameters sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  check_buckets_change_no_bit<pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>>(sgd, unchecked());
  optim::adamw::hyper_parameters adamw;
  adamw.weight_decay = 0.05;
  check_buckets_change_no_bit<pipeline<exec::host, reduce::host, optim::adamw, layout::flat<float>>>(adamw, {});
}

TEST_CASE("buckets change no bit with clipping, loss scaling, accumulation and 16-bit towers", "[overlap]") {
  pipeline_options clipped;
  clipped.max_grad_norm = 0.05;  // below the gradients' norm: every step clips
  check_buckets_change_no_bit<adam_trainer<layout::flat<float>>>(optim::adam::hyper_parameters{}, clipped);
  pipeline_options scaled;
  scaled.loss_scale.mode = loss_scale_mode::dynamic;
  check_buckets_change_no_bit<adam_trainer<layout::flat<float>>>(optim::adam::hyper_parameters{}, scaled);
  pipeline_options accumulating;
  accumulating.accumulation_steps = 2;  // the second micro-batch reduces after the towers
  check_buckets_change_no_bit<adam_trainer<layout::flat<float>>>(optim::adam::hyper_parameters{}, accumulating, 6);
  check_buckets_change_no_bit<adam_trainer<layout::flat<bfloat16>>>(optim::adam::hyper_parameters{}, {});
  check_buckets_change_no_bit<adam_trainer<layout::per_variable<float16>>>(optim::adam::hyper_parameters{}, {});
}

using small_trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
const variable_set small_model{{"w", {4, 3}}, {"b", {4}}};

std::unique_ptr<small_trainer> make_small(const pipeline_options& options = {}) {
  auto p = std::make_unique<small_trainer>(small_model, model_inputs, 2, optim::adam::hyper_parameters{}, options);
  const std::vector<float> w{0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f, 0.9f, 1.0f, 1.1f, -1.2f};
  p->set_parameter("w", w.data(), w.size());
  return p;
}

step_stats small_step(small_trainer& p, const std::function<void(small_trainer::tower_context&)>& tower_fn) {
  const std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f};
  batch b;
  b.add("x", x, {1});
  return p.step(b, [&](small_trainer::tower_context& tower) {
    tower_fn(tower);
    return 0.0;
  });
}

void write_all(small_trainer::tower_context& tower) {
  for (std::size_t v = 0; v < tower.variables().count(); ++v) {
    for (float& g : tower.gradient(v)) g = 0.5f;
  }
}

std::vector<std::vector<float>> parameters_and_state(const small_trainer& p) {
  std::vector<std::vector<float>> all;
  for (std::size_t v = 0; v < small_model.count(); ++v) {
    all.emplace_back(p.parameter(v).begin(), p.parameter(v).end());
    for (std::size_t slot = 0; slot < p.optimizer_state_slots(); ++slot)
      all.emplace_back(p.optimizer_state(slot, v).begin(), p.optimizer_state(slot, v).end());
  }
  return all;
}

TEST_CASE("marking breaks of the contract fail the step naming tower and variable, and change nothing", "[overlap][errors]") {
  const auto holder = make_small();
  small_trainer& p = *holder;
  small_step(p, write_all);
  const auto before = parameters_and_state(p);
  CHECK_THROWS_WITH(small_step(p, [](small_trainer::tower_context& tower) { tower.gradient_ready("b"); }),
                    Catch::Contains("tower 0: gradient_ready('b') before its gradient was written"));
  CHECK_THROWS_WITH(small_step(p,
                               [](small_trainer::tower_context& tower) {
                                 write_all(tower);
                                 tower.gradient_ready("w");
                                 if (tower.tower() == 1) tower.gradient_ready("w");
                               }),
                    Catch::Contains("tower 1: gradient_ready('w') called twice in one step"));
  CHECK_THROWS_WITH(small_step(p,
                               [](small_trainer::tower_context& tower) {
                                 write_all(tower);
                                 tower.gradient_ready("b");
                                 if (tower.tower() == 1) tower.gradient("b");
                               }),
                    Catch::Contains("tower 1: wrote the gradient of variable 'b' after gradient_ready('b')"));
  CHECK_THROWS_WITH(small_step(p,
                               [](small_trainer::tower_context& tower) {
                                 write_all(tower);
                                 tower.gradient_ready(std::size_t{0});
                                 tower.parameter("w");
                               }),
                    Catch::Contains("tower 0: read the parameter of variable 'w' after gradient_ready('w')"));
  CHECK_THROWS_WITH(small_step(p, [](small_trainer::tower_context& tower) { tower.gradient_ready(7); }),
                    Catch::Contains("variable index 7 is out of range"));
  REQUIRE(parameters_and_state(p) == before);
  REQUIRE(p.steps_done() == 1);
}

TEST_CASE("poison_gradients finds a gradient changed through an older view after its mark", "[overlap][errors]") {
  pipeline_options options;
  options.poison_gradients = true;
  const auto holder = make_small(options);
  small_trainer& p = *holder;
  small_step(p, write_all);
  const auto before = parameters_and_state(p);
  CHECK_THROWS_WITH(small_step(p,
                               [](small_trainer::tower_context& tower) {
                                 const tensor_view<float> w = tower.gradient("w");
                                 write_all(tower);
                                 tower.gradient_ready("w");
                                 if (tower.tower() == 1) w[5] = 2.0f;
                               }),
                    Catch::Contains("tower 1: the gradient of variable 'w' changed after gradient_ready('w')"));
  REQUIRE(parameters_and_state(p) == before);
  small_step(p, [](small_trainer::tower_context& tower) {  // a good step with marks passes the check
    write_all(tower);
    tower.gradient_ready("w");
  });
  REQUIRE(p.steps_done() == 2);
}

// Both towers mark w (a bucket of its own with a cap of one byte), then tower 1 throws before b.
void fail_after_first_bucket(small_trainer::tower_context& tower) {
  write_all(tower);
  tower.gradient_ready("b");
  if (tower.tower() == 1) throw std::runtime_error("out of memory in layer 0");
  tower.gradient_ready("w");
}

TEST_CASE("a tower failing after a bucket went: a checked step changes nothing, an unchecked one says what it applied",
          "[overlap][errors]") {
  pipeline_options options;
  options.buckets.cap_bytes = 1;  // buckets {b}, {w}
  const auto checked_holder = make_small(options);
  small_trainer& checked = *checked_holder;
  small_step(checked, write_all);
  const auto before = parameters_and_state(checked);
  CHECK_THROWS_WITH(small_step(checked, fail_after_first_bucket), Catch::Contains("tower 1 threw: out of memory in layer 0") &&
                                                                      !Catch::Contains("had applied"));
  REQUIRE(parameters_and_state(checked) == before);
  REQUIRE(checked.steps_done() == 1);

  options.on_nonfinite = nonfinite_policy::unchecked;
  const auto fused_holder = make_small(options);
  small_trainer& fused = *fused_holder;
  small_step(fused, write_all);
  const auto fused_before = parameters_and_state(fused);
  CHECK_THROWS_WITH(small_step(fused, fail_after_first_bucket),
                    Catch::Contains("tower 1 threw: out of memory in layer 0") &&
                        Catch::Contains("step 2 had applied 1 of its 2 gradient bucket(s) already"));
  const auto after = parameters_and_state(fused);
  REQUIRE(after[0] == fused_before[0]);  // w: its bucket never went
  REQUIRE(after[3] != fused_before[3]);  // b took the update
  REQUIRE(fused.steps_done() == 1);
  small_step(fused, write_all);  // and the pipeline goes on
  REQUIRE(fused.steps_done() == 2);
}

TEST_CASE("marks that overlap nothing are not reported as overlap, and a model of one bucket says so", "[overlap]") {
  std::vector<std::string> lines;
  set_log_sink([&](const std::string& line) { lines.push_back(line); });
  const auto holder = make_small();  // 64 B of gradients: one bucket under the defaults
  small_step(*holder, write_all);     // no marks: nothing to say
  CHECK(lines.empty());
  const auto mark_both = [](small_trainer::tower_context& tower) {
    write_all(tower);
    tower.gradient_ready("b");
    tower.gradient_ready("w");
  };
  const step_stats one = small_step(*holder, mark_both);
  small_step(*holder, mark_both);
  set_log_sink(nullptr);
  REQUIRE(lines.size() == 1);  // once, at the first mark
  CHECK_THAT(lines[0], Catch::Contains("one gradient bucket: the first bucket's cap of 1048576 bytes holds all 64 bytes") &&
                           Catch::Contains("overlaps nothing"));
  REQUIRE(one.buckets == 1);
  REQUIRE(one.buckets_during_towers == 0);  // the bucket was ready only at the last tower's last mark

  pipeline_options options;
  options.buckets.cap_bytes = 1;  // {b}, {w}: b is ready while w is still to be marked
  const auto split = make_small(options);
  const step_stats two = small_step(*split, mark_both);
  REQUIRE(two.buckets == 2);
  REQUIRE(two.buckets_during_towers == 1);
}

TEST_CASE("towers that mark nothing, or only part, reduce the rest after returning", "[overlap]") {
  pipeline_options options;
  options.buckets.cap_bytes = 1;
  const auto holder = make_small(options);
  small_trainer& p = *holder;
  const step_stats none = small_step(p, write_all);
  REQUIRE(none.buckets == 2);
  REQUIRE(none.buckets_during_towers == 0);
  const step_stats part = small_step(p, [](small_trainer::tower_context& tower) {
    write_all(tower);
    tower.gradient_ready("b");  // w is marked at return
  });
  REQUIRE(part.buckets_during_towers == 1);
  // Tower 1 completes b only by returning: b goes during the towers if tower 0's mark comes after that
  // return (the driver's own test above fixes the order), else after them; the bits are the same.
  const step_stats one_tower = small_step(p, [](small_trainer::tower_context& tower) {
    write_all(tower);
    if (tower.tower() == 0) tower.gradient_ready("b");
  });
  REQUIRE(one_tower.buckets_during_towers <= 1);
}

}  // namespace

namespace {

// The driver's order (pipeline/step_parts.hpp), as GPU towers need it: a bucket reaches its part only
// after every tower was told it had completed the bucket (there it records the event the part waits
// for) — also a tower that completed it by returning, before another tower's mark made it ready — each
// bucket once; and what the towers left comes after them, in one part. One thread plays the towers in
// turn, in a chosen order.
struct driver_log {
  std::vector<std::vector<int>> told = std::vector<std::vector<int>>(3, std::vector<int>(3, 0));  // [bucket][tower]
  std::vector<std::string> faults;
  std::vector<int> parts = std::vector<int>(3, 0);
  std::vector<std::vector<std::size_t>> rest;
  bool fail_buckets = false;  // every bucket's part throws
  int abandoned = 0;
};

// Three towers that tell the log of each completed bucket (GPU towers record an event there).
struct logging_towers {
  driver_log& log;
  detail::tower_ready_listener* listener = nullptr;
  std::size_t towers() const { return 3; }
  void prepare_bucket_events(std::size_t) {}
  void set_ready_listener(detail::tower_ready_listener* l) { listener = l; }
  void record_bucket_done(std::size_t tower, std::size_t bucket) { ++log.told[bucket][tower]; }
};
// A reducer that logs its parts and checks that every tower was told of a bucket before its part.
struct logging_reducer {
  driver_log& log;
  struct work {
    bool parts_during_towers = true;
    bool checked = false;
  };
  void begin_step(logging_towers&, const work&) {}
  void reduce_part(logging_towers&, const detail::step_part& part) {
    if (!part.during_towers()) return log.rest.push_back(part.variables);
    if (log.fail_buckets) detail::fail("a bucket's part failed");
    ++log.parts[part.bucket];
    for (std::size_t t = 0; t < 3; ++t) {
      if (log.told[part.bucket][t] != 1)
        log.faults.push_back("bucket " + std::to_string(part.bucket) + " went before tower " + std::to_string(t) + " was told");
    }
  }
  void abandon(logging_towers&) { ++log.abandoned; }
};
using logged_parts = detail::step_parts<logging_towers, logging_reducer>;

// Tower `tower` marks `marked` (variable indices, in order), then returns.
void play_tower(logged_parts& parts, std::size_t tower, const std::vector<std::size_t>& marked) {
  std::vector<char> ready(plan_variables.count(), 0);
  for (std::size_t v : marked) {
    parts.gradient_ready(tower, v);
    ready[v] = 1;
  }
  parts.tower_returned(tower, ready);
}

void play_step(driver_log& log, const std::function<void(logged_parts&)>& towers) {
  gradient_buckets options;
  options.cap_bytes = 100;  // {d}, {c, b}, {a}
  logging_towers space{log};
  logging_reducer reducer{log};
  const detail::tracer no_timeline;
  logged_parts parts(plan_variables, options, sizeof(float), space, reducer, no_timeline);
  parts.begin(logging_reducer::work{}, 1);
  towers(parts);
  parts.after_towers(false);
}

TEST_CASE("a bucket's part runs after every tower's tower_done for it, once, and the rest after the towers",
          "[overlap][buckets]") {
  driver_log early_return;  // tower 2 completes {c, b} and {a} by returning; tower 0's marks then make them ready
  play_step(early_return, [](logged_parts& parts) {
    play_tower(parts, 2, {3, 2});
    play_tower(parts, 1, {3, 2, 1, 0});
    play_tower(parts, 0, {3, 2, 1, 0});
  });
  CHECK(early_return.faults.empty());
  CHECK(early_return.parts == std::vector<int>{1, 1, 1});
  REQUIRE(early_return.rest.size() == 1);
  CHECK(early_return.rest[0].empty());

  driver_log late_return;  // tower 2 returns last: {c, b} and {a} wait for the rest
  play_step(late_return, [](logged_parts& parts) {
    play_tower(parts, 0, {3, 2, 1, 0});
    play_tower(parts, 1, {3, 2, 1, 0});
    play_tower(parts, 2, {3, 2});
  });
  CHECK(late_return.faults.empty());
  CHECK(late_return.parts == std::vector<int>{1, 0, 0});
  REQUIRE(late_return.rest.size() == 1);
  CHECK(late_return.rest[0] == std::vector<std::size_t>{2, 1, 0});  // {c, b} then {a}, in the plan's order
}

// Across processes the rest is reduced (the exchanges made) before the processes agree on the towers,
// also after a bucket's part failed on the worker; that failure is then rethrown there, or this process
// alone would fail later, in finish(), and leave the others in the exchange. In one process a bucket's
// failure ends the step before the rest.
TEST_CASE("after_towers rethrows a bucket part's failure, after the rest only across processes", "[overlap][buckets]") {
  for (bool settling : {true, false}) {
    driver_log log;
    log.fail_buckets = true;
    gradient_buckets options;
    options.cap_bytes = 100;  // {d}, {c, b}, {a}
    logging_towers space{log};
    logging_reducer reducer{log};
    const detail::tracer no_timeline;
    logged_parts parts(plan_variables, options, sizeof(float), space, reducer, no_timeline);
    parts.begin(logging_reducer::work{}, 1);
    for (std::size_t t = 0; t < 3; ++t) play_tower(parts, t, {3});  // {d} goes on the worker and fails there
    CHECK_THROWS_WITH(parts.after_towers(settling), Catch::Contains("a bucket's part failed"));
    CHECK(log.rest.size() == (settling ? 1u : 0u));
    CHECK(parts.abandon() == 0);
    CHECK(log.abandoned == 1);
  }
}

}  // namespace
