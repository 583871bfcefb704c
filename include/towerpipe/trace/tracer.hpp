#pragma once
// The one place where a pipeline's parts decide whether to record: a tracer wraps the timeline of
// pipeline_options::trace (or none). Every part records through it; with no timeline each call is one
// test of a pointer, and no row name is formatted.

#include <cstdint>
#include <string>

#include "towerpipe/core/error.hpp"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

class tracer {
 public:
  explicit tracer(timeline* trace = nullptr) : trace_(trace) {}

  bool on() const { return trace_ != nullptr; }

  // Records the span [start, end) on the row named by the concatenation of row_parts.
  template <class... RowParts>
  void span(const std::string& name, timeline::clock::time_point start, timeline::clock::time_point end, std::int64_t step,
            const RowParts&... row_parts) const {
    if (trace_ != nullptr) trace_->record(make_message(row_parts...), name, start, end, step);
  }

 private:
  timeline* trace_;
};

}  // namespace detail
}  // namespace towerpipe
