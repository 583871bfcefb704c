#pragma once
// The debug fill of gradient buffers (pipeline_options::poison_gradients): before each tower function
// runs, every gradient element is set to a signalling NaN with a fixed payload; after it, an element that
// still holds exactly that pattern was never written. Arithmetic never produces a signalling NaN (any
// operation on one returns a quiet NaN), so a value the tower computed, NaN included, cannot be mistaken
// for the poison.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "towerpipe/core/half_types.hpp"

namespace towerpipe {
namespace detail {

template <class Bits, Bits Pattern>
struct poison_pattern {
  using bits_type = Bits;
  static constexpr Bits bits = Pattern;
};
template <class T>
struct gradient_poison;
// float: exponent all ones, quiet bit clear, payload 0xDEAD.
template <> struct gradient_poison<float> : poison_pattern<std::uint32_t, 0x7F80DEADu> {};
template <> struct gradient_poison<double> : poison_pattern<std::uint64_t, 0x7FF0DEADDEADDEADull> {};
template <> struct gradient_poison<bfloat16> : poison_pattern<std::uint16_t, 0x7FADu> {};  // quiet bit (0x40) clear, payload 0x2D
template <> struct gradient_poison<float16> : poison_pattern<std::uint16_t, 0x7CADu> {};  // quiet bit (0x200) clear, payload 0xAD

template <class T>
T poison_value() {
  T value;
  const auto bits = gradient_poison<T>::bits;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Index of the first element of [values, values + count) that still holds the poison, or count.
template <class T>
std::size_t first_poisoned(const T* values, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    typename gradient_poison<T>::bits_type bits;
    std::memcpy(&bits, values + i, sizeof bits);
    if (bits == gradient_poison<T>::bits) return i;
  }
  return count;
}

}  // namespace detail
}  // namespace towerpipe
