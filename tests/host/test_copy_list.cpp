// Copy lists (plan/copy_list.hpp), each entry run here as the plain copy it describes: a whole buffer is
// one copy of layout::flat's arena or one per variable, and an owner's slice goes into compact storage
// and back out unchanged, touching nothing outside the slice.
#include <towerpipe/plan/copy_list.hpp>
#include <towerpipe/plan/owner_slices.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

using namespace towerpipe;
using namespace towerpipe::detail;

namespace {

const variable_set copy_test_variables{{"a", {5000}}, {"b", {1}}, {"c", {64, 64}}, {"d", {4097}}};

void run_copies(const copy_list<float>& copies) {
  for (const peer_copy<float>& c : copies) std::copy_n(c.source, c.elements, c.target);
}

template <class Buffer>
void number(Buffer& buffer, float first) {
  for (std::size_t v = 0; v < buffer.variables().count(); ++v) {
    float next = first + 100000.0f * static_cast<float>(v);
    for (float& x : buffer.view(v)) x = next++;
  }
}

}  // namespace

TEMPLATE_TEST_CASE("a whole-buffer copy is one copy of an arena or one per variable, and copies every element", "[multi_tensor]",
                   layout::flat<float>, layout::per_variable<float>) {
  using buffer = typename TestType::template buffer<host_memory>;
  buffer source(copy_test_variables), target(copy_test_variables);
  number(source, 1.0f);
  copy_list<float> copies;
  add_whole_copy(copies, target, 1, source, 0);
  CHECK(copies.size() == (has_arena<buffer>::value ? 1 : copy_test_variables.count()));
  for (const peer_copy<float>& c : copies) {
    CHECK(c.target_device == 1);
    CHECK(c.source_device == 0);
  }
  run_copies(copies);
  for (std::size_t v = 0; v < copy_test_variables.count(); ++v) {
    for (std::size_t i = 0; i < source.view(v).size(); ++i) REQUIRE(target.view(v)[i] == source.view(v)[i]);
  }
}

TEST_CASE("an owner's slice copied into compact storage and out again lands where it came from, and nowhere else",
          "[multi_tensor][sharded]") {
  using buffer = layout::per_variable<float>::buffer<host_memory>;
  const std::vector<tensor_chunk> table = make_chunk_table(copy_test_variables, 1024);
  for (const owner_slice& slice : cut_into_slices(table, 3)) {
    buffer whole(copy_test_variables), back(copy_test_variables);
    number(whole, 1.0f);
    for (std::size_t v = 0; v < copy_test_variables.count(); ++v) {
      for (float& x : back.view(v)) x = -1.0f;
    }
    std::vector<float> compact(slice.stored_elements, std::nanf(""));
    copy_list<float> in, out;
    add_slice_copy(in, slice, slice_copy::into_compact, whole, 0, compact.data(), 1);
    add_slice_copy(out, slice, slice_copy::out_of_compact, back, 0, compact.data(), 1);
    CHECK(in.size() == slice.ranges.size());
    run_copies(in);
    run_copies(out);
    std::size_t inside = 0;
    for (std::size_t v = 0; v < copy_test_variables.count(); ++v) {
      for (std::size_t i = 0; i < whole.view(v).size(); ++i) {
        bool held = false;
        for (const element_range& r : slice.ranges) held = held || (r.variable == v && i >= r.begin && i < r.end);
        inside += held;
        REQUIRE(back.view(v)[i] == (held ? whole.view(v)[i] : -1.0f));
      }
    }
    CHECK(inside == slice.elements);
  }
}
