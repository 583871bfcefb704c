// The chunk table (plan/chunk_table.hpp): the multi-tensor kernel's work list covers every element
// once in aligned chunks, transfer groups partition it, and check_vector_aligned says which table, role,
// variable and element a vectorised kernel could not take.
#include <towerpipe/plan/chunk_table.hpp>
#include <towerpipe/kernels/process_agents.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstdint>

using namespace towerpipe;
using namespace towerpipe::detail;

namespace {

// The base of an allocation as cuda_device_memory makes them (256-byte aligned); the tables are only
// checked, never read.
float* aligned_base() { return reinterpret_cast<float*>(std::uintptr_t(1) << 40); }

}  // namespace

TEST_CASE("the chunk table covers every element exactly once, in aligned chunks", "[multi_tensor]") {
  const variable_set variables{{"a", {5000}}, {"b", {1}}, {"c", {64, 64}}, {"d", {4097}}};
  const std::vector<tensor_chunk> chunks = make_chunk_table(variables, 1024);
  std::vector<std::vector<int>> covered;
  for (const variable& v : variables) covered.emplace_back(v.size, 0);
  for (const tensor_chunk& chunk : chunks) {
    CHECK(chunk.first % 1024 == 0);
    CHECK(chunk.count >= 1);
    CHECK(chunk.count <= 1024);
    for (unsigned k = 0; k < chunk.count; ++k) ++covered[static_cast<std::size_t>(chunk.variable)][chunk.first + k];
  }
  for (const auto& counts : covered) {
    for (int c : counts) REQUIRE(c == 1);
  }
  CHECK(chunks.size() == 5 + 1 + 4 + 5);
  // The tables hold 32-bit element offsets: a variable of 2^32 elements is refused, naming it.
  CHECK_THROWS_WITH(make_chunk_table(variable_set{{"embedding", {65536, 65536}}}, 1024),
                    Catch::Contains("variable 'embedding' has 4294967296 elements; at most 2^32 - 1 supported"));
}

TEST_CASE("transfer groups partition the chunk table and their ranges cover every element once",
          "[multi_tensor]") {
  const variable_set variables{{"a", {5000}}, {"b", {1}}, {"c", {64, 64}}, {"d", {4097}}, {"e", {3}}};
  const std::vector<tensor_chunk> chunks = make_chunk_table(variables, 1024);
  for (std::size_t group_elements : {std::size_t(1), std::size_t(1000), std::size_t(2500), std::size_t(1) << 20}) {
    INFO("group_elements " << group_elements);
    const std::vector<chunk_group> groups = group_chunks(chunks, group_elements);
    REQUIRE(groups.front().first == 0);
    REQUIRE(groups.back().last == chunks.size());
    std::vector<std::vector<int>> covered;
    for (const variable& v : variables) covered.emplace_back(v.size, 0);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) REQUIRE(groups[g].first == groups[g - 1].last);
      REQUIRE(groups[g].last > groups[g].first);
      std::size_t elements = 0;
      for (std::size_t c = groups[g].first; c < groups[g].last; ++c) elements += chunks[c].count;
      CHECK((elements <= group_elements || groups[g].last - groups[g].first == 1));
      std::size_t previous_variable = 0;
      for (const element_range& r : group_ranges(chunks, groups[g])) {
        CHECK(r.variable >= previous_variable);
        previous_variable = r.variable;
        for (std::size_t i = r.begin; i < r.end; ++i) ++covered[r.variable][i];
      }
    }
    for (const auto& counts : covered) {
      for (int c : counts) REQUIRE(c == 1);
    }
  }
}

TEST_CASE("check_vector_aligned names the table, role, variable and element a kernel could not take",
          "[multi_tensor][alignment]") {
  const variable_set variables{{"a", {5}}, {"b", {300}}};
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 256);
  float* const storage = aligned_base();
  // Variables end to end without padding: "b" starts 5 floats (20 bytes) in.
  const std::vector<float*> unpadded{storage, storage + 5};
  CHECK_THROWS_WITH(check_vector_aligned(unpadded, 2, table, 16, "end to end"),
                    "towerpipe: end to end: role 0, variable 1, element 0 lies at an address that is not 16-byte aligned, as the kernel's "
                    "vector I/O needs");
  CHECK_NOTHROW(check_vector_aligned(unpadded, 2, table, 4, "end to end"));
  CHECK_NOTHROW(check_vector_aligned(padded_flat_pointers(storage, variables), 2, table, 16, "padded"));
}

TEST_CASE("a set of variables is found in the chunk table as runs of consecutive chunks", "[multi_tensor][overlap]") {
  // Chunks of 32768: a [0, 3), b [3, 4), c [4, 6).
  const variable_set variables{{"a", {70000}}, {"b", {3}}, {"c", {40000}}};
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 32768);
  REQUIRE(table.size() == 6);
  const chunks_by_variable by_variable(table, variables.count());
  const auto runs = [&](std::vector<std::size_t> set) {
    std::vector<std::pair<std::size_t, std::size_t>> pairs;
    for (const chunk_group& run : by_variable.runs(std::move(set))) pairs.emplace_back(run.first, run.last);
    return pairs;
  };
  using pairs = std::vector<std::pair<std::size_t, std::size_t>>;
  CHECK(runs({2}) == pairs{{4, 6}});
  CHECK(runs({2, 0}) == pairs{{0, 3}, {4, 6}});
  CHECK(runs({1, 0}) == pairs{{0, 4}});  // neighbours merge, whatever the order given
  CHECK(runs({0, 1, 2}) == pairs{{0, 6}});
  CHECK(runs({}).empty());
  CHECK(by_variable.list({2, 1}) == std::vector<std::size_t>{3, 4, 5});
  // The screen's tiles (2048 elements) of the same variables: a 35, b 1, c 20.
  const std::vector<tensor_chunk> tiles = make_chunk_table(variables, 2048);
  const chunks_by_variable tiles_by_variable(tiles, variables.count());
  CHECK(tiles_by_variable.of(1).first == 35);
  CHECK(tiles_by_variable.of(1).last == 36);
  CHECK(tiles_by_variable.of(2).last == 56);
}
