#pragma once
// The copies a device reducer runs where a kernel cannot use a buffer in place (wiring/copy_wiring.hpp
// and wiring/owner_wiring.hpp decide which): listed once, in plain C++, as (target, source, elements)
// between devices. The device reducers run a list as peer copies on one stream (reduce/common/device_state.hpp
// run_copies_async), whatever the executor: cudaMemcpyPeerAsync on CUDA, checked copies on simulated devices.

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/plan/owner_slices.hpp"

namespace towerpipe {
namespace detail {

template <class T>
struct peer_copy {
  T* target;
  int target_device;
  const T* source;
  int source_device;
  std::size_t elements;
};
template <class T>
using copy_list = std::vector<peer_copy<T>>;

template <class Buffer, class = void>
struct has_arena : std::false_type {};
template <class Buffer>
struct has_arena<Buffer, std::void_t<decltype(std::declval<const Buffer&>().arena())>> : std::true_type {};

// A whole buffer of every variable, between two buffers of one layout: one copy of layout::flat's arena,
// one per variable otherwise.
template <class T, class Target, class Source>
void add_whole_copy(copy_list<T>& copies, const Target& target, int target_device, const Source& source, int source_device) {
  if constexpr (has_arena<Source>::value) {
    copies.push_back({target.arena(), target_device, source.arena(), source_device, source.arena_size()});
  } else {
    for (std::size_t v = 0; v < source.variables().count(); ++v)
      copies.push_back({target.data(v), target_device, source.data(v), source_device, source.view(v).size()});
  }
}

// An owner's slice between a buffer of whole variables and compact storage of the slice
// (plan/owner_slices.hpp): one copy per range.
enum class slice_copy { into_compact, out_of_compact };
template <class T, class Buffer>
void add_slice_copy(copy_list<T>& copies, const owner_slice& slice, slice_copy direction, const Buffer& whole, int whole_device,
                    T* compact, int compact_device) {
  slice.for_each_stored_range([&](const element_range& r, std::size_t offset) {
    T* const in_whole = whole.data(r.variable) + r.begin;
    const std::size_t elements = r.end - r.begin;
    if (direction == slice_copy::into_compact) copies.push_back({compact + offset, compact_device, in_whole, whole_device, elements});
    else copies.push_back({in_whole, whole_device, compact + offset, compact_device, elements});
  });
}

}  // namespace detail
}  // namespace towerpipe
