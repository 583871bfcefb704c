#pragma once
// 16-bit towers (train --precision bf16 | fp16) for models that compute in fp32: per tower, fp32 scratch
// for the parameters and the gradients. Before the model runs, the tower's 16-bit parameters are widened
// into the scratch (exactly); the model reads them and writes fp32 gradients into the scratch; as the
// model marks each variable done (ready_marks.hpp) that variable's gradient, times the loss scale, is
// narrowed (round to nearest even) into tower.gradient(i), and only then marked, so that the pipeline
// reduces the bucket while the rest of the backward pass runs. Model-independent: it sees only variable
// indices and sizes.
//
// Memory says where the scratch lies and converts: host_conversions below (plain loops); GPU towers'
// version, on the tower's stream, is in train_gpu.cuh.

#include <cstddef>
#include <vector>

#include <towerpipe/core/half_types.hpp>

namespace towerpipe_examples {

// Host towers: the scratch is a std::vector, the conversions plain loops.
struct host_conversions {
  using buffer = std::vector<float>;
  static buffer empty() { return {}; }
  template <class Context>
  static buffer allocate(const Context&, std::size_t count) { return buffer(count); }
  static float* data(buffer& b) { return b.data(); }
  template <class Context, class Stored>
  static void widen(const Context&, float* to, const Stored* from, std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) to[k] = static_cast<float>(from[k]);
  }
  template <class Context, class Stored>
  static void narrow(const Context&, Stored* to, const float* from, std::size_t count, float scale) {
    for (std::size_t k = 0; k < count; ++k) to[k] = static_cast<Stored>(from[k] * scale);
  }
};

template <class Stored, class Memory>
class fp32_scratch {
 public:
  // Before the model runs: the scratch (made on first use, by the tower's own thread) holds the tower's
  // parameters in fp32, and no gradient has been narrowed yet.
  template <class Context>
  void widen_parameters(Context& tower) {
    const auto& variables = tower.variables();
    if (offsets_.empty()) {
      std::size_t total = 0;
      for (std::size_t v = 0; v < variables.count(); ++v) {
        offsets_.push_back(total);
        total += variables[v].size;
      }
      offsets_.push_back(total);
      parameters_ = Memory::allocate(tower, total);
      gradients_ = Memory::allocate(tower, total);
    }
    for (std::size_t v = 0; v < variables.count(); ++v)
      Memory::widen(tower, parameter(v), tower.parameter(v).data(), variables[v].size);
    narrowed_.assign(variables.count(), 0);
  }
  float* parameter(std::size_t v) { return Memory::data(parameters_) + offsets_[v]; }
  float* gradient(std::size_t v) { return Memory::data(gradients_) + offsets_[v]; }

  // What the model's backward pass calls as variable v is done: v's gradient, times `scale`, narrowed
  // into the tower's gradient, then tower.gradient_ready(v) where `mark` (not with --no-overlap).
  template <class Context>
  auto ready_marks(Context& tower, bool mark, float scale) {
    return [this, &tower, mark, scale](std::size_t v) {
      narrow(tower, v, scale);
      if (mark) tower.gradient_ready(v);
    };
  }
  // After the model returned: the gradients of variables it did not mark, narrowed as well.
  template <class Context>
  void narrow_rest(Context& tower, float scale) {
    for (std::size_t v = 0; v < narrowed_.size(); ++v) {
      if (!narrowed_[v]) narrow(tower, v, scale);
    }
  }

 private:
  template <class Context>
  void narrow(Context& tower, std::size_t v, float scale) {
    auto target = tower.gradient(v);
    Memory::narrow(tower, target.data(), gradient(v), target.size(), scale);
    narrowed_[v] = 1;
  }

  std::vector<std::size_t> offsets_;  // variable v's elements: [offsets_[v], offsets_[v + 1]) of each buffer
  typename Memory::buffer parameters_ = Memory::empty(), gradients_ = Memory::empty();
  std::vector<char> narrowed_;
};

}  // namespace towerpipe_examples
