#pragma once
// layout::flat<T> — one arena per role; variable i is a view at a 256-byte-aligned offset.
// Same buffer interface as layout::per_variable (see there); additionally arena()/arena_size() give the
// whole role as one range (padding included, zero-initialised) for sweeps that need no table.

#include <cstddef>
#include <vector>

#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"

namespace towerpipe {
namespace layout {

template <class T>
struct flat {
  using value_type = T;
  static constexpr const char* name = "flat";
  static constexpr std::size_t alignment = 256;
  static_assert(alignment % sizeof(T) == 0, "towerpipe: layout::flat needs an element size dividing 256 bytes");

  // Element offset of each variable inside an arena of U; the last entry is the arena's size.
  template <class U = T>
  static std::vector<std::size_t> offsets(const variable_set& variables) {
    constexpr std::size_t elements_per_alignment = alignment / sizeof(U);
    std::vector<std::size_t> result;
    result.reserve(variables.count() + 1);
    std::size_t offset = 0;
    for (const variable& v : variables) {
      result.push_back(offset);
      offset += (v.size + elements_per_alignment - 1) / elements_per_alignment * elements_per_alignment;
    }
    result.push_back(offset);
    return result;
  }

  template <class Memory, class U = T>
  class buffer {
   public:
    explicit buffer(const variable_set& variables, const Memory& memory = Memory{})
        : variables_(&variables),
          offsets_(offsets<U>(variables)),
          arena_(memory.template allocate<U>(offsets_.back(), alignment)) {}

    U* data(std::size_t index) const { return arena_.get() + offsets_[index]; }
    tensor_view<U> view(std::size_t index) const { return {data(index), (*variables_)[index].shape}; }
    const variable_set& variables() const { return *variables_; }

    U* arena() const { return arena_.get(); }
    std::size_t arena_size() const { return offsets_.back(); }

   private:
    const variable_set* variables_;
    std::vector<std::size_t> offsets_;
    typename Memory::template owner<U> arena_;
  };
};

}  // namespace layout
}  // namespace towerpipe
