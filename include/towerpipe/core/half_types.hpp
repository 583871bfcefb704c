#pragma once
// bfloat16 and float16 as storage types for mixed precision (layout::flat<bfloat16>, ...): 16 bits,
// widened to float exactly and narrowed from float with round-to-nearest-even, both by integer
// arithmetic — the same bits on host and device, with no compiler setting or intrinsic in between.
// NaN stays NaN (quiet, sign kept); values past the largest finite one round to infinity as IEEE says.
//
// master_type_t<T>: the type master weights, optimizer state and the averaged gradient are kept in —
// float for the 16-bit types, T itself for float and double.

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "towerpipe/core/config.hpp"

namespace towerpipe {
namespace detail {

TOWERPIPE_HOST_DEVICE inline std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
TOWERPIPE_HOST_DEVICE inline float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Drops `shift` low bits of `value` (1 <= shift <= 31), rounding to nearest, ties to even.
TOWERPIPE_HOST_DEVICE inline std::uint32_t shift_right_to_nearest_even(std::uint32_t value, unsigned shift) {
  const std::uint32_t kept = value >> shift, rest = value & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

TOWERPIPE_HOST_DEVICE inline std::uint16_t float_to_bfloat16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  // A carry out of the mantissa moves into the exponent: the largest floats round up to infinity.
  return static_cast<std::uint16_t>(shift_right_to_nearest_even(bits, 16));
}

TOWERPIPE_HOST_DEVICE inline std::uint16_t float_to_float16_bits(float value) {
  const std::uint32_t bits = float_bits(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);  // quiet NaN
  if (magnitude >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: infinity
  if (magnitude >= 0x38800000u) {  // a normal half: rebias the exponent (127 -> 15), keep 10 mantissa bits
    return static_cast<std::uint16_t>(sign | shift_right_to_nearest_even(magnitude - (112u << 23), 13));
  }
  if (magnitude <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: zero (2^-25 ties to even 0)
  // A subnormal half counts units of 2^-24: the float's significand (with its hidden bit) shifted down.
  const unsigned exponent = magnitude >> 23;  // 102..112 here
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_right_to_nearest_even(significand, 126u - exponent));
}

TOWERPIPE_HOST_DEVICE inline float float16_bits_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));  // infinity, NaN
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * bits_float(0x33800000u);  // 2^-24
  return bits_float(sign | float_bits(magnitude));
}

}  // namespace detail

struct bfloat16 {
  std::uint16_t bits;  // trivial, as float is: value-initialised storage is +0
  bfloat16() = default;
  TOWERPIPE_HOST_DEVICE explicit bfloat16(float value) : bits(detail::float_to_bfloat16_bits(value)) {}
  TOWERPIPE_HOST_DEVICE explicit operator float() const { return detail::bits_float(static_cast<std::uint32_t>(bits) << 16); }
};

struct float16 {
  std::uint16_t bits;  // trivial, as float is: value-initialised storage is +0
  float16() = default;
  TOWERPIPE_HOST_DEVICE explicit float16(float value) : bits(detail::float_to_float16_bits(value)) {}
  TOWERPIPE_HOST_DEVICE explicit operator float() const { return detail::float16_bits_to_float(bits); }
};

template <class T>
struct master_type {
  using type = std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;
};
template <class T>
using master_type_t = typename master_type<T>::type;

}  // namespace towerpipe
