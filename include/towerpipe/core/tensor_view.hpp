#pragma once
// A non-owning view of one variable's elements: pointer, element count and the variable's shape.

#include <cstddef>
#include <type_traits>

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
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  const towerpipe::shape* shape_ = nullptr;
};

}  // namespace towerpipe
