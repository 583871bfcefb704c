// The timeline: every stage of every step, one row per tower, in a Chrome trace file.
#include <towerpipe/towerpipe.hpp>
#include <towerpipe/comm/thread_group.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>

using namespace towerpipe;

TEST_CASE("a host pipeline records split, each tower's compute and the reduction of every step", "[timeline]") {
  using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
  timeline trace;
  pipeline_options options;
  options.trace = &trace;
  trainer p(variable_set{{"w", {100}}}, {{"x", dtype::float32, {1}}}, 3, optim::sgd::hyper_parameters{}, options);
  const std::vector<float> x(6, 1.0f);
  batch b;
  b.add("x", x.data(), 6, {1});
  for (int s = 0; s < 4; ++s) {
    p.step(b, [](trainer::tower_context& tower) {
      for (float& g : tower.gradient(0)) g = 1.0f;
      return 0.0;
    });
  }
  std::map<std::pair<std::string, std::int64_t>, int> count;
  for (const timeline::span& s : trace.spans()) {
    ++count[{s.row, s.step}];
    CHECK(s.duration_us >= 0);
    CHECK(s.start_us >= 0);
  }
  for (std::int64_t step = 1; step <= 4; ++step) {
    INFO("step " << step);
    for (const char* row : {"split", "tower 0", "tower 1", "tower 2", "reduce"}) CHECK(count[{row, step}] == 1);
  }
  CHECK(trace.spans().size() == 4 * 5);

  // Within a step: split before every tower, every tower before the reduction.
  for (std::int64_t step = 1; step <= 4; ++step) {
    double split_end = 0, towers_end = 0, reduce_start = 0;
    for (const timeline::span& s : trace.spans()) {
      if (s.step != step) continue;
      if (s.row == "split") split_end = s.start_us + s.duration_us;
      if (s.row == "reduce") reduce_start = s.start_us;
    }
    for (const timeline::span& s : trace.spans()) {
      if (s.step != step || s.row.rfind("tower", 0) != 0) continue;
      CHECK(s.start_us >= split_end);
      towers_end = std::max(towers_end, s.start_us + s.duration_us);
    }
    CHECK(reduce_start >= towers_end);
  }

  const std::string path = "/tmp/towerpipe_test_" + std::to_string(::getpid()) + "_trace.json";
  trace.write_chrome_trace(path);
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.rfind("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", 0) == 0);
  CHECK(text.find("\"args\": {\"name\": \"tower 2\"}") != std::string::npos);
  std::size_t complete_events = 0;
  for (std::size_t at = text.find("\"ph\": \"X\""); at != std::string::npos; at = text.find("\"ph\": \"X\"", at + 1)) ++complete_events;
  CHECK(complete_events == 20);
  std::remove(path.c_str());
}

TEST_CASE("the trace lists its rows in reading order: split, towers by number with their GPU rows, reduce",
          "[timeline]") {
  const std::vector<std::string> shuffled{"reduce (GPU)", "tower 10", "tower 2 (GPU)", "reduce", "tower 2",
                                          "tower 10 (GPU copy)", "split", "tower 0", "tower 10 (GPU)"};
  timeline trace;
  const auto now = timeline::clock::now();
  for (const std::string& row : shuffled) trace.record(row, "work", now, now, 1);
  const std::string path = "/tmp/towerpipe_test_rows_" + std::to_string(::getpid()) + ".json";
  trace.write_chrome_trace(path);
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::string> expected{"split", "tower 0", "tower 2", "tower 2 (GPU)", "tower 10",
                                          "tower 10 (GPU copy)", "tower 10 (GPU)", "reduce", "reduce (GPU)"};
  for (std::size_t r = 0; r < expected.size(); ++r) {
    INFO(expected[r]);
    CHECK(json.find("\"tid\": " + std::to_string(r) + ", \"args\": {\"name\": \"" + expected[r] + "\"}") != std::string::npos);
    CHECK(json.find("\"tid\": " + std::to_string(r) + ", \"args\": {\"sort_index\": " + std::to_string(r) + "}") !=
          std::string::npos);
  }
  std::remove(path.c_str());
}

TEST_CASE("pause and resume limit the timeline to some steps, clear drops what it holds", "[timeline]") {
  using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;
  timeline trace;
  pipeline_options options;
  options.trace = &trace;
  trainer p(variable_set{{"w", {10}}}, {{"x", dtype::float32, {1}}}, 2, optim::sgd::hyper_parameters{}, options);
  const std::vector<float> x(4, 1.0f);
  batch b;
  b.add("x", x.data(), 4, {1});
  const auto step = [&] {
    p.step(b, [](trainer::tower_context& tower) {
      for (float& g : tower.gradient(0)) g = 1.0f;
      return 0.0;
    });
  };
  step();  // step 1: recorded
  trace.pause();
  CHECK_FALSE(trace.recording());
  step();  // step 2: not
  trace.resume();
  step();  // step 3: recorded
  std::map<std::int64_t, int> spans_of_step;
  for (const timeline::span& s : trace.spans()) ++spans_of_step[s.step];
  CHECK(spans_of_step == std::map<std::int64_t, int>{{1, 4}, {3, 4}});  // split, 2 towers, reduce
  trace.clear();
  CHECK(trace.spans().empty());
  step();
  CHECK(trace.spans().size() == 4);
}

TEST_CASE("across processes each rank's timeline numbers towers globally and writes its rank's pid", "[timeline][ranks]") {
  // Two ranks of two towers each: rank 1's towers are towers 2 and 3, its file pid 2, "rank 1 of 2".
  using sharded_trainer = pipeline<exec::host, reduce::sharded, optim::sgd, layout::flat<float>>;
  const auto group = thread_process_group::create(2);
  std::vector<timeline> traces(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        pipeline_options options;
        options.trace = &traces[r];
        options.processes = group[r];
        sharded_trainer p(variable_set{{"w", {10}}}, {{"x", dtype::float32, {1}}}, 2, optim::sgd::hyper_parameters{}, options);
        const std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f};
        batch b;
        b.add("x", x.data() + 2 * r, 2, {1});  // this rank's part of the global batch
        p.step(b, [](sharded_trainer::tower_context& tower) {
          for (float& g : tower.gradient(0)) g = 1.0f;
          return 0.0;
        });
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  CHECK(errors == std::vector<std::string>(2));
  const auto rows_of = [](const timeline& trace) {
    std::set<std::string> rows;
    for (const timeline::span& s : trace.spans()) rows.insert(s.row);
    return rows;
  };
  CHECK(rows_of(traces[0]) == std::set<std::string>{"split", "tower 0", "tower 1", "reduce"});
  CHECK(rows_of(traces[1]) == std::set<std::string>{"split", "tower 2", "tower 3", "reduce"});
  const std::string path = "/tmp/towerpipe_test_rank_" + std::to_string(::getpid()) + ".json";
  traces[1].write_chrome_trace(path);
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(json.find("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 2, \"args\": {\"name\": \"rank 1 of 2\"}}") != std::string::npos);
  CHECK(json.find("\"pid\": 1") == std::string::npos);
  std::remove(path.c_str());
}
