// Owners' slices and their compact storage (plan/owner_slices.hpp, wiring/owner_wiring.hpp): the
// slices cut the chunk table into contiguous runs within a chunk of equal shares, their pointers reach
// compact storage, and every table an owner of reduce::sharded with GPU towers builds over it keeps the
// kernels' vector I/O aligned.
#include <towerpipe/plan/owner_slices.hpp>
#include <towerpipe/wiring/owner_wiring.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstdint>

#include "unbacked_memory.hpp"

using namespace towerpipe;
using namespace towerpipe::detail;
using towerpipe_tests::for_each_test_model;
using towerpipe_tests::unbacked_memory;

TEST_CASE("owner slices cut the chunk table into contiguous runs within a chunk of equal shares, and their "
          "pointers reach compact storage",
          "[multi_tensor][sharded]") {
  const variable_set variables{{"a", {5000}}, {"b", {1}}, {"c", {64, 64}}, {"d", {4097}}, {"e", {3}}};
  const std::size_t chunk_elements = 1024;
  const std::vector<tensor_chunk> chunks = make_chunk_table(variables, chunk_elements);
  const std::size_t total = variables.total_size();
  // Compact storage pads every variable to a multiple of 64 elements: where each starts in the owners'
  // storage laid end to end.
  std::vector<std::size_t> padded_start{0};
  for (const variable& v : variables) padded_start.push_back(padded_start.back() + (v.size + 63) / 64 * 64);
  for (std::size_t owners : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(7), std::size_t(40)}) {
    INFO(owners << " owners");
    const std::vector<owner_slice> slices = cut_into_slices(chunks, owners);
    REQUIRE(slices.size() == owners);
    REQUIRE(slices.front().chunks.first == 0);
    REQUIRE(slices.back().chunks.last == chunks.size());
    std::size_t done = 0, stored_done = 0;
    for (std::size_t k = 0; k < owners; ++k) {
      INFO("owner " << k);
      const owner_slice& slice = slices[k];
      if (k > 0) REQUIRE(slice.chunks.first == slices[k - 1].chunks.last);
      done += slice.elements;
      // Each owner ends at its share of the elements, or less than a chunk past it.
      const double share_end = static_cast<double>(total) * static_cast<double>(k + 1) / static_cast<double>(owners);
      CHECK(static_cast<double>(done) >= share_end - 1e-9);
      CHECK(static_cast<double>(done) < share_end + static_cast<double>(chunk_elements));
      // Writing each element's position in the padded space through the slice's pointers fills its
      // compact storage with consecutive positions from where the slice starts, padding left unwritten:
      // the slices' storage in owner order is the padded space.
      const std::size_t unwritten = ~std::size_t(0);
      std::vector<std::size_t> storage(slice.stored_elements, unwritten);
      const std::vector<std::size_t*> pointers = slice_pointers(slice, storage.data(), variables.count());
      for (std::size_t v = 0; v < variables.count(); ++v) {
        bool held = false;
        for (const element_range& r : slice.ranges) {
          if (r.variable != v) continue;
          held = true;
          for (std::size_t i = r.begin; i < r.end; ++i) pointers[v][i] = padded_start[v] + i;
        }
        if (!held) CHECK(pointers[v] == nullptr);
      }
      std::size_t written = 0;
      for (std::size_t j = 0; j < storage.size(); ++j) {
        if (storage[j] == unwritten) continue;
        REQUIRE(storage[j] == stored_done + j);
        ++written;
      }
      CHECK(written == slice.elements);
      for (std::size_t offset : slice.stored_at) CHECK(offset % 64 == 0);
      stored_done += slice.stored_elements;
    }
    CHECK(done == total);
    CHECK(stored_done == padded_start.back());
  }
}

TEST_CASE("an owner's compact storage keeps vector I/O aligned for the test models, the MLP and ResNet-50 with 1-8 owners",
          "[multi_tensor][sharded][alignment]") {
  for_each_test_model([](const variable_set& variables, const std::vector<tensor_chunk>& table, std::size_t vector_bytes) {
    const std::size_t count = variables.count();
    const int slots = 2;  // Adam's
    for (std::size_t owners = 1; owners <= 8; ++owners) {
      INFO("one process, " << owners << " owners");
      for (owner_slice& slice : cut_into_slices(table, owners)) {
        if (slice.empty()) continue;
        const std::vector<tensor_chunk> mine = slice.chunk_list(table);
        const auto copy = unbacked_memory{}.allocate<float>(slice.stored_elements, 256);
        const slice_owner<float, unbacked_memory> owner(std::move(slice), table, count, slots, owner_keeps{true, true}, unbacked_memory{});
        check_vector_aligned(owner.state(), count, mine, vector_bytes, "state");
        check_vector_aligned(owner.average(), count, mine, vector_bytes, "average");
        check_vector_aligned(owner.master(), count, mine, vector_bytes, "master");
        check_vector_aligned(slice_pointers(owner.slice(), copy.get(), count), count, mine, vector_bytes, "a copied tower's slice");
      }
    }
  });
}
