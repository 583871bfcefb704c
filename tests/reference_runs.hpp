#pragma once
// A run of some pipeline against the exec::host pipeline (reduce::host, the same layout and options),
// step by step on the same gradients: after every step the parameters, the optimizer state and the
// step's report (loss, skip, accumulation, clip, norm, the first non-finite element's tower, variable and
// element) must be bitwise the host's. Used by the simulated-device tests
// (tests/host/test_simulated_reducers.cpp) and by the GPU tests (tests/cuda/gpu_support.cuh), with the
// same variables' structure: "odd" (index 3) has at least 4001 elements, "w" (index 0) at least 6.
//
// The towers write their gradients from the plan with write_gradient (a copy on the tower's stream for
// device towers) in backward order, marking each ready when `mark` (gradient buckets during the towers).

#include <towerpipe/io/checkpoint.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace towerpipe_tests {

// One step's gradients, [tower][variable], in the towers' stored type.
template <class Stored>
using step_gradients = std::vector<std::vector<std::vector<Stored>>>;

template <class Stored>
std::vector<step_gradients<Stored>> draw_plan(random_source& random, const towerpipe::variable_set& variables, std::size_t towers,
                                              int steps) {
  std::vector<step_gradients<Stored>> plan(static_cast<std::size_t>(steps), step_gradients<Stored>(towers));
  for (auto& step : plan) {
    for (auto& tower : step) {
      for (const towerpipe::variable& v : variables) {
        const std::vector<float> values = random.wide(v.size);
        tower.emplace_back();
        for (float x : values) tower.back().push_back(static_cast<Stored>(x));
      }
    }
  }
  return plan;
}

// The tower function: the plan's gradients, variable by variable in backward order.
template <class Stored>
struct plan_tower {
  const step_gradients<Stored>* step;
  bool mark;
  template <class Context>
  double operator()(Context& tower) const {
    for (std::size_t v = tower.variables().count(); v-- > 0;) {
      const std::vector<Stored>& g = (*step)[tower.tower()][v];
      tower.write_gradient(v, g.data(), g.size());
      if (mark) tower.gradient_ready(v);
    }
    return 0.25 * static_cast<double>(tower.tower() + 1);
  }
};

template <class Pipeline, class Stored>
towerpipe::step_stats run_step(Pipeline& p, const step_gradients<Stored>& gradients, std::size_t examples, bool mark) {
  const std::vector<float> x(examples, 1.0f);
  towerpipe::batch b;
  b.add("x", x.data(), examples, {1});
  return p.step(b, plan_tower<Stored>{&gradients, mark});
}

// Parameters and optimizer state bitwise.
template <class A, class B>
void check_alike(A& mine, B& reference) {
  for (std::size_t v = 0; v < reference.variables().count(); ++v) {
    INFO("variable " << reference.variables()[v].name);
    CHECK(first_bitwise_difference(mine.parameter(v), reference.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < reference.optimizer_state_slots(); ++slot)
      CHECK(first_bitwise_difference(mine.optimizer_state(slot, v), reference.optimizer_state(slot, v)) == -1);
  }
  CHECK(mine.steps_done() == reference.steps_done());
}
// The step's report.
inline void check_alike(const towerpipe::step_stats& mine, const towerpipe::step_stats& reference) {
  CHECK(mine.loss == reference.loss);
  CHECK(mine.skipped == reference.skipped);
  CHECK(mine.accumulating == reference.accumulating);
  CHECK(mine.clip_coefficient == reference.clip_coefficient);
  // Bitwise: a skipped step's norm is NaN, which == never matches.
  REQUIRE(mine.gradient_norm.has_value() == reference.gradient_norm.has_value());
  if (mine.gradient_norm) CHECK(std::memcmp(&*mine.gradient_norm, &*reference.gradient_norm, sizeof(double)) == 0);
  CHECK(mine.nonfinite.has_value() == reference.nonfinite.has_value());
  if (mine.nonfinite && reference.nonfinite) {
    CHECK(mine.nonfinite->variable == reference.nonfinite->variable);
    CHECK(mine.nonfinite->element == reference.nonfinite->element);
    CHECK(mine.nonfinite->tower == reference.nonfinite->tower);
  }
}

// What a run does besides the steps.
struct run_case {
  towerpipe::pipeline_options options;  // checked or not, clipping, loss scaling, accumulation, buckets
  bool mark = true;                     // towers mark their gradients ready (buckets during the towers)
  int steps = 4;
  int bad_step = -1;        // a NaN (tower towers-1, "odd"[4000]) and an infinity ("w"[5]) in this step's gradients
  bool checkpoint = false;  // the pipeline saves after step 2 and a fresh one resumes from the file
};

inline towerpipe::pipeline_options unchecked() {
  towerpipe::pipeline_options options;
  options.on_nonfinite = towerpipe::nonfinite_policy::unchecked;
  return options;
}
inline towerpipe::pipeline_options small_buckets(towerpipe::pipeline_options options) {
  options.buckets.cap_bytes = 1;  // a bucket per variable
  return options;
}
inline towerpipe::pipeline_options clipped(towerpipe::pipeline_options options) {
  options.max_grad_norm = 0.5;
  return options;
}

// Runs case `c` on the pipeline make() builds (a std::unique_ptr; called again to resume from a
// checkpoint) and on the host pipeline with `towers` towers and c.options, from the same initial
// parameters; checks them alike after every step. after_step(s, mine) runs after each step's checks.
template <class Layout, class Optim, class Make, class AfterStep>
void compare_with_host(const towerpipe::variable_set& variables, const std::vector<towerpipe::input_spec>& inputs,
                       std::size_t towers, const run_case& c, random_source& random, Make make, AfterStep after_step) {
  using namespace towerpipe;
  using stored = typename Layout::value_type;
  auto plan = draw_plan<stored>(random, variables, towers, c.steps);
  if (c.bad_step >= 0) {
    auto& bad = plan[static_cast<std::size_t>(c.bad_step)];
    bad[towers - 1][3][4000] = static_cast<stored>(std::numeric_limits<float>::quiet_NaN());
    bad[0][0][5] = static_cast<stored>(std::numeric_limits<float>::infinity());
  }
  const std::size_t examples = 3 * towers - 1;  // uneven: distinct weights
  auto mine = make();
  pipeline_options host_options = c.options;
  host_options.time_backends = 0;  // reduce::automatic's only
  pipeline<exec::host, reduce::host, Optim, Layout> reference(variables, inputs, towers, typename Optim::hyper_parameters{},
                                                              host_options);
  for (std::size_t v = 0; v < variables.count(); ++v) {
    const std::vector<float> initial = random.normal(variables[v].size);
    mine->set_parameter(v, initial.data(), initial.size());
    reference.set_parameter(v, initial.data(), initial.size());
  }
  const std::string path = "reference_run_" + std::to_string(random.seed()) + ".ckpt";
  for (int s = 0; s < c.steps; ++s) {
    INFO("step " << s + 1);
    const step_stats theirs = run_step(reference, plan[static_cast<std::size_t>(s)], examples, c.mark);
    const step_stats ours = run_step(*mine, plan[static_cast<std::size_t>(s)], examples, c.mark);
    check_alike(ours, theirs);
    check_alike(*mine, reference);
    if (c.checkpoint && s == 1) {
      save_checkpoint(*mine, path);
      mine = make();
      load_checkpoint(*mine, path);
      std::remove(path.c_str());
      check_alike(*mine, reference);
    }
    after_step(s, *mine);
  }
}

}  // namespace towerpipe_tests
