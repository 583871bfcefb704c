#pragma once
// For checking the device reducers' tables over compact storage without the storage: a memory space of
// addresses only, and the models those checks run over.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "mlp.hpp"

namespace towerpipe_tests {

using namespace towerpipe;
using namespace towerpipe::detail;

// A memory space whose allocations are only addresses, as cuda_device_memory makes them (256-byte
// aligned): the tables are only checked, never read, so no memory stands behind them (ResNet-50's state
// would be 200 MB per case).
struct unbacked_memory {
  template <class T>
  struct owner {
    bool allocated = false;
    T* get() const { return allocated ? reinterpret_cast<T*>(std::uintptr_t(1) << 40) : nullptr; }
    explicit operator bool() const { return allocated; }
  };
  template <class T>
  owner<T> allocate(std::size_t, std::size_t) const {
    return {true};
  }
};

// The models the alignment of compact storage is checked for, with the default launch policy's chunks
// (4096 elements, 16-byte vectors) and a screen tile's.
template <class Check>
void for_each_test_model(Check&& check) {
  const std::vector<std::pair<const char*, variable_set>> models{
      {"GPU test model", {{"w", {300, 70}}, {"b", {70}}, {"s", {}}, {"odd", {5003}}}},
      {"host test model", {{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {9001}}}},
      {"MLP 784-256-128-10", towerpipe_examples::mlp({784, 256, 128, 10}).variables()},
      {"ResNet-50", towerpipe_bench::read_shapes(TOWERPIPE_BENCH_SHAPES_DIR "/resnet50.shapes")}};
  for (const auto& [name, variables] : models) {
    for (std::size_t chunk_elements : {std::size_t(4096), std::size_t(1024)}) {
      INFO(name << ", chunks of " << chunk_elements);
      check(variables, make_chunk_table(variables, chunk_elements), 16);
    }
  }
}

}  // namespace towerpipe_tests
