// Which buffers the device reducers use in place and which through copies (wiring/copy_wiring.hpp,
// wiring/owner_wiring.hpp), for simulated device towers on one device per tower with peer access only
// within pairs (0, 1), (2, 3): each table role points at the tower's own buffer exactly where the reader
// reaches it, and the copies run exactly between the buffers the tables name.
#include <towerpipe/simulated.hpp>
#include <towerpipe/wiring/copy_wiring.hpp>
#include <towerpipe/wiring/owner_wiring.hpp>

#include <catch2/catch.hpp>

#include <memory>

using namespace towerpipe;
using namespace towerpipe::detail;

namespace {

const variable_set wiring_variables{{"w", {37, 29}}, {"b", {29}}, {"tail", {4101}}};
using towers_type = exec::simulated::towers<layout::per_variable<float>>;
using copy_buffer = towers_type::device_buffer;
using device_memory = device_memory_of<simulated_executor>;

// Towers on one simulated device each, with peer access only within the pairs (0, 1), (2, 3), ...
std::unique_ptr<towers_type> peer_pair_towers(std::size_t towers) {
  sim::machine_config config;
  config.devices = static_cast<int>(towers);
  for (int t = 0; t + 1 < static_cast<int>(towers); t += 2) config.peers.insert({{t, t + 1}, {t + 1, t}});
  pipeline_options options;
  options.simulation = std::make_shared<sim::machine>(config);
  for (std::size_t t = 0; t < towers; ++t) options.devices.push_back(static_cast<int>(t));
  return std::make_unique<towers_type>(wiring_variables, towers, options);
}

}  // namespace

TEST_CASE("tower_access: a tower reaches itself, and others only directly, on its device or a peer's", "[multi_tensor]") {
  const tower_access pairs({0, 1, 2, 3}, {{0, 1}, {1, 0}, {2, 3}, {3, 2}}, true);
  CHECK(pairs.reaches(0, 0));
  CHECK(pairs.reaches(0, 1));
  CHECK_FALSE(pairs.reaches(0, 2));
  CHECK(pairs.reaches(3, 2));
  CHECK(pairs.copied_by(2) == std::vector<char>{1, 1, 0, 0});
  const tower_access off({0, 0, 0}, {}, false);  // one device, direct access off
  CHECK(off.copied_by(1) == std::vector<char>{1, 0, 1});
  CHECK(tower_access({0, 0, 0}, {}, true).copied_by(0) == std::vector<char>{0, 0, 0});
  CHECK(peer_pair_towers(4)->access().copied_by(2) == std::vector<char>{1, 1, 0, 0});  // what the towers make of the machine
}

TEST_CASE("tower_copies: the root's tables name the towers it reaches and its copies of the others", "[multi_tensor]") {
  const auto owned = peer_pair_towers(4);
  towers_type& towers = *owned;
  const tower_copies<copy_buffer> copies(towers, 0, towers.executor().device_memory(0), true);
  const std::size_t count = wiring_variables.count();
  CHECK(copies.reached() == 2);
  for (std::size_t t = 0; t < 4; ++t) {
    INFO("tower " << t);
    for (std::size_t v = 0; v < count; ++v) {
      const bool direct = t < 2;
      CHECK((copies.gradients()[t * count + v] == towers.gradients(t).data(v)) == direct);
      CHECK((copies.replicas()[t * count + v] == towers.replica(t).data(v)) == direct);
    }
  }
  // per_variable: one copy per variable and copied tower, from its gradients into the root's copy, and
  // from the root's copy into its replica.
  REQUIRE(copies.gradients_in().size() == 2 * count);
  REQUIRE(copies.replicas_out().size() == 2 * count);
  for (std::size_t k = 0; k < 2 * count; ++k) {
    const std::size_t t = 2 + k / count, v = k % count;
    CHECK(copies.gradients_in()[k].source == towers.gradients(t).data(v));
    CHECK(copies.gradients_in()[k].target == copies.gradients()[t * count + v]);
    CHECK(copies.gradients_in()[k].source_device == static_cast<int>(t));
    CHECK(copies.gradients_in()[k].target_device == 0);
    CHECK(copies.replicas_out()[k].source == copies.replicas()[t * count + v]);
    CHECK(copies.replicas_out()[k].target == towers.replica(t).data(v));
  }
  const tower_copies<copy_buffer> gradients_only(towers, 0, towers.executor().device_memory(0), false);
  CHECK(gradients_only.replicas().size() == 2 * count);  // the replicas of the towers reached, only
  CHECK(gradients_only.replicas_out().empty());
}

TEST_CASE("tree_wiring: scratch where a parent does not reach its child, the root writes the children it reaches, the "
          "others pull",
          "[multi_tensor]") {
  const auto owned = peer_pair_towers(4);
  towers_type& towers = *owned;
  const tree_wiring wiring(towers.access());
  CHECK(wiring.parent == std::vector<int>{-1, 0, 0, 2});
  CHECK(wiring.needs_scratch == std::vector<char>{1, 0, 0, 0});
  CHECK(wiring.written_by_root == std::vector<char>{0, 1, 0, 0});
  CHECK(wiring.root_replicas() == 2);
  const std::vector<float*> targets = wiring.root_target_pointers<float>(towers);
  CHECK(targets.size() == 2 * wiring_variables.count());
  CHECK(targets[wiring_variables.count()] == towers.replica(1).data(0));
  CHECK(wiring.has_children == std::vector<char>{1, 0, 1, 0});
  CHECK(wiring.needs_partial_scratch == std::vector<char>{1, 0, 0, 0});  // tower 2's partial sum, for the root edge
  CHECK(wiring.needs_raw_scratch == std::vector<char>{0, 0, 0, 0});
  const std::size_t count = wiring_variables.count();
  const copy_buffer scratch(wiring_variables, towers.executor().device_memory(0));
  const std::vector<copy_buffer*> partials{&towers.gradients(0), nullptr, &towers.gradients(2), nullptr};
  const std::vector<float*> sums = wiring.partial_pointers<float>(partials, 0, &scratch, count);
  CHECK(sums[2 * count] == scratch.data(0));  // tower 2's partial, through the root's scratch
  CHECK(sums[0] == towers.gradients(0).data(0));
  CHECK(sums[1 * count] == nullptr);  // tower 1 has no partial sum: its operand is raw
  const std::vector<float*> raw = wiring.raw_pointers<float>(towers, 0, static_cast<const copy_buffer*>(nullptr));
  CHECK(raw[1 * count] == towers.gradients(1).data(0));
  CHECK(raw[2 * count] == nullptr);  // read as a partial sum only
  CHECK(wiring.partial_operand_copies<float>(towers, 2, partials, &scratch).size() == count);
  CHECK(wiring.raw_operand_copies<float>(towers, 2, &scratch).empty());
  CHECK(wiring.partial_operand_copies<float>(towers, 1, partials, &scratch).empty());
  CHECK(wiring.raw_operand_copies<float>(towers, 1, &scratch).empty());
  CHECK(wiring.pull_copies<float>(towers, 2).size() == wiring_variables.count());  // tower 2 does not reach tower 0
  CHECK(wiring.pull_copies<float>(towers, 3).empty());                           // tower 3 pulls from 2 directly
  CHECK(wiring.pulls_directly[3]);
}

TEST_CASE("tree_wiring: a child without children that its parent does not reach is copied raw, into the raw scratch",
          "[multi_tensor]") {
  const auto owned = peer_pair_towers(3);
  towers_type& towers = *owned;
  const tree_wiring wiring(towers.access());
  CHECK(wiring.parent == std::vector<int>{-1, 0, 0});
  CHECK(wiring.has_children == std::vector<char>{1, 0, 0});
  CHECK(wiring.needs_raw_scratch == std::vector<char>{1, 0, 0});
  CHECK(wiring.needs_partial_scratch == std::vector<char>{0, 0, 0});
  const std::size_t count = wiring_variables.count();
  const copy_buffer scratch(wiring_variables, towers.executor().device_memory(0));
  const std::vector<float*> raw = wiring.raw_pointers<float>(towers, 0, &scratch);
  CHECK(raw[2 * count] == scratch.data(0));
  CHECK(raw[1 * count] == towers.gradients(1).data(0));
  const copy_list<float> copies = wiring.raw_operand_copies<float>(towers, 2, &scratch);
  REQUIRE(copies.size() == count);
  CHECK(copies[0].source == towers.gradients(2).data(0));
  CHECK(copies[0].target == scratch.data(0));
}

TEST_CASE("slice_copies: an owner's tables name the towers it reaches and its compact copies of the others' slices",
          "[multi_tensor][sharded]") {
  const auto owned = peer_pair_towers(4);
  towers_type& towers = *owned;
  const std::vector<owner_slice> slices = cut_into_slices(make_chunk_table(wiring_variables, 256), 4);
  const std::size_t count = wiring_variables.count();
  for (std::size_t k = 0; k < 4; ++k) {
    INFO("owner " << k);
    const slice_copies<float, device_memory> copies(slices[k], towers, k, towers.executor().device_memory(towers.device(k)));
    const std::size_t ranges = slices[k].ranges.size();
    const bool reaches_tower_0 = k < 2;
    CHECK(copies.gradients_in().size() == 2 * ranges);
    CHECK(copies.replicas_out().size() == 2 * ranges);
    CHECK(copies.master_in().size() == (reaches_tower_0 ? 0 : ranges));
    for (std::size_t t = 0; t < 4; ++t) {
      const bool direct = (t < 2) == (k < 2);
      CHECK(copies.copied(t) == !direct);
      for (std::size_t v = 0; v < count; ++v) {
        CHECK((copies.gradients()[t * count + v] == towers.gradients(t).data(v)) == direct);
        CHECK((copies.replicas()[t * count + v] == towers.replica(t).data(v)) == direct);
      }
    }
    for (const peer_copy<float>& c : copies.gradients_in()) CHECK(c.target_device == static_cast<int>(k));
    for (const peer_copy<float>& c : copies.replicas_out()) CHECK(c.source_device == static_cast<int>(k));
  }
}
