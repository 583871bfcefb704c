#pragma once
// What a model's loss_and_gradient (examples/mlp.hpp, cnn.hpp) did with each variable, in order: its
// calls for a parameter or a gradient (accesses) and its ready marks (examples/ready_marks.hpp), to
// check where the marks fall.

#include <cstddef>
#include <utility>
#include <vector>

namespace towerpipe_tests {

class backward_log {
 public:
  // loss_and_gradient's callbacks: parameter(i) or gradient(i) over `values` (a vector per variable),
  // and ready(i).
  template <class T>
  auto access(std::vector<std::vector<T>>& values) {
    return [this, &values](std::size_t v) {
      events_.emplace_back(touch, v);
      return values[v].data();
    };
  }
  auto ready() {
    return [this](std::size_t v) { events_.emplace_back(mark, v); };
  }

  // The variables in the order they were marked.
  std::vector<std::size_t> marks() const {
    std::vector<std::size_t> order;
    for (const auto& [what, v] : events_) {
      if (what == mark) order.push_back(v);
    }
    return order;
  }
  // The variables read or written after their mark, once for each such access.
  std::vector<std::size_t> touched_after_mark() const {
    std::vector<std::size_t> late;
    std::vector<char> marked;
    for (const auto& [what, v] : events_) {
      if (marked.size() <= v) marked.resize(v + 1, 0);
      if (what == mark) marked[v] = 1;
      else if (marked[v]) late.push_back(v);
    }
    return late;
  }
  // The other variables accessed between v's last access and v's mark (each access once): what the
  // pass did while it could have marked v already.
  std::vector<std::size_t> touched_before_mark(std::size_t v) const {
    std::vector<std::size_t> between;
    for (const auto& [what, w] : events_) {
      if (what == mark && w == v) return between;
      if (what == touch && w == v) between.clear();
      else if (what == touch) between.push_back(w);
    }
    return between;
  }

 private:
  enum event { touch, mark };
  std::vector<std::pair<event, std::size_t>> events_;
};

}  // namespace towerpipe_tests
