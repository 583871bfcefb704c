#pragma once
// The one summation order over towers that every backend follows (docs/guide.md, invariant 2).
//
// Definition: start with s_i = w_i * g_i; in round r = 0, 1, ..., every i divisible by 2^(r+1) with
// i + 2^r < N does s_i = s_i + s_(i + 2^r); the result is s_0. This is the p2p tree's own order, so a
// tree of devices can follow it without extra traffic.
// Why: docs/design-notes.md#plan-canonical_order

#include <cstddef>
#include <type_traits>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/rounded_math.hpp"

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {

// Scratch slots canonical_tree_reduce needs for n towers: bit_width(n - 1) + 1.
TOWERPIPE_HOST_DEVICE constexpr int canonical_slots(int towers) {
  int slots = 1;
  for (int rest = towers - 1; rest > 0; rest >>= 1) ++slots;
  return slots;
}

// load(tower, slot): puts tower's weighted value into scratch slot `slot`.
// combine(left, right): slot[left] = slot[left] + slot[right].
// The sum ends in slot 0.
TOWERPIPE_EXEC_CHECK_DISABLE
template <class Load, class Combine>
TOWERPIPE_HOST_DEVICE void canonical_tree_reduce(int towers, Load&& load, Combine&& combine) {
  int depth = 0;  // partials on the stack
  for (int tower = 0; tower < towers; ++tower) {
    load(tower, depth);
    for (int bits = tower; bits & 1; bits >>= 1) {
      combine(depth - 1, depth);
      --depth;
    }
    ++depth;
  }
  for (--depth; depth > 0; --depth) combine(depth - 1, depth);
}

namespace detail {

// The scratch slots of canonical_sum; functors rather than lambdas, so that the caller's value
// function may be host-only when canonical_sum runs on the host.
template <class T, class Value>
struct scalar_tree_load {
  T* partial;
  Value* value;
  TOWERPIPE_EXEC_CHECK_DISABLE
  TOWERPIPE_HOST_DEVICE void operator()(int tower, int slot) const { partial[slot] = (*value)(tower); }
};

template <class T>
struct scalar_tree_combine {
  T* partial;
  TOWERPIPE_HOST_DEVICE void operator()(int left, int right) const {
    partial[left] = rounded_add(partial[left], partial[right]);
  }
};

// Block form, for host loops: the canonical sum of `count` elements of each of `leaves` rows, element by
// element, over scratch arrays of Block values, one per partial alive; load(leaf, out) writes the leaf's
// `count` weighted values to out. The sum ends in scratch[0]. Each step is a loop over the block, which
// the compiler vectorises; the order is canonical_tree_reduce's, so the bits are the scalar form's.
template <class T, std::size_t Block, class Load>
void canonical_block_sum(int leaves, std::size_t count, T (&scratch)[32][Block], Load&& load) {
  canonical_tree_reduce(
      leaves, [&](int leaf, int slot) { load(leaf, scratch[slot]); },
      [&](int left, int right) {
        for (std::size_t k = 0; k < count; ++k) scratch[left][k] = rounded_add(scratch[left][k], scratch[right][k]);
      });
}

}  // namespace detail

// Scalar form: the canonical sum of value(tower) over towers < n, for n <= 2^31.
TOWERPIPE_EXEC_CHECK_DISABLE
template <class T, class Value>
TOWERPIPE_HOST_DEVICE T canonical_sum(int towers, Value&& value) {
  T partial[32];
  canonical_tree_reduce(towers, detail::scalar_tree_load<T, std::remove_reference_t<Value>>{partial, &value},
                        detail::scalar_tree_combine<T>{partial});
  return partial[0];
}

}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
