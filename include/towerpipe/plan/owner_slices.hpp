#pragma once
// The chunk table (plan/chunk_table.hpp) cut into one contiguous run of chunks per owner, balanced by
// elements, and the pointer tables of an owner's compact storage of its slice (its part of the
// optimizer state, of a checked step's average): reduce::sharded for GPU towers gives tower t's device
// slice t, and across processes (plan/exchange_plan.hpp, host or GPU towers) process r slice r.
// Plain C++.
// Why: docs/design-notes.md#plan-owner_slices

#include <cstddef>
#include <cstdint>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/plan/chunk_table.hpp"

namespace towerpipe {
namespace detail {

// Elements: compact storage starts each range on a multiple of this.
constexpr std::size_t stored_alignment = 64;
constexpr std::size_t padded_to_stored_alignment(std::size_t elements) {
  return (elements + stored_alignment - 1) / stored_alignment * stored_alignment;
}

struct owner_slice {
  chunk_group chunks;                 // [first, last) of the chunk table; empty where there are more owners than chunks
  std::vector<element_range> ranges;  // the elements of each variable the slice holds, in variable order
  std::vector<std::size_t> stored_at; // per range: its first element's offset in compact storage
  std::size_t elements = 0;           // the elements the slice holds
  std::size_t stored_elements = 0;    // the elements of its compact storage, padding included

  // f(range, offset in compact storage) for each range, in order.
  template <class F>
  void for_each_stored_range(F&& f) const {
    for (std::size_t i = 0; i < ranges.size(); ++i) f(ranges[i], stored_at[i]);
  }

  // f(range, offset in compact storage) for the slice's range of `variable`, if it holds one.
  template <class F>
  void for_each_stored_range_of(std::size_t variable, F&& f) const {
    for_each_stored_range([&](const element_range& range, std::size_t offset) {
      if (range.variable == variable) f(range, offset);
    });
  }

  bool empty() const { return chunks.first == chunks.last; }
  // The chunks of the slice, for an owner's own chunk table.
  std::vector<tensor_chunk> chunk_list(const std::vector<tensor_chunk>& table) const {
    return {table.begin() + static_cast<std::ptrdiff_t>(chunks.first), table.begin() + static_cast<std::ptrdiff_t>(chunks.last)};
  }
};

// Owner k takes the chunks that start before (k + 1) / owners of all elements and after the previous
// owner's: every owner ends within one chunk of an equal share.
inline std::vector<owner_slice> cut_into_slices(const std::vector<tensor_chunk>& table, std::size_t owners) {
  if (owners == 0) fail("cut_into_slices: no owners");
  std::size_t total = 0;
  for (const tensor_chunk& chunk : table) total += chunk.count;
  std::vector<owner_slice> slices(owners);
  std::size_t chunk = 0, done = 0;
  for (std::size_t k = 0; k < owners; ++k) {
    owner_slice& slice = slices[k];
    slice.chunks.first = chunk;
    const std::size_t share_end = total * (k + 1) / owners;  // exact in 64 bits for any table that fits in memory
    while (chunk < table.size() && (k + 1 == owners || done < share_end)) {
      done += table[chunk].count;
      slice.elements += table[chunk++].count;
    }
    slice.chunks.last = chunk;
    if (slice.empty()) continue;
    slice.ranges = group_ranges(table, slice.chunks);
    for (const element_range& range : slice.ranges) {
      slice.stored_at.push_back(slice.stored_elements);
      slice.stored_elements += padded_to_stored_alignment(range.end - range.begin);
    }
  }
  return slices;
}

// Where each variable starts in the owners' compact storage laid end to end (see the top), and, last,
// the whole length: variable v's padded size is padded_to_stored_alignment(size).
inline std::vector<std::size_t> padded_flat_starts(const variable_set& variables) {
  std::vector<std::size_t> starts{0};
  for (const variable& v : variables) starts.push_back(starts.back() + padded_to_stored_alignment(v.size));
  return starts;
}

// For compact storage of a slice at `base` (see the top): one pointer per variable such that
// pointer[v] + i is element i of variable v for every i in the slice's range of v, nullptr for the
// variables it does not hold — the form pointer_table's users index with a variable's own element
// numbers. Computed in unsigned address arithmetic (base - range.begin may lie before the allocation;
// adding back an element index inside the range lands inside it again, modulo 2^64).
template <class T>
std::vector<T*> slice_pointers(const owner_slice& slice, T* base, std::size_t variable_count) {
  std::vector<T*> pointers(variable_count, nullptr);
  slice.for_each_stored_range([&](const element_range& range, std::size_t offset) {
    const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(base + offset) - range.begin * sizeof(T);
    pointers[range.variable] = reinterpret_cast<T*>(address);
  });
  return pointers;
}

// slice_pointers for `rows` compact copies of the slice one after another from `base` (an owner's
// optimizer state slots, the contributions it receives): entries [row][variable], as pointer_table
// indexes roles.
template <class T>
std::vector<T*> slice_row_pointers(const owner_slice& slice, T* base, std::size_t rows, std::size_t variable_count) {
  std::vector<T*> pointers;
  for (std::size_t k = 0; k < rows; ++k) {
    const std::vector<T*> row = slice_pointers(slice, base + k * slice.stored_elements, variable_count);
    pointers.insert(pointers.end(), row.begin(), row.end());
  }
  return pointers;
}

}  // namespace detail
}  // namespace towerpipe
