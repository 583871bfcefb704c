#pragma once
// FNV-1a, 64-bit: the checksum of checkpoint files, and a cheap fingerprint of parameters' bits (two
// runs end bitwise equal exactly when their fingerprints agree, but for collisions). Chainable: pass
// the previous result as `hash` to continue over another range. Also the raw values that checkpoint
// files and the processes' exchanged records are written in and read from.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace towerpipe {

constexpr std::uint64_t fnv1a_basis = 1469598103934665603ULL;

inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t hash = fnv1a_basis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ULL;
  }
  return hash;
}

// A digest as 16 hexadecimal digits, for messages.
inline std::string hex_digest(std::uint64_t digest) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest));
  return text;
}

namespace detail {
template <class T>
void append_raw(std::string& bytes, const T& value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The T at `at` in bytes; `at` moves past it.
template <class T>
T read_raw(const std::string& bytes, std::size_t& at) {
  T value{};
  std::memcpy(&value, bytes.data() + at, sizeof value);
  at += sizeof value;
  return value;
}
}  // namespace detail
}  // namespace towerpipe
