#pragma once
// Batches of examples and the views that split them across towers.
//
// A batch holds named inputs (say "x" and "label"), each a matrix of `examples` rows of one example
// shape. Row-major (batch-major) inputs keep each example contiguous; column-major (feature-major, as
// cuBLAS likes) inputs keep each feature contiguous, so a tower's shard of them is strided. A shard is a
// view of the caller's memory: host towers read it in place, nothing is copied.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/config.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/shape.hpp"

namespace towerpipe {

enum class dtype { float32, float64, int32, int64, uint8 };

inline const char* to_string(dtype type) {
  static const char* const names[] = {"float32", "float64", "int32", "int64", "uint8"};  // in dtype's order
  const auto index = static_cast<std::size_t>(type);
  return index < std::size(names) ? names[index] : "unknown dtype";
}

namespace detail {
// The element type of a contiguous range (anything with std::data and std::size), for SFINAE.
template <class Range>
using contiguous_range_element =
    std::remove_const_t<std::remove_pointer_t<decltype(std::data(std::declval<const Range&>()))>>;
}  // namespace detail

template <class T>
struct dtype_of {
  static_assert(detail::dependent_false<T>,
                "towerpipe: batch inputs hold float, double, std::int32_t, std::int64_t or std::uint8_t");
};
template <> struct dtype_of<float> { static constexpr dtype value = dtype::float32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::float64; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::int32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::int64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::uint8; };

enum class storage_order {
  row_major,     // example-major: element (example e, feature f) at e * features + f
  column_major,  // feature-major: element (e, f) at f * examples_in_whole_batch + e
};

// What the pipeline expects of one input: its name, element type and the shape of one example.
struct input_spec {
  std::string name;
  towerpipe::dtype type;
  towerpipe::shape example_shape;
};

// A typed, possibly strided (examples x features) view of one input.
template <class T>
class batch_view {
 public:
  batch_view(const T* data, std::size_t examples, std::size_t features, std::size_t example_stride,
             std::size_t feature_stride)
      : data_(data),
        examples_(examples),
        features_(features),
        example_stride_(example_stride),
        feature_stride_(feature_stride) {}

  std::size_t examples() const { return examples_; }
  std::size_t features() const { return features_; }  // elements per example
  const T& operator()(std::size_t example, std::size_t feature) const {
    return data_[example * example_stride_ + feature * feature_stride_];
  }
  // Row-major views have contiguous examples: example e starts at data() + e * features().
  bool is_row_major() const { return feature_stride_ == 1 && example_stride_ == features_; }
  const T* data() const { return data_; }
  std::size_t example_stride() const { return example_stride_; }
  std::size_t feature_stride() const { return feature_stride_; }

 private:
  const T* data_;
  std::size_t examples_, features_, example_stride_, feature_stride_;
};

// One named input of a batch, type-erased so that a batch can mix element types.
class batch_input {
 public:
  template <class T>
  batch_input(std::string name, const T* data, std::size_t examples, towerpipe::shape example_shape,
              storage_order order)
      : name_(std::move(name)),
        type_(dtype_of<T>::value),
        element_size_(sizeof(T)),
        data_(data),
        examples_(examples),
        example_shape_(std::move(example_shape)),
        order_(order) {
    const std::size_t features = element_count(example_shape_);
    example_stride_ = order == storage_order::row_major ? features : 1;
    feature_stride_ = order == storage_order::row_major ? 1 : examples;
  }

  const std::string& name() const { return name_; }
  towerpipe::dtype type() const { return type_; }
  std::size_t examples() const { return examples_; }
  const towerpipe::shape& example_shape() const { return example_shape_; }
  storage_order order() const { return order_; }

  // The examples [first, first + count) of this input.
  batch_input slice(std::size_t first, std::size_t count) const {
    batch_input part = *this;
    part.data_ = static_cast<const char*>(data_) + first * example_stride_ * element_size_;
    part.examples_ = count;
    return part;
  }

  std::size_t element_size() const { return element_size_; }
  const void* data() const { return data_; }
  const void* element(std::size_t example, std::size_t feature) const {
    return static_cast<const char*>(data_) + (example * example_stride_ + feature * feature_stride_) * element_size_;
  }
  // Bytes of this input's elements, packed without gaps.
  std::size_t bytes() const { return examples_ * element_count(example_shape_) * element_size_; }

  // Copies the elements, strided or not, into `target` (bytes() long) in this input's own storage
  // order without gaps: row-major stays example after example; column-major becomes feature after
  // feature with this input's example count as leading dimension. This is how a shard is staged.
  void pack_into(void* target) const {
    char* out = static_cast<char*>(target);
    const char* in = static_cast<const char*>(data_);
    if (order_ == storage_order::row_major) {
      std::memcpy(out, in, bytes());
      return;
    }
    const std::size_t column = examples_ * element_size_;
    for (std::size_t f = 0; f < element_count(example_shape_); ++f)
      std::memcpy(out + f * column, in + f * feature_stride_ * element_size_, column);
  }

  // The same input viewing a copy made by pack_into at `packed`.
  batch_input packed_at(const void* packed) const {
    batch_input copy = *this;
    copy.data_ = packed;
    copy.feature_stride_ = order_ == storage_order::row_major ? 1 : examples_;
    return copy;
  }

  template <class T>
  batch_view<T> as() const {
    if (dtype_of<T>::value != type_)
      detail::fail("input '", name_, "' holds ", to_string(type_), ", read as ", to_string(dtype_of<T>::value));
    return {static_cast<const T*>(data_), examples_, element_count(example_shape_), example_stride_,
            feature_stride_};
  }

 private:
  std::string name_;
  towerpipe::dtype type_;
  std::size_t element_size_;
  const void* data_;
  std::size_t examples_;
  towerpipe::shape example_shape_;
  storage_order order_;
  std::size_t example_stride_ = 0, feature_stride_ = 0;
};

// The named inputs of one step (or one tower's shard of it). Non-owning: the memory stays the caller's
// and must stay valid (and unchanged) until the step that uses the batch has run.
class batch {
 public:
  // `examples` examples of `example_shape` at `data`.
  template <class T>
  batch& add(const std::string& name, const T* data, std::size_t examples, const towerpipe::shape& example_shape,
             storage_order order = storage_order::row_major) {
    return add(batch_input(name, data, examples, example_shape, order));
  }
  // A contiguous range (std::vector, std::array, std::span, ...) of whole examples of `example_shape`;
  // the example count is its size divided by the elements of one example.
  template <class Range, class = detail::contiguous_range_element<Range>>
  batch& add(const std::string& name, const Range& values, const towerpipe::shape& example_shape,
             storage_order order = storage_order::row_major) {
    const std::size_t per_example = element_count(example_shape);
    const std::size_t size = std::size(values);
    if (per_example == 0 || size % per_example != 0)
      detail::fail("batch input '", name, "': ", size, " values are not a whole number of examples of shape ",
                   to_string(example_shape), " (", per_example, " values each)");
    return add(name, std::data(values), size / per_example, example_shape, order);
  }
  // The same with the example count given, checked against the range's size.
  template <class Range, class = detail::contiguous_range_element<Range>>
  batch& add(const std::string& name, const Range& values, std::size_t examples, const towerpipe::shape& example_shape,
             storage_order order = storage_order::row_major) {
    const std::size_t needed = examples * element_count(example_shape);
    if (std::size(values) != needed)
      detail::fail("batch input '", name, "': ", examples, " examples of shape ", to_string(example_shape), " need ",
                   needed, " values, the range holds ", std::size(values));
    return add(name, std::data(values), examples, example_shape, order);
  }
  batch& add(batch_input input) {
    if (find(input.name()) != nullptr) detail::fail("batch input '", input.name(), "' added twice");
    inputs_.push_back(std::move(input));
    return *this;
  }

  // Examples in the batch; every input must hold the same number (check_against verifies it).
  std::size_t examples() const { return inputs_.empty() ? 0 : inputs_.front().examples(); }
  const std::vector<batch_input>& inputs() const { return inputs_; }

  const batch_input* find(const std::string& name) const {
    const auto found = std::find_if(inputs_.begin(), inputs_.end(), [&](const batch_input& i) { return i.name() == name; });
    return found == inputs_.end() ? nullptr : &*found;
  }

  template <class T>
  batch_view<T> input(const std::string& name) const {
    const batch_input* found = find(name);
    if (found == nullptr) detail::fail("batch has no input named '", name, "'");
    return found->as<T>();
  }

  batch slice(std::size_t first, std::size_t count) const {
    batch part;
    for (const batch_input& input : inputs_) part.inputs_.push_back(input.slice(first, count));
    return part;
  }

  // A cheap digest of the values: up to 1,024 elements of each input, evenly spaced over its examples
  // and features, and the example count. Equal batches give equal digests, unequal ones almost always
  // differ (the processes' check that each stages a part of its own, step/processes.hpp).
  std::uint64_t sampled_digest() const {
    std::uint64_t digest = fnv1a_basis;
    for (const batch_input& input : inputs_) {
      const std::size_t examples = input.examples(), features = element_count(input.example_shape()), count = examples * features;
      digest = fnv1a(&examples, sizeof examples, digest);
      for (std::size_t k = 0, samples = std::min<std::size_t>(count, 1024); k < samples; ++k) {
        const std::size_t i = k * count / samples;  // evenly spaced over the flat (example, feature) order
        digest = fnv1a(input.element(i / features, i % features), input.element_size(), digest);
      }
    }
    return digest;
  }

  // Throws unless the inputs are exactly `specs` (names, types, example shapes) with one example count.
  void check_against(const std::vector<input_spec>& specs) const {
    for (const input_spec& spec : specs) {
      const batch_input* found = find(spec.name);
      if (found == nullptr) detail::fail("batch lacks the declared input '", spec.name, "'");
      if (found->type() != spec.type)
        detail::fail("input '", spec.name, "' is ", to_string(found->type()), ", declared ", to_string(spec.type));
      if (found->example_shape() != spec.example_shape)
        detail::fail("input '", spec.name, "' has example shape ", to_string(found->example_shape()),
                     ", declared ", to_string(spec.example_shape));
      if (found->examples() != examples())
        detail::fail("input '", spec.name, "' has ", found->examples(), " examples, input '",
                     inputs_.front().name(), "' has ", examples());
    }
    for (const batch_input& input : inputs_) {
      if (std::none_of(specs.begin(), specs.end(), [&](const input_spec& spec) { return spec.name == input.name(); }))
        detail::fail("batch input '", input.name(), "' was not declared");
    }
  }

 private:
  std::vector<batch_input> inputs_;
};

}  // namespace towerpipe
