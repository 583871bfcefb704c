// choose_backend (reduce/choice/chooser.hpp) on described topologies: one GPU with N towers, 2/4/8 GPUs
// with peer access between every pair, PCIe pairs without peer access between them, several
// processes, host towers. The expected backends follow from the link counts worked out by hand in
// each test (and, where host and device backends compete, from the seconds recomputed here in double).

#include <catch2/catch.hpp>

#include <towerpipe/reduce/choice/chooser.hpp>

#include <string>
#include <vector>

namespace {

using namespace towerpipe;

const std::vector<backend_traits> every_gpu_backend = {reduce::device0::traits, reduce::p2p_tree::traits, reduce::sharded::traits,
                                                       reduce::host::traits};

tower_topology gpus(std::vector<int> tower_devices, peer_link link, std::vector<backend_traits> candidates = every_gpu_backend) {
  tower_topology t;
  t.tower_devices = std::move(tower_devices);
  for (int a : t.tower_devices)
    for (int b : t.tower_devices)
      if (a != b && link != peer_link::none) t.links[{a, b}] = link;
  t.parameters = 25557032;  // ResNet-50
  t.candidates = std::move(candidates);
  return t;
}

std::vector<int> round_robin(int towers, int devices) {
  std::vector<int> d;
  for (int t = 0; t < towers; ++t) d.push_back(t % devices);
  return d;
}

bool says(const backend_choice& c, const std::string& words) { return c.reason.find(words) != std::string::npos; }

TEST_CASE("one GPU with any number of towers: device0, never p2p_tree", "[backend_choice]") {
  for (int towers : {1, 2, 3, 4, 8, 16}) {
    INFO(towers << " towers");
    const backend_choice c = choose_backend(gpus(std::vector<int>(static_cast<std::size_t>(towers), 0), peer_link::none));
    CHECK(c.backend == "device0");
    CHECK(says(c, "one device"));
    CHECK(says(c, std::to_string(towers) + " on GPU 0"));
  }
  // 16-bit towers where only device0 takes them (the candidates say what the layout allows).
  tower_topology bf16 = gpus({0, 0, 0, 0}, peer_link::none, {reduce::device0::traits});
  bf16.element_bytes = 2;
  CHECK(choose_backend(bf16).backend == "device0");
}

TEST_CASE("GPUs with peer access between every pair: the least traffic on the busiest link", "[backend_choice]") {
  // 2 GPUs, a tower each: every backend moves one element each way over each link; the tie goes to device0.
  CHECK(choose_backend(gpus({0, 1}, peer_link::nvlink)).backend == "device0");
  CHECK(choose_backend(gpus({0, 1, 0, 1}, peer_link::nvlink)).backend == "device0");  // 2 each way for all
  // 4 GPUs, a tower each, each way on the busiest link: device0 3 (GPU 0's), p2p_tree 2 (GPU 0: edges to
  // towers 1 and 2), sharded 2 * 1 * 3 / 4 = 1.5.
  const backend_choice four = choose_backend(gpus({0, 1, 2, 3}, peer_link::nvlink));
  CHECK(four.backend == "sharded");
  CHECK(says(four, "1.5 gradient element(s) each way"));
  CHECK(says(four, "peer access between every pair"));
  CHECK(says(four, "a model, not measured"));
  // 8 GPUs: device0 7, p2p_tree 3 (towers 0 and 4 have three edges each), sharded 1.75.
  CHECK(choose_backend(gpus(round_robin(8, 8), peer_link::nvlink)).backend == "sharded");
  // 8 GPUs, 2 towers each (tower t on GPU t % 8): device0 14, p2p_tree 6 (GPU 0: towers 0 and 8, three
  // crossing edges each; 0-8 stays on GPU 0), sharded 2 * 2 * 14 / 16 = 3.5.
  CHECK(choose_backend(gpus(round_robin(16, 8), peer_link::nvlink)).backend == "sharded");
  // Where sharded does not take the towers, the tree spreads the traffic that device0 piles on GPU 0.
  const std::vector<backend_traits> no_sharded = {reduce::device0::traits, reduce::p2p_tree::traits, reduce::host::traits};
  CHECK(choose_backend(gpus({0, 1, 2, 3}, peer_link::pcie, no_sharded)).backend == "p2p_tree");
  CHECK(choose_backend(gpus(round_robin(8, 8), peer_link::pcie, no_sharded)).backend == "p2p_tree");
}

TEST_CASE("PCIe pairs without peer access between them: staged copies, or the host parameter server", "[backend_choice]") {
  // GPUs 0-1 and 2-3 are peers over PCIe; no pair across.
  tower_topology t = gpus({0, 1, 2, 3}, peer_link::none);
  t.links[{0, 1}] = t.links[{1, 0}] = peer_link::pcie;
  t.links[{2, 3}] = t.links[{3, 2}] = peer_link::pcie;
  // Per parameter, each way on the busiest link: device0 3, p2p_tree 2, sharded 1.5, host 1 plus its pass
  // over host memory (4 gradients of 4 bytes + 24 + 4 bytes). With the H200 machine's figures the pass
  // costs more than sharded's extra half element.
  const double link = t.link_bytes_per_second, memory = t.host_bytes_per_second;
  const double sharded_s = 2 * 1.5 * 4 / link, host_s = 2 * 1 * 4 / link + (16.0 + 24 + 4) / memory;
  REQUIRE(sharded_s < host_s);
  const backend_choice staged = choose_backend(t);
  CHECK(staged.backend == "sharded");
  CHECK(says(staged, "some pairs without peer access"));
  // A machine whose host memory is ten times faster: the host parameter server wins.
  t.host_bytes_per_second = 1.116e12;
  REQUIRE(2 * 1 * 4 / link + 44.0 / t.host_bytes_per_second < sharded_s);
  const backend_choice host = choose_backend(t);
  CHECK(host.backend == "host");
  CHECK(says(host, "pass over host memory"));
  // Two GPUs without peer access, a tower each: one element each way for every backend; device0 has no pass.
  CHECK(choose_backend(gpus({0, 1}, peer_link::none)).backend == "device0");
}

TEST_CASE("several processes: reduce::sharded, the only backend that spans them", "[backend_choice]") {
  tower_topology t = gpus({0, 0}, peer_link::none);
  t.processes = 4;
  const backend_choice c = choose_backend(t);
  CHECK(c.backend == "sharded");
  CHECK(says(c, "4 processes"));
  tower_topology host_towers;
  host_towers.tower_devices = {host_device, host_device};
  host_towers.candidates = {reduce::host::traits, reduce::sharded::traits};
  host_towers.processes = 2;
  CHECK(choose_backend(host_towers).backend == "sharded");
  t.candidates = {reduce::device0::traits};  // 16-bit GPU towers where sharded does not take them
  CHECK_THROWS_WITH(choose_backend(t), Catch::Contains("only reduce::sharded spans processes"));
}

TEST_CASE("host towers: reduce::host", "[backend_choice]") {
  tower_topology t;
  t.tower_devices.assign(4, host_device);
  t.candidates = {reduce::host::traits, reduce::sharded::traits};
  const backend_choice c = choose_backend(t);
  CHECK(c.backend == "host");
  CHECK(says(c, "4 host tower(s) in one process"));
  t.candidates = {reduce::sharded::traits};
  CHECK(choose_backend(t).backend == "sharded");
}

TEST_CASE("choose_backend refuses topologies it cannot judge", "[backend_choice]") {
  tower_topology t;
  t.candidates = {reduce::host::traits};
  CHECK_THROWS_WITH(choose_backend(t), Catch::Contains("no towers"));
  t.tower_devices = {host_device, 0};
  CHECK_THROWS_WITH(choose_backend(t), Catch::Contains("mixed"));
  t.tower_devices = {0};
  t.candidates.clear();
  CHECK_THROWS_WITH(choose_backend(t), Catch::Contains("no candidate"));
  t.candidates = {reduce::device0::traits};
  t.processes = 0;
  CHECK_THROWS_WITH(choose_backend(t), Catch::Contains("0 processes"));
}

}  // namespace
