#pragma once
// A timeline of pipeline steps in Chrome's trace format (chrome://tracing, Perfetto): one row per tower
// ("tower 0", ...) and one per pipeline stage ("split", "reduce"), each span tagged with its step. Give
// a pipeline a timeline through pipeline_options::trace; with none (the default) nothing is recorded
// and a step pays one pointer test per stage. pause()/resume() limit it to some steps, clear() drops
// what it holds. Across processes (reduce::sharded) the pipeline numbers the tower rows globally and
// gives the file its rank's pid, so that the ranks' files can be loaded together.
// Why (times on the host clock, GPU rows): docs/design-notes.md#trace-timeline

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "towerpipe/core/error.hpp"

namespace towerpipe {

class timeline {
 public:
  using clock = std::chrono::steady_clock;

  struct span {
    std::string row, name;
    double start_us, duration_us;
    std::int64_t step;
  };

  timeline() : origin_(clock::now()) {}

  // Thread-safe: towers record from their own threads. Nothing is kept while paused.
  void record(const std::string& row, const std::string& name, clock::time_point start, clock::time_point end,
              std::int64_t step) {
    if (!recording()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.push_back({global_row(row), name, microseconds(start), std::chrono::duration<double, std::micro>(end - start).count(), step});
  }

  // Between steps, to trace only some of them.
  void pause() { recording_ = false; }
  void resume() { recording_ = true; }
  bool recording() const { return recording_; }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.clear();
  }

  // This timeline records process `rank` of `processes`, whose tower t is tower first_tower + t over
  // all processes: its tower rows carry global numbers, its file pid rank + 1 and the process name
  // "rank r of n". The pipeline calls it when pipeline_options::processes is set.
  void set_process(int rank, int processes, std::size_t first_tower) {
    std::lock_guard<std::mutex> lock(mutex_);
    rank_ = rank;
    processes_ = processes;
    first_tower_ = first_tower;
  }

  std::vector<span> spans() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spans_;
  }

  // Rows in reading order: "split", then tower by tower by number ("tower 2" before "tower 10", each
  // tower's GPU rows after it), then "reduce" and its GPU row, then anything else by name.
  static bool row_before(const std::string& a, const std::string& b) {
    const auto key = [](const std::string& row) {
      int group = 3;
      unsigned long tower = 0;
      if (row == "split") group = 0;
      if (row.rfind("tower ", 0) == 0) {
        group = 1;
        tower = std::strtoul(row.c_str() + 6, nullptr, 10);
      }
      if (row.rfind("reduce", 0) == 0) group = 2;
      return std::make_tuple(group, tower, row);
    };
    return key(a) < key(b);
  }

  // Writes {"traceEvents": [...]}: a thread_name and a thread_sort_index record per row (rows in
  // row_before's order), then one complete ("X") event per span.
  void write_chrome_trace(const std::string& path) const {
    std::vector<span> all;
    int rank = 0, processes = 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      all = spans_;
      rank = rank_;
      processes = processes_;
    }
    std::vector<std::string> rows;
    for (const span& s : all) {
      if (row_index(rows, s.row) == rows.size()) rows.push_back(s.row);
    }
    std::sort(rows.begin(), rows.end(), row_before);
    std::ofstream out(path);
    const int pid = rank + 1;
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    if (processes > 1)
      out << "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"name\": \"rank " << rank
          << " of " << processes << "\"}},\n";
    for (std::size_t r = 0; r < rows.size(); ++r) {
      out << "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << r
          << ", \"args\": {\"name\": \"" << rows[r] << "\"}},\n";
      out << "  {\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << r
          << ", \"args\": {\"sort_index\": " << r << "}},\n";
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
      const span& s = all[i];
      out << "  {\"name\": \"" << s.name << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": " << row_index(rows, s.row)
          << ", \"ts\": " << s.start_us << ", \"dur\": " << s.duration_us << ", \"args\": {\"step\": " << s.step << "}}"
          << (i + 1 < all.size() ? ",\n" : "\n");
    }
    out << "]}\n";
    out.flush();  // a full disk shows here, not in the destructor, which cannot report it
    if (!out) detail::fail("timeline: cannot write ", path);
  }

 private:
  // "tower 3 (GPU)" of rank 1 with 4 towers a process is "tower 7 (GPU)".
  std::string global_row(const std::string& row) const {
    if (first_tower_ == 0 || row.rfind("tower ", 0) != 0) return row;
    char* end = nullptr;
    const unsigned long local = std::strtoul(row.c_str() + 6, &end, 10);
    return "tower " + std::to_string(first_tower_ + local) + end;
  }

  double microseconds(clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }
  static std::size_t row_index(const std::vector<std::string>& rows, const std::string& row) {
    return static_cast<std::size_t>(std::find(rows.begin(), rows.end(), row) - rows.begin());
  }

  clock::time_point origin_;
  std::atomic<bool> recording_{true};
  int rank_ = 0, processes_ = 1;
  std::size_t first_tower_ = 0;
  mutable std::mutex mutex_;
  std::vector<span> spans_;
};

}  // namespace towerpipe
