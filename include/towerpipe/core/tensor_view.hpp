#pragma once
// A non-owning view of one variable's elements: pointer, element count and the variable's shape, indexed
// flat (view[i]) or by shape (view(row, column), checked: view.at(row, column)).

#include <array>
#include <cstddef>
#include <type_traits>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/shape.hpp"

namespace towerpipe {

template <class T>
class tensor_view {
 public:
  tensor_view() = default;
  tensor_view(T* data, const towerpipe::shape& dims) : data_(data), size_(element_count(dims)), shape_(&dims) {}
  // A view of T converts to a view of const T.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  tensor_view(const tensor_view<U>& other) : data_(other.data()), size_(other.size()), shape_(&other.shape()) {}

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  const towerpipe::shape& shape() const { return *shape_; }

  T& operator[](std::size_t i) const { return data_[i]; }

  // Element (i0, i1, ...) of the shape, row-major (the last index varies fastest); one index per dimension.
  // Unchecked, for inner loops; at(...) checks the rank and every index.
  template <class... Indices>
  T& operator()(Indices... indices) const {
    return data_[offset_of(std::array<std::size_t, sizeof...(Indices)>{static_cast<std::size_t>(indices)...})];
  }
  template <class... Indices>
  T& at(Indices... indices) const {
    const std::array<std::size_t, sizeof...(Indices)> index{static_cast<std::size_t>(indices)...};
    if (index.size() != shape_->size())
      detail::fail("tensor of shape ", to_string(*shape_), " indexed with ", index.size(), " index(es)");
    for (std::size_t d = 0; d < index.size(); ++d) {
      if (index[d] >= (*shape_)[d])
        detail::fail("index ", index[d], " of dimension ", d, " is out of range for shape ", to_string(*shape_));
    }
    return data_[offset_of(index)];
  }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  template <std::size_t Rank>
  std::size_t offset_of(const std::array<std::size_t, Rank>& index) const {
    std::size_t offset = 0;
    for (std::size_t d = 0; d < Rank; ++d) offset = offset * (*shape_)[d] + index[d];
    return offset;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  const towerpipe::shape* shape_ = nullptr;
};

}  // namespace towerpipe
