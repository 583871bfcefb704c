// bfloat16 and float16 (core/half_types.hpp) against their definitions: every 16-bit pattern widens and
// narrows back to itself, every midpoint between neighbours rounds to the even one, everything between
// rounds to the nearer one; hand-derived bit patterns for the edges (subnormals, overflow, NaN).
#include <towerpipe/core/half_types.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

using namespace towerpipe;

namespace {

float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// For every non-NaN pattern h with a finite neighbour above: h round-trips; the midpoint to the next
// pattern (computed in double, exact in float for 16-bit formats) goes to whichever of the two is even;
// points a quarter of the way go to the nearer one.
template <class Half>
void check_every_pattern(std::uint32_t first_nan) {  // first_nan - 1: infinity
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7FFFu) >= first_nan) continue;  // NaN patterns
    Half x;
    x.bits = bits;
    const float value = static_cast<float>(x);
    REQUIRE(Half(value).bits == bits);
    if ((bits & 0x7FFFu) + 1u >= first_nan - 1u) continue;  // the neighbour would be infinity
    Half next;
    next.bits = static_cast<std::uint16_t>(bits + 1);  // the neighbour away from zero
    const double a = value, b = static_cast<float>(next);
    const float midpoint = static_cast<float>((a + b) / 2);
    REQUIRE(static_cast<double>(midpoint) == (a + b) / 2);
    const std::uint16_t even = (bits & 1u) == 0 ? bits : next.bits;
    INFO("pattern " << h);
    REQUIRE(Half(midpoint).bits == even);
    REQUIRE(Half(static_cast<float>(a + (b - a) / 4)).bits == bits);
    REQUIRE(Half(static_cast<float>(a + 3 * (b - a) / 4)).bits == next.bits);
  }
}

}  // namespace

TEST_CASE("bfloat16: every pattern round-trips, ties go to even, the rest to the nearer", "[half]") {
  check_every_pattern<bfloat16>(0x7F81u);
}

TEST_CASE("float16: every pattern round-trips, ties go to even, the rest to the nearer", "[half]") {
  check_every_pattern<float16>(0x7C01u);
}

TEST_CASE("16-bit edges by hand: overflow, subnormals, signed zero, NaN", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  // float16: largest finite 65504 (0x7BFF); 65519.99 rounds down to it, 65520 (the midpoint to 65536) up to inf.
  CHECK(float16(65504.0f).bits == 0x7BFFu);
  CHECK(float16(65519.99f).bits == 0x7BFFu);
  CHECK(float16(65520.0f).bits == 0x7C00u);
  CHECK(float16(-1e30f).bits == 0xFC00u);
  CHECK(float16(inf).bits == 0x7C00u);
  // Smallest subnormal 2^-24 (0x0001); 2^-25 is the tie with zero: to even, zero; just above it: 2^-24.
  CHECK(float16(std::ldexp(1.0f, -24)).bits == 0x0001u);
  CHECK(float16(std::ldexp(1.0f, -25)).bits == 0x0000u);
  CHECK(float16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits == 0x0001u);
  CHECK(float16(std::ldexp(3.0f, -25)).bits == 0x0002u);  // 1.5 units: tie, to even 2
  CHECK(float16(std::ldexp(1.0f, -14)).bits == 0x0400u);  // smallest normal
  CHECK(float16(-0.0f).bits == 0x8000u);
  CHECK(float16(1.0f).bits == 0x3C00u);
  CHECK(float16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3C00u);  // tie between 1 and 1 + 2^-10: to even 1
  CHECK(float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3C02u);  // tie, to even 1 + 2^-9
  CHECK(std::isnan(static_cast<float>(float16(std::nanf("")))));
  CHECK(static_cast<float>(float16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));
  // bfloat16: the largest float rounds up to infinity; 1 + 2^-8 is the tie between 1 and 1 + 2^-7.
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7F80u);
  CHECK(bfloat16(from_bits(0x7F7F7FFFu)).bits == 0x7F7Fu);
  CHECK(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3F80u);
  CHECK(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3F82u);
  CHECK(bfloat16(from_bits(0xFF800001u)).bits == 0xFFC0u);  // a signalling NaN comes out quiet, sign kept
  CHECK(static_cast<float>(bfloat16(3.140625f)) == 3.140625f);
}
