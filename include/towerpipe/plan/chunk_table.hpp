#pragma once
// The multi-tensor work list: a table of chunks that covers every element of every variable exactly once,
// built once at construction, and the pointer tables that locate each (role, variable), for both layouts.
// Why: docs/design-notes.md#plan-chunk_table

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"

namespace towerpipe {
namespace detail {

struct tensor_chunk {
  int variable;
  unsigned first;  // first element of the chunk inside its variable
  unsigned count;
};

// The elements [begin, end) of one variable.
struct element_range {
  std::size_t variable, begin, end;
};

// Chunks of chunk_elements from each range's start, in the ranges' order (the last of each shorter).
inline std::vector<tensor_chunk> make_chunk_table(const std::vector<element_range>& ranges, std::size_t chunk_elements) {
  std::vector<tensor_chunk> chunks;
  for (const element_range& range : ranges) {
    for (std::size_t first = range.begin; first < range.end; first += chunk_elements)
      chunks.push_back({static_cast<int>(range.variable), static_cast<unsigned>(first),
                        static_cast<unsigned>(std::min(chunk_elements, range.end - first))});
  }
  return chunks;
}

inline std::vector<tensor_chunk> make_chunk_table(const variable_set& variables, std::size_t chunk_elements) {
  std::vector<element_range> whole;
  for (std::size_t v = 0; v < variables.count(); ++v) {
    if (variables[v].size > 0xFFFFFFFFu)
      detail::fail("variable '", variables[v].name, "' has ", variables[v].size, " elements; at most 2^32 - 1 supported");
    whole.push_back({v, 0, variables[v].size});
  }
  return make_chunk_table(whole, chunk_elements);
}

// Consecutive runs of chunks [first, last) of about group_elements elements each (a chunk larger than
// that is a group of its own): units of transfer that can overlap with work on the previous unit.
struct chunk_group {
  std::size_t first, last;
};

// Every chunk of a table, whatever its size (for launches that take a run of chunks).
constexpr chunk_group every_chunk{0, ~std::size_t(0)};

// Of the chunks [within.first, within.last) only, with every_chunk: all of them.
inline std::vector<chunk_group> group_chunks(const std::vector<tensor_chunk>& chunks, std::size_t group_elements,
                                             chunk_group within = every_chunk) {
  within.last = std::min(within.last, chunks.size());
  std::vector<chunk_group> groups;
  for (std::size_t first = within.first; first < within.last;) {
    std::size_t last = first, elements = 0;
    while (last < within.last && (elements == 0 || elements + chunks[last].count <= group_elements))
      elements += chunks[last++].count;
    groups.push_back({first, last});
    first = last;
  }
  return groups;
}

// The elements [begin, end) of each variable a group touches, in variable order. Chunk tables list
// each variable's chunks consecutively and in order, so these ranges are contiguous.
inline std::vector<element_range> group_ranges(const std::vector<tensor_chunk>& chunks, const chunk_group& group) {
  std::vector<element_range> ranges;
  for (std::size_t c = group.first; c < group.last; ++c) {
    const tensor_chunk& chunk = chunks[c];
    const std::size_t v = static_cast<std::size_t>(chunk.variable);
    if (!ranges.empty() && ranges.back().variable == v) ranges.back().end = chunk.first + chunk.count;
    else ranges.push_back({v, chunk.first, std::size_t(chunk.first) + chunk.count});
  }
  return ranges;
}

// Where each variable's chunks lie in a table (each variable's consecutively, in variable order, as
// make_chunk_table lays them), and the runs of consecutive chunks that a set of variables covers: what a
// pass over some variables only (a gradient bucket: plan/buckets.hpp) works through, on the host a task
// per chunk, on a device a launch per run.
class chunks_by_variable {
 public:
  chunks_by_variable(const std::vector<tensor_chunk>& table, std::size_t variables) : first_(variables + 1, table.size()) {
    for (std::size_t c = table.size(); c-- > 0;) first_[static_cast<std::size_t>(table[c].variable)] = c;
    for (std::size_t v = variables; v-- > 0;) first_[v] = std::min(first_[v], first_[v + 1]);  // variables of no chunk
  }

  chunk_group of(std::size_t variable) const { return {first_[variable], first_[variable + 1]}; }

  // In table order; the runs of variables next to each other in the table merged.
  std::vector<chunk_group> runs(std::vector<std::size_t> variables) const {
    std::sort(variables.begin(), variables.end());
    std::vector<chunk_group> runs;
    for (std::size_t v : variables) {
      const chunk_group chunks = of(v);
      if (chunks.first == chunks.last) continue;
      if (!runs.empty() && runs.back().last == chunks.first) runs.back().last = chunks.last;
      else runs.push_back(chunks);
    }
    return runs;
  }

  // The same runs as a list of chunk indices.
  std::vector<std::size_t> list(const std::vector<std::size_t>& variables) const {
    std::vector<std::size_t> chunks;
    for (const chunk_group& run : runs(variables)) {
      for (std::size_t c = run.first; c < run.last; ++c) chunks.push_back(c);
    }
    return chunks;
  }

 private:
  std::vector<std::size_t> first_;  // per variable: its first chunk; [variables]: the table's size
};

// Pointers of several roles (towers' gradients, towers' replicas, optimizer slots), one per
// (role, variable), in one array laid out [role][variable].
template <class T>
struct pointer_table {
  T* const* pointers = nullptr;
  int variables = 0;
  TOWERPIPE_HOST_DEVICE T* at(int role, int variable) const { return pointers[role * variables + variable]; }
};

// One role of a table's pointer array: the buffer's role.data(v) for every variable v, appended.
template <class T, class Buffer>
void append_role(std::vector<T*>& pointers, const Buffer& role) {
  for (std::size_t v = 0; v < role.variables().count(); ++v) pointers.push_back(role.data(v));
}

// The table's pointer array for buffers of one layout: roles[r]->data(v) at [r][v].
template <class T, class Buffer>
std::vector<T*> gather_pointers(const std::vector<Buffer*>& roles) {
  std::vector<T*> pointers;
  for (Buffer* role : roles) append_role(pointers, *role);
  return pointers;
}

// What a vectorised kernel assumes of a pointer table: every chunk's first element aligned for one vector.
template <class T>
void check_vector_aligned(const std::vector<T*>& pointers, std::size_t variables, const std::vector<tensor_chunk>& chunks,
                          std::size_t vector_bytes, const char* what) {
  if (variables == 0) return;
  for (std::size_t role = 0; role < pointers.size() / variables; ++role) {
    for (const tensor_chunk& chunk : chunks) {
      T* const base = pointers[role * variables + static_cast<std::size_t>(chunk.variable)];
      if (base == nullptr) continue;
      const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(base) + std::uintptr_t(chunk.first) * sizeof(T);
      if (address % vector_bytes != 0)
        fail(what, ": role ", role, ", variable ", chunk.variable, ", element ", chunk.first, " lies at an address that is not ",
             vector_bytes, "-byte aligned, as the kernel's vector I/O needs");
    }
  }
}

// The most towers a device reduction takes in one pass (their weights travel in the kernel's arguments).
constexpr int max_device_towers = 64;

}  // namespace detail
}  // namespace towerpipe
