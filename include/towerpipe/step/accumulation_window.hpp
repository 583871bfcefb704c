#pragma once
// Gradient accumulation (pipeline_options::accumulation_steps): which micro-batch of its window a
// step's batch is, the examples the window has averaged so far, and the first non-finite value any of
// its micro-batches had. The optimizer runs at the window's last micro-batch, on the average over all
// its examples; a non-finite value anywhere in the window skips it there.

#include <algorithm>
#include <cstddef>

#include "towerpipe/kernels/screen.hpp"

namespace towerpipe {
namespace detail {

class accumulation_window {
 public:
  explicit accumulation_window(std::size_t steps) : steps_(steps) {}

  std::size_t pending() const { return micro_batches_; }  // micro-batches averaged, 0 between windows
  std::size_t micro_batch() const { return micro_batches_ + 1; }  // this step's, from 1

  // Where a micro-batch of `examples` stands in the window (kernels/screen.hpp, accumulation).
  template <class T>
  accumulation<T> place(std::size_t examples) const {
    accumulation<T> window;
    if (steps_ == 1) return window;
    window.first = micro_batches_ == 0;
    window.last = micro_batches_ + 1 == steps_;
    window.micro_weight = static_cast<T>(examples);
    window.inverse_total = static_cast<T>(1.0 / static_cast<double>(examples_ + examples));
    return window;
  }

  // A micro-batch that is not the window's last was averaged in, with its first non-finite key.
  void add(std::size_t examples, nonfinite_key first_nonfinite) {
    ++micro_batches_;
    examples_ += examples;
    pending_nonfinite_ = std::min(pending_nonfinite_, first_nonfinite);
  }
  // The first non-finite key of the whole window, given this (last) micro-batch's.
  nonfinite_key first_nonfinite(nonfinite_key mine) const { return std::min(pending_nonfinite_, mine); }

  // After the window's last micro-batch, or a failure half-way through the running sum.
  void reset() {
    micro_batches_ = 0;
    examples_ = 0;
    pending_nonfinite_ = no_nonfinite;
  }

 private:
  std::size_t steps_;
  std::size_t micro_batches_ = 0, examples_ = 0;
  nonfinite_key pending_nonfinite_ = no_nonfinite;
};

}  // namespace detail
}  // namespace towerpipe
