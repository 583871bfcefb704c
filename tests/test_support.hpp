#pragma once
// Helpers shared by the tests: seeded random inputs (the seed is reported on failure) and bitwise
// comparison of float buffers.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace towerpipe_tests {

// A generator whose seed Catch prints with any failure in the enclosing scope. Set TOWERPIPE_TEST_SEED
// to draw different inputs; the default keeps CI reproducible.
class random_source {
 public:
  explicit random_source(std::uint64_t salt) : seed_(base_seed() ^ (salt * 0x9E3779B97F4A7C15ULL)), engine_(seed_) {}

  std::uint64_t seed() const { return seed_; }

  // Normal values scaled by `scale`; never all zeros.
  std::vector<float> normal(std::size_t count, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> values(count);
    for (float& v : values) v = dist(engine_);
    return values;
  }

  // Values spread over several binades, so that the order of a sum changes its rounding.
  std::vector<float> wide(std::size_t count) {
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-12, 12);
    std::vector<float> values(count);
    for (float& v : values) v = std::ldexp(mantissa(engine_), exponent(engine_));
    return values;
  }

  std::mt19937_64& engine() { return engine_; }

 private:
  static std::uint64_t base_seed() {
    const char* text = std::getenv("TOWERPIPE_TEST_SEED");
    return text != nullptr ? std::strtoull(text, nullptr, 10) : 20261129ULL;
  }

  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

inline std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The bits of a 16-bit stored type (bfloat16, float16: a member `bits`).
template <class Half, class = decltype(std::declval<const Half&>().bits)>
std::uint16_t bits_of(const Half& value) {
  return value.bits;
}

// Index of the first element whose bits differ, or -1 when the ranges are bitwise equal.
template <class A, class B>
long first_bitwise_difference(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (bits_of(a[i]) != bits_of(b[i])) return static_cast<long>(i);
  }
  return -1;
}

// The mean of the first feature of a tower's input `name` over the tower's shard.
template <class Context>
float shard_mean(Context& tower, const char* name) {
  const auto x = tower.template input<float>(name);
  float mean = 0;
  for (std::size_t e = 0; e < x.examples(); ++e) mean += x(e, 0);
  return mean / static_cast<float>(x.examples());
}

// Runs body(rank) on one thread per rank; returns each rank's error message ("" where none).
template <class Body>
std::vector<std::string> on_every_rank(std::size_t ranks, Body&& body) {
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace towerpipe_tests
