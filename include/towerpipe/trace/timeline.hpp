#pragma once
// A timeline of pipeline steps in Chrome's trace format (chrome://tracing, Perfetto): one row per tower
// ("tower 0", ...) and one per pipeline stage ("split", "reduce"), each span tagged with its step. Give a pipeline a timeline through pipeline_options::trace; with none (the
// default) nothing is recorded and a step pays one pointer test per stage.
//
// Times are host clock times (steady_clock, microseconds since the timeline was made). For GPU towers
// the "tower i" rows show the tower function enqueueing its work on the host, and rows "tower i (GPU)"
// (compute; p2p_tree's edges and pulls), "tower i (GPU copy)" (the shard's host-to-device copy) and
// "reduce (GPU)" what the devices ran: CUDA event times converted to the host clock through an
// event that each tower's device completed at a known host time. The GPU stages also open NVTX ranges
// (cuda/nvtx.cuh), which Nsight Systems shows beside the kernels.

#include <chrono>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <string>
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

  // Thread-safe: towers record from their own threads.
  void record(const std::string& row, const std::string& name, clock::time_point start, clock::time_point end,
              std::int64_t step) {
    const span s{row, name, microseconds(start), std::chrono::duration<double, std::micro>(end - start).count(), step};
    std::lock_guard<std::mutex> lock(mutex_);
    spans_.push_back(s);
  }

  std::vector<span> spans() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return spans_;
  }

  // Writes {"traceEvents": [...]}: a thread_name record per row, then one complete ("X") event per span.
  void write_chrome_trace(const std::string& path) const {
    const std::vector<span> all = spans();
    std::vector<std::string> rows;
    for (const span& s : all) {
      if (row_index(rows, s.row) == rows.size()) rows.push_back(s.row);
    }
    std::ofstream out(path);
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    for (std::size_t r = 0; r < rows.size(); ++r) {
      out << "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": " << r << ", \"args\": {\"name\": \""
          << rows[r] << "\"}},\n";
    }
    for (std::size_t i = 0; i < all.size(); ++i) {
      const span& s = all[i];
      out << "  {\"name\": \"" << s.name << "\", \"ph\": \"X\", \"pid\": 1, \"tid\": " << row_index(rows, s.row)
          << ", \"ts\": " << s.start_us << ", \"dur\": " << s.duration_us << ", \"args\": {\"step\": " << s.step << "}}"
          << (i + 1 < all.size() ? ",\n" : "\n");
    }
    out << "]}\n";
    if (!out) detail::fail("timeline: cannot write ", path);
  }

 private:
  double microseconds(clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - origin_).count(); }
  static std::size_t row_index(const std::vector<std::string>& rows, const std::string& row) {
    std::size_t i = 0;
    while (i < rows.size() && rows[i] != row) ++i;
    return i;
  }

  clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<span> spans_;
};

}  // namespace towerpipe
