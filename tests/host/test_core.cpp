// variable_set, layouts and rounded arithmetic.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>

using namespace towerpipe;

TEST_CASE("variable_set keeps order, sizes and names", "[core]") {
  variable_set set{{"w", {3, 4}}, {"b", {4}}, {"scalar", {}}};
  REQUIRE(set.count() == 3);
  CHECK(set[0].size == 12);
  CHECK(set[1].size == 4);
  CHECK(set[2].size == 1);
  CHECK(set.total_size() == 17);
  CHECK(set.index_of("b") == 1);
  CHECK(to_string(set[0].shape) == "[3, 4]");
}

TEST_CASE("variable_set rejects bad declarations with the name in the message", "[core][errors]") {
  variable_set set{{"w", {3}}};
  CHECK_THROWS_WITH(set.add("w", {2}), Catch::Contains("duplicate variable name 'w'"));
  CHECK_THROWS_WITH(set.add("", {2}), Catch::Contains("empty name"));
  CHECK_THROWS_WITH(set.add("z", {2, 0}), Catch::Contains("'z' has a zero extent in shape [2, 0]"));
  CHECK_THROWS_WITH(set.index_of("nope"), Catch::Contains("no variable named 'nope'"));
  CHECK_THROWS_AS(set.add("w", {2}), towerpipe::error);
  CHECK(set.count() == 1);
}

TEMPLATE_TEST_CASE("layouts give each variable its own 256-byte-aligned, zeroed storage", "[layout]",
                   layout::flat<float>, layout::per_variable<float>) {
  const variable_set set{{"a", {3}}, {"b", {70}}, {"c", {1}}};
  typename TestType::template buffer<host_memory> buffer(set);
  for (std::size_t i = 0; i < set.count(); ++i) {
    CHECK(reinterpret_cast<std::uintptr_t>(buffer.data(i)) % 256 == 0);
    CHECK(buffer.view(i).size() == set[i].size);
    for (float v : buffer.view(i)) CHECK(v == 0.0f);
  }
  // Writing every variable with its own value must leave the others intact: no overlap.
  for (std::size_t i = 0; i < set.count(); ++i) {
    for (float& v : buffer.view(i)) v = static_cast<float>(i + 1);
  }
  for (std::size_t i = 0; i < set.count(); ++i) {
    for (float v : buffer.view(i)) CHECK(v == static_cast<float>(i + 1));
  }
}

TEST_CASE("layout::flat places variables in one arena at 256-byte offsets", "[layout]") {
  const variable_set set{{"a", {3}}, {"b", {70}}, {"c", {1}}};
  // floats per 256 bytes: 64, so offsets 0, 64, 64 + 128 and an arena of 256 elements.
  const std::vector<std::size_t> expected{0, 64, 192, 256};
  CHECK(layout::flat<float>::offsets(set) == expected);
  layout::flat<float>::buffer<host_memory> buffer(set);
  CHECK(buffer.arena_size() == 256);
  CHECK(buffer.data(2) == buffer.arena() + 192);
}

TEST_CASE("rounded arithmetic rounds a*b+c twice, never as one fused multiply-add", "[core][rounding]") {
  // a*b = 1 + 2^-11 + 2^-24 exactly; rounded to float it is 1 + 2^-11 (ties to even), so adding
  // c = -(1 + 2^-11) gives 0, while a fused multiply-add keeps 2^-24.
  const float a = 1.0f + std::ldexp(1.0f, -12);
  const float b = 1.0f + std::ldexp(1.0f, -12);
  const float c = -(1.0f + std::ldexp(1.0f, -11));
  const float two_roundings = detail::rounded_add(detail::rounded_mul(a, b), c);
  CHECK(two_roundings == 0.0f);
  CHECK(std::fma(a, b, c) == std::ldexp(1.0f, -24));
}
