// What the towers see and what the timeline records, on GPU towers (tests/cuda/gpu_support.cuh): shards
// staged ahead and in order, losses through device_loss(), clear errors, the devices' spans of every
// backend for checked and unchecked steps, stage times, and checkpoints between the host and every GPU
// backend.
#include "gpu_support.cuh"

using namespace gpu_tests;

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

// The device spans each backend records per step, row by row, for checked steps (the screen, then the
// apply: two passes) and unchecked ones (one fused pass).
using names = std::vector<std::string>;

TEST_CASE("the timeline holds device0's passes on row reduce (GPU), checked and unchecked", "[gpu][staging]") {
  const auto checked = traced_steps<reduce::device0>(2, true), unchecked = traced_steps<reduce::device0>(2, false);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    CHECK(span_names(checked, step, "reduce (GPU)") == names{"device0 apply + broadcast", "device0 average + screen"});
    CHECK(span_names(unchecked, step, "reduce (GPU)") == names{"device0 fused average + apply + broadcast"});
  }
}

TEST_CASE("the timeline shows p2p_tree's root passes, edges and pulls on the towers' rows", "[gpu][staging]") {
  // 4 towers: round 0 edges 0+1 and 2+3, root edge 0+2, whose pass also writes towers 1 and 2 (tower 0's
  // children in the tree); tower 3 pulls from tower 2.
  for (const bool checked : {true, false}) {
    const std::vector<timeline::span> spans = traced_steps<reduce::p2p_tree>(4, checked);
    for (std::int64_t step = 1; step <= 3; ++step) {
      INFO("step " << step << (checked ? ", checked" : ", unchecked"));
      CHECK(span_names(spans, step, "reduce (GPU)") ==
            (checked ? names{"p2p_tree root: last edge + apply", "p2p_tree root: last edge + screen"}
                     : names{"p2p_tree root: last edge + apply"}));
      CHECK(count_spans(spans, step, "tower 0 (GPU)", "tree edge: + tower 1") == 1);
      CHECK(count_spans(spans, step, "tower 2 (GPU)", "tree edge: + tower 3") == 1);
      CHECK(count_spans(spans, step, "tower 1 (GPU)", "broadcast") == 0);
      CHECK(count_spans(spans, step, "tower 2 (GPU)", "broadcast") == 0);
      CHECK(count_spans(spans, step, "tower 3 (GPU)", "broadcast: pull from tower 2") == 1);
    }
  }
}

// sharded: each owner's passes on its own row (the test model: every tower owns a slice); reduce::host:
// the host's reduce row, and each GPU tower's compute and copy rows.
TEST_CASE("the timeline holds sharded's owners and reduce::host's rows with GPU towers", "[gpu][staging]") {
  for (const bool checked : {true, false}) {
    const std::vector<timeline::span> sharded = traced_steps<reduce::sharded>(2, checked, test_variables);
    const std::vector<timeline::span> host = traced_steps<reduce::host>(2, checked, test_variables);
    for (std::int64_t step = 1; step <= 3; ++step) {
      INFO("step " << step << (checked ? ", checked" : ", unchecked"));
      for (std::size_t t = 0; t < 2; ++t) {
        INFO("tower " << t);
        CHECK(span_names(sharded, step, "reduce (GPU) owner " + std::to_string(t)) ==
              (checked ? names{"sharded apply + broadcast", "sharded average + screen"} : names{"sharded average + apply + broadcast"}));
        for (const auto* spans : {&sharded, &host}) {
          CHECK(count_spans(*spans, step, "tower " + std::to_string(t) + " (GPU)", "compute") == 1);
          CHECK(count_spans(*spans, step, "tower " + std::to_string(t) + " (GPU copy)", "split copy") == 1);
        }
      }
      CHECK(span_names(host, step, "reduce") == names{"average + apply + broadcast"});
      CHECK(count_spans(host, step, "reduce (GPU)", "") == 0);
    }
  }
}

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


TEST_CASE("a checkpoint moves between the host and every GPU backend, and the run resumes bitwise", "[gpu][checkpoint]") {
  check_checkpoint_through_gpu<reduce::device0>(700);
  check_checkpoint_through_gpu<reduce::p2p_tree>(800);
  check_checkpoint_through_gpu<reduce::sharded>(850);
  check_checkpoint_through_gpu<reduce::host>(900);
}
