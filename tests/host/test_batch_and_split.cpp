// Batches, their row- and column-major views, and the split into shards.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

using namespace towerpipe;

namespace {
// 5 examples x 3 features; element (e, f) holds 10 * e + f, stored both ways.
std::vector<float> row_major_data() {
  std::vector<float> data;
  for (int e = 0; e < 5; ++e)
    for (int f = 0; f < 3; ++f) data.push_back(static_cast<float>(10 * e + f));
  return data;
}
std::vector<float> column_major_data() {
  std::vector<float> data;
  for (int f = 0; f < 3; ++f)
    for (int e = 0; e < 5; ++e) data.push_back(static_cast<float>(10 * e + f));
  return data;
}
}  // namespace

TEST_CASE("row- and column-major inputs read the same examples, whole and sliced", "[batch]") {
  const std::vector<float> rows = row_major_data(), columns = column_major_data();
  batch b;
  b.add("rows", rows.data(), 5, {3}).add("columns", columns.data(), 5, {3}, storage_order::column_major);
  for (const char* name : {"rows", "columns"}) {
    INFO(name);
    const batch_view<float> whole = b.input<float>(name);
    const batch_view<float> part = b.slice(2, 2).input<float>(name);
    REQUIRE(part.examples() == 2);
    REQUIRE(part.features() == 3);
    for (std::size_t f = 0; f < 3; ++f) {
      for (std::size_t e = 0; e < 5; ++e) CHECK(whole(e, f) == static_cast<float>(10 * e + f));
      for (std::size_t e = 0; e < 2; ++e) CHECK(part(e, f) == static_cast<float>(10 * (e + 2) + f));
    }
  }
  CHECK(b.input<float>("rows").is_row_major());
  CHECK_FALSE(b.input<float>("columns").is_row_major());
  CHECK(b.slice(2, 2).input<float>("columns").example_stride() == 1);
  CHECK(b.slice(2, 2).input<float>("columns").feature_stride() == 5);
}

TEST_CASE("reading an input as the wrong type or name is an error naming it", "[batch][errors]") {
  const std::vector<std::int32_t> labels{1, 2, 3};
  batch b;
  b.add("label", labels.data(), 3, {});
  CHECK_THROWS_WITH(b.input<float>("label"), Catch::Contains("input 'label' holds int32, read as float32"));
  CHECK_THROWS_WITH(b.input<std::int32_t>("image"), Catch::Contains("no input named 'image'"));
  CHECK_THROWS_WITH(b.add("label", labels.data(), 3, {}), Catch::Contains("'label' added twice"));
  // Every element type is named as such (a range with its example count, checked against its size).
  const std::vector<double> wide(6);
  const std::vector<std::int64_t> ids(3);
  const std::vector<std::uint8_t> pixels(3);
  b.add("wide", wide, 3, {2}).add("ids", ids, 3, {}).add("pixels", pixels, 3, {});
  CHECK_THROWS_WITH(b.input<float>("wide"), Catch::Contains("input 'wide' holds float64, read as float32"));
  CHECK_THROWS_WITH(b.input<std::uint8_t>("ids"), Catch::Contains("input 'ids' holds int64, read as uint8"));
  CHECK_THROWS_WITH(b.input<std::int64_t>("pixels"), Catch::Contains("input 'pixels' holds uint8, read as int64"));
  CHECK_THROWS_WITH(b.add("short", wide, 4, {2}), Catch::Contains("batch input 'short': 4 examples of shape [2] need 8 values, the range holds 6"));
}

TEST_CASE("a batch must match the declared inputs", "[batch][errors]") {
  const std::vector<float> images(4 * 6);
  const std::vector<std::int32_t> labels(4);
  const std::vector<input_spec> specs{{"image", dtype::float32, {2, 3}}, {"label", dtype::int32, {}}};
  batch good;
  good.add("image", images.data(), 4, {2, 3}).add("label", labels.data(), 4, {});
  CHECK_NOTHROW(good.check_against(specs));

  batch wrong_shape;
  wrong_shape.add("image", images.data(), 4, {3, 2}).add("label", labels.data(), 4, {});
  CHECK_THROWS_WITH(wrong_shape.check_against(specs),
                    Catch::Contains("input 'image' has example shape [3, 2], declared [2, 3]"));
  batch wrong_type;
  wrong_type.add("image", images.data(), 4, {2, 3}).add("label", images.data(), 4, {});
  CHECK_THROWS_WITH(wrong_type.check_against(specs), Catch::Contains("input 'label' is float32, declared int32"));
  batch missing;
  missing.add("image", images.data(), 4, {2, 3});
  CHECK_THROWS_WITH(missing.check_against(specs), Catch::Contains("lacks the declared input 'label'"));
  batch extra = good;
  extra.add("weights", images.data(), 4, {6});
  CHECK_THROWS_WITH(extra.check_against(specs), Catch::Contains("'weights' was not declared"));
  batch ragged;
  ragged.add("image", images.data(), 4, {2, 3}).add("label", labels.data(), 3, {});
  CHECK_THROWS_WITH(ragged.check_against(specs), Catch::Contains("input 'label' has 3 examples, input 'image' has 4"));
}

TEST_CASE("even batches split evenly with weight 1/N", "[split]") {
  const std::vector<shard> shards = plan_split(12, 4, split_policy::weighted);
  REQUIRE(shards.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(shards[i].first == 3 * i);
    CHECK(shards[i].examples == 3);
    CHECK(shards[i].weight == 0.25);
  }
}

TEST_CASE("uneven batches: weighted shards b_i/B or a dropped remainder", "[split]") {
  const std::vector<shard> weighted = plan_split(10, 4, split_policy::weighted);
  const std::size_t sizes[] = {3, 3, 2, 2}, firsts[] = {0, 3, 6, 8};
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(weighted[i].examples == sizes[i]);
    CHECK(weighted[i].first == firsts[i]);
    CHECK(weighted[i].weight == static_cast<double>(sizes[i]) / 10.0);
  }
  const std::vector<shard> dropped = plan_split(10, 4, split_policy::drop_remainder);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(dropped[i].examples == 2);
    CHECK(dropped[i].first == 2 * i);
    CHECK(dropped[i].weight == 0.25);
  }
}

TEST_CASE("a process's part of a global batch is its towers' shards of one process's cut", "[split]") {
  // 102 over 2 processes x 2 towers: one process cuts 26/26/25/25, so rank 0 takes 52 and rank 1 50.
  CHECK(process_part_of(102, 2, 2, 0, split_policy::weighted).first == 0);
  CHECK(process_part_of(102, 2, 2, 0, split_policy::weighted).examples == 52);
  CHECK(process_part_of(102, 2, 2, 1, split_policy::weighted).first == 52);
  CHECK(process_part_of(102, 2, 2, 1, split_policy::weighted).examples == 50);
  // 7 over 3 processes x 1 tower: 3/2/2.
  CHECK(process_part_of(7, 1, 3, 2, split_policy::weighted).first == 5);
  CHECK(process_part_of(7, 1, 3, 2, split_policy::weighted).examples == 2);
  // drop_remainder: 102 over 4 towers uses 100, 25 each; the last 2 are nobody's.
  CHECK(process_part_of(102, 2, 2, 1, split_policy::drop_remainder).first == 50);
  CHECK(process_part_of(102, 2, 2, 1, split_policy::drop_remainder).examples == 50);
  CHECK_THROWS_WITH(process_part_of(102, 2, 2, 2, split_policy::weighted), Catch::Contains("rank 2 of 2 processes"));
}

TEST_CASE("a batch smaller than the tower count, or zero towers, is an error", "[split][errors]") {
  CHECK_THROWS_WITH(plan_split(3, 4, split_policy::weighted),
                    Catch::Contains("a batch of 3 examples cannot be split across 4 towers"));
  CHECK_THROWS_WITH(plan_split(3, 0, split_policy::weighted), Catch::Contains("zero towers"));
  CHECK(plan_split(4, 4, split_policy::drop_remainder).size() == 4);
}

TEST_CASE("a shard packs without gaps and is read the same from the packed copy", "[batch]") {
  // What GPU towers do with every shard: pack into staging memory, copy, view the copy.
  const std::vector<float> rows = row_major_data(), columns = column_major_data();
  batch b;
  b.add("rows", rows.data(), 5, {3}).add("columns", columns.data(), 5, {3}, storage_order::column_major);
  const batch shard = b.slice(1, 3);
  for (const batch_input& input : shard.inputs()) {
    INFO(input.name());
    REQUIRE(input.bytes() == 3 * 3 * sizeof(float));
    std::vector<float> packed(9, -1.0f);
    input.pack_into(packed.data());
    const batch_view<float> view = input.packed_at(packed.data()).as<float>();
    for (std::size_t e = 0; e < 3; ++e) {
      for (std::size_t f = 0; f < 3; ++f) CHECK(view(e, f) == static_cast<float>(10 * (e + 1) + f));
    }
    // Column-major shards become feature after feature with the shard's own example count as stride.
    if (input.order() == storage_order::column_major) CHECK(packed[3] == 11.0f);
    else CHECK(packed[3] == 20.0f);
  }
}
