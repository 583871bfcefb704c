// The timeline: every stage of every step, one row per tower, in a Chrome trace file.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
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
