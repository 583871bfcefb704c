// The device reductions' per-element programs (programs/agents.hpp), run on the host over the same
// chunk and pointer tables the kernels use: they must cover every element once and give bitwise the
// host pipeline's parameters — reduce::device0 as one fused pass, reduce::p2p_tree as tree edges, a
// fused root that also writes its children's replicas, and copies further down the tree, and
// reduce::sharded for GPU towers as one fused pass per owner over its slice, with only its slice of the
// state (programs/owner_slices.hpp).
#include <towerpipe/programs/agents.hpp>
#include <towerpipe/programs/copy_wiring.hpp>
#include <towerpipe/programs/owner_slices.hpp>
#include <towerpipe/programs/process_agents.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include "agent_emulation.hpp"
#include "bench_support.hpp"
#include "mlp.hpp"
#include "test_support.hpp"

using namespace towerpipe;
using namespace towerpipe::detail;
using towerpipe_tests::run_agent_on_host;
using towerpipe_tests::bits_of;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

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
}

TEST_CASE("the tree rounds reproduce the canonical sum bitwise", "[multi_tensor][canonical]") {
  random_source random(60);
  INFO("seed " << random.seed());
  for (int towers = 2; towers <= 17; ++towers) {
    INFO("towers " << towers);
    for (int trial = 0; trial < 100; ++trial) {
      std::vector<float> raw = random.wide(static_cast<std::size_t>(towers));
      const std::vector<float> weights = random.normal(static_cast<std::size_t>(towers));
      const float expected = canonical_sum<float>(
          towers, [&](int t) { return detail::rounded_mul(weights[static_cast<std::size_t>(t)], raw[static_cast<std::size_t>(t)]); });
      float* pointers[32];
      for (int t = 0; t < towers; ++t) pointers[t] = &raw[static_cast<std::size_t>(t)];
      const pointer_table<float> sums{pointers, 1};
      const auto rounds = canonical_tree_rounds<float>(towers, weights);
      float result = 0;
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        for (const tree_edge<float>& edge : rounds[r]) {
          nonfinite_key unchecked = no_nonfinite;
          const float combined = edge.combine<1>(sums, 0, 0, unchecked).value[0];
          if (r + 1 == rounds.size()) {
            REQUIRE(edge.left == 0);
            result = combined;
          } else {
            raw[static_cast<std::size_t>(edge.left)] = combined;
          }
        }
      }
      REQUIRE(bits_of(result) == bits_of(expected));
    }
  }
}

namespace {

template <class Optim, class Layout>
class emulated_devices {
 public:
  using buffer = typename Layout::template buffer<host_memory>;

  emulated_devices(const variable_set& variables, std::size_t towers, const typename Optim::hyper_parameters& h,
                   std::size_t chunk_elements = 256)
      : variables_(variables), chunks_(make_chunk_table(variables, chunk_elements)) {
    for (std::size_t t = 0; t < towers; ++t) {
      gradients_.emplace_back(variables);
      replicas_.emplace_back(variables);
    }
    for (int s = 0; s < Optim::state_slots(h); ++s) state_.emplace_back(variables);
    gradient_pointers_ = gather_pointers<float>(roles(gradients_));
    replica_pointers_ = gather_pointers<float>(roles(replicas_));
    state_pointers_ = gather_pointers<float>(roles(state_));
    state_pointers_.push_back(nullptr);  // never empty
  }

  buffer& gradients(std::size_t t) { return gradients_[t]; }
  buffer& replica(std::size_t t) { return replicas_[t]; }
  int towers() const { return static_cast<int>(gradients_.size()); }
  const variable_set& variables() const { return variables_; }

  // The optimizer writing replicas[0, replica_count) of `replicas` (default: towers 0, 1, ... in order).
  optimizer_apply<Optim, float> apply(int replica_count, const typename Optim::template step_constants<float>& c,
                                      pointer_table<float> replicas = {}) {
    if (replicas.pointers == nullptr) replicas = replica_table();
    return {replicas, {state_pointers_.data(), count()}, replica_count, static_cast<int>(state_.size()), c, {}};
  }
  // The replica pointers of the given towers, as roles 0, 1, ... ([role][variable]).
  std::vector<float*> replica_pointers(const std::vector<int>& towers) {
    std::vector<float*> pointers;
    for (int t : towers) {
      for (int v = 0; v < count(); ++v) pointers.push_back(replica_pointers_[static_cast<std::size_t>(t * count() + v)]);
    }
    return pointers;
  }
  pointer_table<float> gradient_table() { return {gradient_pointers_.data(), count()}; }
  pointer_table<float> replica_table() { return {replica_pointers_.data(), count()}; }
  const std::vector<tensor_chunk>& chunks() const { return chunks_; }

  // Poisons every replica but the root's, so that an element a pass forgets to write shows.
  void poison_replicas() {
    for (std::size_t t = 1; t < replicas_.size(); ++t) {
      for (std::size_t v = 0; v < variables_.count(); ++v) {
        for (float& x : replicas_[t].view(v)) x = std::nanf("");
      }
    }
  }

 private:
  static std::vector<buffer*> roles(std::vector<buffer>& buffers) {
    std::vector<buffer*> result;
    for (buffer& b : buffers) result.push_back(&b);
    return result;
  }
  int count() const { return static_cast<int>(variables_.count()); }

  const variable_set& variables_;
  std::vector<tensor_chunk> chunks_;
  std::vector<buffer> gradients_, replicas_, state_;
  std::vector<float*> gradient_pointers_, replica_pointers_, state_pointers_;
};

enum class backend { device0_unrolled, device0_runtime_towers, p2p_tree, sharded };

// The towers' devices and links the copying paths are checked under (programs/copy_wiring.hpp): all on one
// device; one device with pipeline_options::direct_device_access off (how the GPU tests run the copying
// paths on one GPU); one device per tower, peer access only within pairs (0, 1), (2, 3), ...
enum class topology { one_device, one_device_no_direct_access, peer_pairs };

tower_access access_for(topology links, std::size_t towers) {
  std::vector<int> devices(towers, 0);
  std::set<std::pair<int, int>> peers;
  if (links == topology::peer_pairs) {
    for (std::size_t t = 0; t < towers; ++t) devices[t] = static_cast<int>(t);
    for (int t = 0; t + 1 < static_cast<int>(towers); t += 2) peers.insert({{t, t + 1}, {t + 1, t}});
  }
  return tower_access(devices, peers, links != topology::one_device_no_direct_access);
}

template <class Buffer>
void poison(Buffer& buffer) {
  for (std::size_t v = 0; v < buffer.variables().count(); ++v) {
    for (float& x : buffer.view(v)) x = std::nanf("");
  }
}
template <class Buffer>
void copy_whole(const Buffer& from, Buffer& to) {
  for (std::size_t v = 0; v < from.variables().count(); ++v) std::copy(from.view(v).begin(), from.view(v).end(), to.data(v));
}

// reduce::device0's copying paths as wired on the GPU: the towers the root does not reach have their
// gradients copied into buffers of the root's before the pass, and the pass writes their new parameters
// into other buffers of the root's, copied out after it. The copies start as NaN, so that a pass reading
// one that was never filled shows.
template <class Layout>
class copied_towers {
 public:
  using buffer = typename Layout::template buffer<host_memory>;

  template <class Devices>
  copied_towers(const variable_set& variables, const std::vector<char>& copied, Devices& devices)
      : variables_(static_cast<int>(variables.count())) {
    std::vector<buffer*> gradient_roles, replica_roles;
    for (std::size_t t = 0; t < copied.size(); ++t) {
      if (!copied[t]) {
        gradient_roles.push_back(&devices.gradients(t));
        replica_roles.push_back(&devices.replica(t));
        copies_.emplace_back();
        continue;
      }
      copies_.push_back(std::make_unique<std::pair<buffer, buffer>>(buffer(variables), buffer(variables)));
      poison(copies_.back()->first);
      poison(copies_.back()->second);
      gradient_roles.push_back(&copies_.back()->first);
      replica_roles.push_back(&copies_.back()->second);
    }
    gradient_pointers_ = gather_pointers<float>(gradient_roles);
    replica_pointers_ = gather_pointers<float>(replica_roles);
  }
  template <class Devices>
  void stage_in(Devices& devices) {
    for (std::size_t t = 0; t < copies_.size(); ++t) {
      if (copies_[t]) copy_whole(devices.gradients(t), copies_[t]->first);
    }
  }
  template <class Devices>
  void stage_out(Devices& devices) {
    for (std::size_t t = 0; t < copies_.size(); ++t) {
      if (copies_[t]) copy_whole(copies_[t]->second, devices.replica(t));
    }
  }
  pointer_table<const float> gradients() const { return {gradient_pointers_.data(), variables_}; }
  pointer_table<float> replicas() { return {replica_pointers_.data(), variables_}; }

 private:
  int variables_;
  std::vector<std::unique_ptr<std::pair<buffer, buffer>>> copies_;  // per tower: gradients, replica; null: direct
  std::vector<float*> gradient_pointers_, replica_pointers_;
};

// reduce::sharded's copying paths, for one owner: its slice of each tower it does not reach, in compact
// storage of its own (NaN until filled), copied in before its pass (with replica 0's slice, the master,
// where it does not reach tower 0) and out after it.
class copied_slices {
 public:
  template <class Devices>
  copied_slices(const owner_slice& slice, const std::vector<char>& copied, Devices& devices)
      : slice_(slice), variables_(static_cast<int>(devices.variables().count())) {
    for (std::size_t t = 0; t < copied.size(); ++t) {
      std::vector<float*> gradient_role, replica_role;
      if (copied[t]) {
        copies_.push_back(std::make_unique<std::pair<std::vector<float>, std::vector<float>>>(
            std::vector<float>(slice.stored_elements, std::nanf("")), std::vector<float>(slice.stored_elements, std::nanf(""))));
        gradient_role = slice_pointers(slice, copies_.back()->first.data(), devices.variables().count());
        replica_role = slice_pointers(slice, copies_.back()->second.data(), devices.variables().count());
      } else {
        copies_.emplace_back();
        for (std::size_t v = 0; v < devices.variables().count(); ++v) {
          gradient_role.push_back(devices.gradients(t).data(v));
          replica_role.push_back(devices.replica(t).data(v));
        }
      }
      gradient_pointers_.insert(gradient_pointers_.end(), gradient_role.begin(), gradient_role.end());
      replica_pointers_.insert(replica_pointers_.end(), replica_role.begin(), replica_role.end());
    }
  }
  template <class Devices>
  void stage_in(Devices& devices) {
    for (std::size_t t = 0; t < copies_.size(); ++t) {
      if (!copies_[t]) continue;
      into_compact(devices.gradients(t), copies_[t]->first);
      if (t == 0) into_compact(devices.replica(0), copies_[0]->second);
    }
  }
  template <class Devices>
  void stage_out(Devices& devices) {
    for (std::size_t t = 0; t < copies_.size(); ++t) {
      if (!copies_[t]) continue;
      slice_.for_each_stored_range([&](const element_range& r, std::size_t offset) {
        std::copy_n(copies_[t]->second.begin() + static_cast<std::ptrdiff_t>(offset), r.end - r.begin,
                    devices.replica(t).data(r.variable) + r.begin);
      });
    }
  }
  pointer_table<const float> gradients() const { return {gradient_pointers_.data(), variables_}; }
  pointer_table<float> replicas() { return {replica_pointers_.data(), variables_}; }

 private:
  template <class Buffer>
  void into_compact(const Buffer& whole, std::vector<float>& compact) const {
    slice_.for_each_stored_range([&](const element_range& r, std::size_t offset) {
      std::copy(whole.data(r.variable) + r.begin, whole.data(r.variable) + r.end, compact.begin() + static_cast<std::ptrdiff_t>(offset));
    });
  }

  const owner_slice& slice_;
  int variables_;
  std::vector<std::unique_ptr<std::pair<std::vector<float>, std::vector<float>>>> copies_;  // per tower; null: direct
  std::vector<float*> gradient_pointers_, replica_pointers_;
};

optim::sgd::hyper_parameters momentum_hyper_parameters() {
  optim::sgd::hyper_parameters h;
  h.lr = 0.05;
  h.momentum = 0.9;
  h.weight_decay = 0.01;
  return h;
}
optim::adam::hyper_parameters adam_hyper_parameters() {
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  h.weight_decay = 0.1;
  return h;
}

// reduce::p2p_tree as wired on the GPU (tree_wiring): each edge reads its right operand in place or from
// the left tower's scratch (NaN until the copy before the edge fills it); the root's pass writes the
// replicas the wiring gives it; every other tower pulls its parent's.
template <class Optim, class Layout>
void run_tree_as_wired(emulated_devices<Optim, Layout>& devices, const tree_wiring& wiring, const std::vector<float>& weights,
                       const typename Optim::template step_constants<float>& c) {
  using buffer = typename Layout::template buffer<host_memory>;
  const std::size_t n = static_cast<std::size_t>(devices.towers());
  const int count = static_cast<int>(devices.variables().count());
  std::vector<std::unique_ptr<buffer>> scratch(n);
  std::vector<std::vector<float*>> sums(n);  // per tower: every tower's partial as it reads them
  for (std::size_t t = 0; t < n; ++t) {
    if (wiring.needs_scratch[t]) {
      scratch[t] = std::make_unique<buffer>(devices.variables());
      poison(*scratch[t]);
    }
    std::vector<buffer*> roles;
    for (std::size_t other = 0; other < n; ++other) roles.push_back(wiring.via_scratch[t][other] ? scratch[t].get() : &devices.gradients(other));
    sums[t] = gather_pointers<float>(roles);
  }
  const auto operand_in_place = [&](const tree_edge<float>& edge) {
    const std::size_t left = static_cast<std::size_t>(edge.left), right = static_cast<std::size_t>(edge.right);
    if (wiring.via_scratch[left][right]) copy_whole(devices.gradients(right), *scratch[left]);
  };
  const auto rounds = canonical_tree_rounds<float>(static_cast<int>(n), weights);
  for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
    for (const tree_edge<float>& edge : rounds[r]) {
      operand_in_place(edge);
      run_agent_on_host(tree_round_agent<float>{{sums[static_cast<std::size_t>(edge.left)].data(), count}, edge, nullptr}, devices.chunks());
    }
  }
  operand_in_place(rounds.back().front());
  std::vector<int> root_targets{0};
  for (std::size_t t = 1; t < n; ++t) {
    if (wiring.written_by_root[t]) root_targets.push_back(static_cast<int>(t));
  }
  std::vector<float*> root_pointers = devices.replica_pointers(root_targets);
  const pointer_table<float> root_table{root_pointers.data(), count};
  run_agent_on_host(tree_root_agent<Optim, float>{{sums[0].data(), count}, rounds.back().front(),
                                                  devices.apply(static_cast<int>(root_targets.size()), c, root_table)},
                    devices.chunks());
  for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
    for (const tree_edge<float>& edge : *r) {
      if (wiring.written_by_root[static_cast<std::size_t>(edge.right)]) continue;
      float* const* replicas = devices.replica_table().pointers;
      const pointer_table<const float> source{replicas + edge.left * count, count};
      const pointer_table<float> target{replicas + edge.right * count, count};
      run_agent_on_host(copy_agent<float>{source, target, 1}, devices.chunks());
    }
  }
}

// reduce::sharded's owners for GPU towers: owner k holds slice k of the chunk table and only that
// slice's optimizer state and checked-step average, in compact storage reached through slice_pointers.
class emulated_owners {
 public:
  emulated_owners(const variable_set& variables, const std::vector<tensor_chunk>& chunks, std::size_t owners, int slots)
      : variables_(static_cast<int>(variables.count())), slots_(slots), slices_(cut_into_slices(chunks, owners)) {
    for (const owner_slice& slice : slices_) {
      state_.emplace_back(static_cast<std::size_t>(slots) * slice.stored_elements, 0.0f);
      average_.emplace_back(slice.stored_elements, 0.0f);
      state_pointers_.push_back(slice_row_pointers(slice, state_.back().data(), static_cast<std::size_t>(slots), variables.count()));
      average_pointers_.push_back(slice_pointers(slice, average_.back().data(), variables.count()));
    }
  }

  const std::vector<owner_slice>& slices() const { return slices_; }
  pointer_table<float> state(std::size_t k) { return {state_pointers_[k].data(), variables_}; }
  pointer_table<float> average(std::size_t k) { return {average_pointers_[k].data(), variables_}; }
  // Owner k's optimizer: its slice of the state; it reads the master (replica 0) and writes every replica.
  template <class Optim, class Layout>
  optimizer_apply<Optim, float> apply(std::size_t k, emulated_devices<Optim, Layout>& devices,
                                      const typename Optim::template step_constants<float>& c, pointer_table<float> replicas = {}) {
    if (replicas.pointers == nullptr) replicas = devices.replica_table();
    return {replicas, state(k), devices.towers(), slots_, c, {}};
  }

 private:
  int variables_, slots_;
  std::vector<owner_slice> slices_;
  std::vector<std::vector<float>> state_, average_;
  std::vector<std::vector<float*>> state_pointers_, average_pointers_;
};

// One step's random gradients: [tower][variable].
std::vector<std::vector<std::vector<float>>> draw_gradients(random_source& random, const variable_set& variables,
                                                            std::size_t towers) {
  std::vector<std::vector<std::vector<float>>> grads(towers);
  for (auto& tower : grads) {
    for (const variable& v : variables) tower.push_back(random.wide(v.size));
  }
  return grads;
}

// A skipped step's report: the screen found what the host pipeline reported.
void check_same_nonfinite(const screen_partials& partials, const step_stats& stats) {
  REQUIRE(partials.first_nonfinite != no_nonfinite);
  const nonfinite_place place = decode_nonfinite_key(partials.first_nonfinite);
  CHECK(place.variable == stats.nonfinite->variable);
  CHECK(place.element == stats.nonfinite->element);
  CHECK(place.tower == *stats.nonfinite->tower);
}

// One step of the host reference on `grads` ([tower][variable]); step_and_load: and the same gradients into the
// emulated devices' buffers.
template <class Trainer>
step_stats reference_step(Trainer& reference, const batch& b, const std::vector<std::vector<std::vector<float>>>& grads) {
  return reference.step(b, [&](typename Trainer::tower_context& tower) {
    for (std::size_t v = 0; v < grads[tower.tower()].size(); ++v)
      tower.write_gradient(v, grads[tower.tower()][v].data(), grads[tower.tower()][v].size());
    return 0.0;
  });
}
template <class Trainer, class Devices>
step_stats step_and_load(Trainer& reference, Devices& devices, const batch& b,
                         const std::vector<std::vector<std::vector<float>>>& grads) {
  const step_stats stats = reference_step(reference, b, grads);
  for (std::size_t t = 0; t < grads.size(); ++t) {
    for (std::size_t v = 0; v < grads[t].size(); ++v)
      std::copy(grads[t][v].begin(), grads[t][v].end(), devices.gradients(t).data(v));
  }
  return stats;
}

template <class Optim, class Layout>
void check_emulated_backend(backend kind, topology links, const typename Optim::hyper_parameters& h, std::uint64_t salt) {
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<float>>;
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {7}}};
  random_source random(salt);
  INFO(Optim::name << " " << Layout::name << ", backend " << static_cast<int>(kind) << ", topology " << static_cast<int>(links)
                   << ", seed " << random.seed());
  for (std::size_t towers = 1; towers <= 8; ++towers) {
    INFO(towers << " towers");
    const tower_access access = access_for(links, towers);
    const std::size_t examples = 3 * towers - 1;  // uneven shards: distinct weights
    trainer reference(variables, {{"x", dtype::float32, {1}}}, towers, h);
    emulated_devices<Optim, Layout> devices(variables, towers, h);
    emulated_owners owners(variables, devices.chunks(), towers, Optim::state_slots(h));
    const std::vector<shard> shards = plan_split(examples, towers, split_policy::weighted);
    std::vector<float> weights;
    for (const shard& s : shards) weights.push_back(static_cast<float>(s.weight));
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const std::vector<float> initial = random.normal(variables[v].size);
      reference.set_parameter(v, initial.data(), initial.size());
      for (std::size_t t = 0; t < towers; ++t) std::copy(initial.begin(), initial.end(), devices.replica(t).data(v));
    }
    const std::vector<float> x(examples, 1.0f);
    batch b;
    b.add("x", x.data(), examples, {1});
    for (std::int64_t step = 1; step <= 10; ++step) {
      const auto grads = draw_gradients(random, variables, towers);
      step_and_load(reference, devices, b, grads);
      devices.poison_replicas();
      const auto constants = Optim::template constants<float>(h, step);
      const int n = devices.towers();
      if (kind == backend::sharded) {
        for (std::size_t k = 0; k < owners.slices().size(); ++k) {
          const owner_slice& slice = owners.slices()[k];
          if (slice.empty()) continue;
          copied_slices copies(slice, access.copied_by(k), devices);
          copies.stage_in(devices);
          fused_apply_agent<Optim, float, 0> agent{copies.gradients(), n, {}, owners.apply(k, devices, constants, copies.replicas())};
          std::copy(weights.begin(), weights.end(), agent.weights);
          run_agent_on_host(agent, slice.chunk_list(devices.chunks()));
          copies.stage_out(devices);
        }
      } else if (kind == backend::p2p_tree && n > 1) {
        run_tree_as_wired(devices, tree_wiring(access), weights, constants);
      } else {
        copied_towers<Layout> copies(variables, access.copied_by(0), devices);
        copies.stage_in(devices);
        const auto apply = devices.apply(n, constants, copies.replicas());
        if (kind == backend::device0_runtime_towers) {
          fused_apply_agent<Optim, float, 0> agent{copies.gradients(), n, {}, apply};
          std::copy(weights.begin(), weights.end(), agent.weights);
          run_agent_on_host(agent, devices.chunks());
        } else {
          fused_apply_agent<Optim, float, 8> eight{copies.gradients(), n, {}, apply};  // only when n == 8
          fused_apply_agent<Optim, float, 0> any{copies.gradients(), n, {}, apply};
          std::copy(weights.begin(), weights.end(), eight.weights);
          std::copy(weights.begin(), weights.end(), any.weights);
          if (n == 8) run_agent_on_host(eight, devices.chunks());
          else run_agent_on_host(any, devices.chunks());
        }
        copies.stage_out(devices);
      }
      INFO("step " << step);
      for (std::size_t t = 0; t < towers; ++t) {
        for (std::size_t v = 0; v < variables.count(); ++v)
          REQUIRE(first_bitwise_difference(devices.replica(t).view(v), reference.parameter(v)) == -1);
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated device backends, wired as on the GPU (direct or copied), equal the host pipeline bitwise for "
                   "1..8 towers",
                   "[multi_tensor][canonical]", layout::flat<float>, layout::per_variable<float>) {
  const optim::sgd::hyper_parameters momentum = momentum_hyper_parameters();
  const optim::adam::hyper_parameters adam = adam_hyper_parameters();
  for (backend kind : {backend::device0_unrolled, backend::device0_runtime_towers, backend::p2p_tree, backend::sharded}) {
    for (topology links : {topology::one_device, topology::one_device_no_direct_access, topology::peer_pairs}) {
      check_emulated_backend<optim::sgd, TestType>(kind, links, momentum, 61);
      check_emulated_backend<optim::adam, TestType>(kind, links, adam, 62);
      check_emulated_backend<optim::adamw, TestType>(kind, links, optim::adamw::hyper_parameters{}, 63);
    }
  }
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

namespace {

// A checked step as the device backends run it (programs/screen.hpp), on the host: the screen's lane
// program over every tile (a warp's 32 lanes one after another, then pairwise_lane_sum, which the
// kernel does with shuffles), then fused_apply_agent over the average with the clip coefficient as its
// one weight. Returns the screen's partials.
template <class Source>
void screen_tiles(const Source& source, const pointer_table<float>& averaged, const std::vector<tensor_chunk>& tiles,
                  screen_partials& partials) {
  for (const tensor_chunk& tile : tiles) {
    const screen_lane_result r = towerpipe_tests::screen_tile_as_a_warp(source, averaged, tile);
    partials.tile_sums.push_back(r.sum_of_squares);
    partials.first_nonfinite = std::min(partials.first_nonfinite, r.first_nonfinite);
  }
}

float clip_coefficient(const screen_partials& partials, double max_norm) {
  return static_cast<float>(std::min(1.0, max_norm / (std::sqrt(partials.sum_of_squares()) + 1e-6)));
}

// reduce::sharded's checked step: each owner screens the average of its slice (the tiles of its slice,
// into its compact average), the partials in owner order are the whole table's; then each owner applies.
template <class Optim, class Layout>
screen_partials emulated_sharded_checked_step(emulated_devices<Optim, Layout>& devices, emulated_owners& owners,
                                              const std::vector<float>& weights, double max_norm,
                                              const typename Optim::template step_constants<float>& constants) {
  const int count = static_cast<int>(devices.gradient_table().variables);
  const pointer_table<const float> gradients{devices.gradient_table().pointers, count};
  const int n = devices.towers();
  screen_partials partials;
  for (std::size_t k = 0; k < owners.slices().size(); ++k) {
    accumulating_source<tower_average_source<float, 0, weight_array<float>>, float> source{{gradients, n, {}}, owners.average(k), {}};
    std::copy(weights.begin(), weights.end(), source.inner.weights.value);
    screen_tiles(source, owners.average(k), make_chunk_table(owners.slices()[k].ranges, screen_tile_elements), partials);
  }
  if (partials.first_nonfinite != no_nonfinite) return partials;
  const float coefficient = clip_coefficient(partials, max_norm);
  for (std::size_t k = 0; k < owners.slices().size(); ++k) {
    const pointer_table<const float> average{owners.average(k).pointers, count};
    run_agent_on_host(fused_apply_agent<Optim, float, 1>{average, 1, {coefficient}, owners.apply(k, devices, constants)},
                      owners.slices()[k].chunk_list(devices.chunks()));
  }
  return partials;
}

template <class Optim, class Layout>
screen_partials emulated_checked_step(backend kind, emulated_devices<Optim, Layout>& devices, const variable_set& variables,
                                      const std::vector<float>& weights, double max_norm,
                                      const typename Optim::template step_constants<float>& constants) {
  typename Layout::template buffer<host_memory> average(variables);
  std::vector<float*> average_pointers = gather_pointers<float>(std::vector<decltype(&average)>{&average});
  const pointer_table<float> averaged{average_pointers.data(), static_cast<int>(variables.count())};
  const pointer_table<const float> gradients{devices.gradient_table().pointers, static_cast<int>(variables.count())};
  const int n = devices.towers();
  screen_partials partials;
  const std::vector<tensor_chunk> tiles = make_chunk_table(variables, screen_tile_elements);
  if (kind == backend::p2p_tree && n > 1) {
    const auto rounds = canonical_tree_rounds<float>(n, weights);
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<float>& edge : rounds[r])
        run_agent_on_host(tree_round_agent<float>{devices.gradient_table(), edge, &partials.first_nonfinite}, devices.chunks());
    }
    const edge_average_source<float> edge{devices.gradient_table(), rounds.back().front()};
    screen_tiles(accumulating_source<edge_average_source<float>, float>{edge, averaged, {}}, averaged, tiles, partials);
  } else {
    accumulating_source<tower_average_source<float, 0, weight_array<float>>, float> source{{gradients, n, {}}, averaged, {}};
    std::copy(weights.begin(), weights.end(), source.inner.weights.value);
    screen_tiles(source, averaged, tiles, partials);
  }
  if (partials.first_nonfinite != no_nonfinite) return partials;
  const float coefficient = clip_coefficient(partials, max_norm);
  const pointer_table<const float> average_table{average_pointers.data(), static_cast<int>(variables.count())};
  run_agent_on_host(fused_apply_agent<Optim, float, 1>{average_table, 1, {coefficient}, devices.apply(n, constants)},
                    devices.chunks());
  return partials;
}

}  // namespace

TEMPLATE_TEST_CASE("emulated checked steps of the device backends equal the host's: norm, clip, first non-finite",
                   "[multi_tensor][checked]", layout::flat<float>, layout::per_variable<float>) {
  using trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
  // "tail" spans three screen tiles, the last one partial and not a whole number of groups.
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {4101}}};
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  random_source random(70);
  for (backend kind : {backend::device0_runtime_towers, backend::p2p_tree, backend::sharded}) {
    for (std::size_t towers = 1; towers <= 8; ++towers) {
      INFO("backend " << static_cast<int>(kind) << ", " << towers << " towers, seed " << random.seed());
      const std::size_t examples = 3 * towers - 1;
      pipeline_options options;
      options.max_grad_norm = 3.0;
      trainer reference(variables, {{"x", dtype::float32, {1}}}, towers, h, options);
      // Chunks of one screen tile: the owners' slices start on tiles (programs/owner_slices.hpp).
      emulated_devices<optim::adam, TestType> devices(variables, towers, h, screen_tile_elements);
      emulated_owners owners(variables, devices.chunks(), towers, optim::adam::state_slots(h));
      std::vector<float> weights;
      for (const shard& s : plan_split(examples, towers, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
      const std::vector<float> x(examples, 1.0f);
      batch b;
      b.add("x", x.data(), examples, {1});
      std::int64_t done = 0;
      for (int step = 1; step <= 6; ++step) {
        INFO("step " << step);
        auto grads = draw_gradients(random, variables, towers);
        if (step % 3 == 0) grads[(towers - 1) / 2][3][static_cast<std::size_t>(step) * 611] = std::nanf("");
        const step_stats stats = step_and_load(reference, devices, b, grads);
        const auto constants = optim::adam::constants<float>(h, done + 1);
        const screen_partials partials =
            kind == backend::sharded
                ? emulated_sharded_checked_step(devices, owners, weights, options.max_grad_norm, constants)
                : emulated_checked_step(kind, devices, variables, weights, options.max_grad_norm, constants);
        if (stats.skipped) {
          check_same_nonfinite(partials, stats);
          continue;
        }
        ++done;
        REQUIRE(partials.first_nonfinite == no_nonfinite);
        CHECK(std::sqrt(partials.sum_of_squares()) == *stats.gradient_norm);
        CHECK(stats.clip_coefficient < 1.0);  // the clip is exercised
        for (std::size_t t = 0; t < towers; ++t) {
          for (std::size_t v = 0; v < variables.count(); ++v)
            REQUIRE(first_bitwise_difference(devices.replica(t).view(v), reference.parameter(v)) == -1);
        }
      }
    }
  }
}

namespace {

// reduce::sharded for GPU towers across processes (reduce/sharded/gpu_towers_across_processes.cuh), emulated: each
// process's towers as above, its buffers laid out by exchange_plan, the transport done by copies.
template <class Optim, class Layout>
struct emulated_process {
  emulated_process(const variable_set& variables, int processes, int rank, std::size_t towers,
                   const typename Optim::hyper_parameters& h)
      : devices(variables, towers, h, screen_tile_elements),
        plan(devices.chunks(), variables.count(), processes, rank, (towers & (towers - 1)) == 0 ? 1 : towers),
        send(plan.send_elements()),
        received(plan.receive_elements()),
        state(static_cast<std::size_t>(Optim::state_slots(h)) * plan.mine().stored_elements),
        updated(plan.mine().stored_elements),
        averaged(plan.mine().stored_elements),
        gathered(plan.total()),
        received_rows(plan.received_row_pointers(received.data())),
        master(slice_pointers(plan.mine(), updated.data(), variables.count())),
        averaged_pointers(slice_pointers(plan.mine(), averaged.data(), variables.count())),
        gathered_pointers(padded_flat_pointers(gathered.data(), variables)),
        state_pointers(slice_row_pointers(plan.mine(), state.data(), static_cast<std::size_t>(Optim::state_slots(h)), variables.count())),
        slots(Optim::state_slots(h)),
        variables_(static_cast<int>(variables.count())) {}

  // The pipeline's set_parameter, as the reducer hears it (parameter_set): its slice of the master copy.
  void parameter_set(std::size_t v, const std::vector<float>& values) {
    plan.mine().for_each_stored_range([&](const element_range& r, std::size_t offset) {
      if (r.variable == v) std::copy(values.begin() + r.begin, values.begin() + r.end, updated.begin() + offset);
    });
  }
  // The owner's optimizer: its master copy of the slice, which the gather sends.
  optimizer_apply<Optim, float> apply(const typename Optim::template step_constants<float>& c) {
    return {{master.data(), variables_}, {state_pointers.data(), variables_}, 1, slots, c, {}};
  }
  pointer_table<const float> rows() const { return {received_rows.data(), variables_}; }
  pointer_table<float> averaged_table() { return {averaged_pointers.data(), variables_}; }
  std::vector<tensor_chunk> my_chunks() const { return plan.mine().chunk_list(devices.chunks()); }

  emulated_devices<Optim, Layout> devices;
  exchange_plan plan;
  std::vector<float> send, received, state, updated, averaged, gathered;
  std::vector<float*> received_rows, master, averaged_pointers, gathered_pointers, state_pointers;
  int slots, variables_;
};

// One step of every process: contributions, the all-to-all, each owner's pass(es), the gather and the
// local broadcast. Checked: the screen over every owner's tiles in owner order, and the first non-finite
// key over the senders' raw screens and the owners' sums; skipped steps stop there.
template <class Optim, class Layout>
screen_partials emulated_process_step(std::vector<emulated_process<Optim, Layout>>& processes, const std::vector<float>& weights,
                                      bool checked, double max_norm, const typename Optim::template step_constants<float>& c) {
  const auto bytes_at = [](std::vector<float>& buffer, std::size_t byte_offset) {
    return reinterpret_cast<char*>(buffer.data()) + byte_offset;
  };
  screen_partials partials;
  for (std::size_t p = 0; p < processes.size(); ++p) {
    auto& sender = processes[p];
    const int towers = sender.devices.towers();
    contribution_agent<float> agent{{sender.devices.gradient_table().pointers, sender.variables_}, towers,
                                    sender.plan.contributions() == 1, {}, static_cast<unsigned>(p) * static_cast<unsigned>(towers),
                                    {}, checked ? &partials.first_nonfinite : nullptr};
    std::copy(weights.begin() + static_cast<std::ptrdiff_t>(p) * towers, weights.begin() + static_cast<std::ptrdiff_t>(p + 1) * towers,
              agent.weights.value);
    for (int owner = 0; owner < sender.plan.processes(); ++owner) {
      const std::vector<float*> rows = sender.plan.send_row_pointers(owner, sender.send.data());
      agent.rows = {rows.data(), sender.variables_};
      run_agent_on_host(agent, sender.plan.slice(owner).chunk_list(sender.devices.chunks()));
    }
  }
  for (std::size_t owner = 0; owner < processes.size(); ++owner) {
    for (std::size_t p = 0; p < processes.size(); ++p) {
      const auto out = processes[p].plan.send_blocks(sizeof(float));
      const auto in = processes[owner].plan.receive_blocks(sizeof(float));
      REQUIRE(out.bytes[owner] == in.bytes[p]);
      std::memcpy(bytes_at(processes[owner].received, in.offsets[p]), bytes_at(processes[p].send, out.offsets[owner]), in.bytes[p]);
    }
  }
  float coefficient = 1.0f;
  if (checked) {
    for (auto& owner : processes) {
      const accumulating_source<rows_sum_source<float>, float> source{{owner.rows(), owner.plan.rows()}, owner.averaged_table(), {}};
      screen_tiles(source, owner.averaged_table(), make_chunk_table(owner.plan.mine().ranges, screen_tile_elements), partials);
    }
    if (partials.first_nonfinite != no_nonfinite) return partials;
    coefficient = clip_coefficient(partials, max_norm);
  }
  for (auto& owner : processes) {
    if (checked) {
      const pointer_table<const float> average{owner.averaged_pointers.data(), owner.variables_};
      run_agent_on_host(fused_apply_agent<Optim, float, 1>{average, 1, {coefficient}, owner.apply(c)}, owner.my_chunks());
    } else {
      run_agent_on_host(rows_apply_agent<Optim, float>{{owner.rows(), owner.plan.rows()}, owner.apply(c)}, owner.my_chunks());
    }
  }
  for (auto& process : processes) {
    const auto blocks = process.plan.gather_blocks(sizeof(float));
    for (std::size_t owner = 0; owner < processes.size(); ++owner)
      std::memcpy(bytes_at(process.gathered, blocks.offsets[owner]), processes[owner].updated.data(), blocks.bytes[owner]);
    const pointer_table<const float> source{process.gathered_pointers.data(), process.variables_};
    run_agent_on_host(copy_agent<float>{source, process.devices.replica_table(), process.devices.towers()}, process.devices.chunks());
  }
  return partials;
}

template <class Optim, class Layout>
void check_emulated_processes(const typename Optim::hyper_parameters& h, bool checked, std::uint64_t salt) {
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<float>>;
  // "tail" spans five screen tiles (the chunks here), the last one partial: slices cut through it.
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {9001}}};
  random_source random(salt);
  for (int count = 1; count <= 3; ++count) {
    for (std::size_t towers = 1; towers <= 4; ++towers) {
      INFO(Optim::name << " " << Layout::name << (checked ? ", checked" : "") << ", " << count << " processes x " << towers
                       << " towers, seed " << random.seed());
      const std::size_t all = towers * static_cast<std::size_t>(count), examples = 3 * all - 1;
      pipeline_options options;
      if (checked) options.max_grad_norm = 3.0;
      else options.on_nonfinite = nonfinite_policy::unchecked;
      trainer reference(variables, {{"x", dtype::float32, {1}}}, all, h, options);
      std::vector<emulated_process<Optim, Layout>> processes;
      for (int r = 0; r < count; ++r) processes.emplace_back(variables, count, r, towers, h);
      std::vector<float> weights;
      for (const shard& s : plan_split(examples, all, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
      for (std::size_t v = 0; v < variables.count(); ++v) {
        const std::vector<float> initial = random.normal(variables[v].size);
        reference.set_parameter(v, initial.data(), initial.size());
        for (auto& p : processes) {
          for (std::size_t t = 0; t < towers; ++t) std::copy(initial.begin(), initial.end(), p.devices.replica(t).data(v));
          p.parameter_set(v, initial);
        }
      }
      const std::vector<float> x(examples, 1.0f);
      batch b;
      b.add("x", x.data(), examples, {1});
      std::int64_t done = 0;
      for (int step = 1; step <= 5; ++step) {
        INFO("step " << step);
        auto grads = draw_gradients(random, variables, all);
        if (checked && step == 3) grads[all - 1][3][7000] = std::nanf("");
        const step_stats stats = reference_step(reference, b, grads);
        for (std::size_t g = 0; g < all; ++g) {
          for (std::size_t v = 0; v < variables.count(); ++v)
            std::copy(grads[g][v].begin(), grads[g][v].end(), processes[g / towers].devices.gradients(g % towers).data(v));
        }
        for (auto& p : processes) p.devices.poison_replicas();
        const auto constants = Optim::template constants<float>(h, done + 1);
        const screen_partials partials = emulated_process_step(processes, weights, checked, options.max_grad_norm, constants);
        if (stats.skipped) {
          check_same_nonfinite(partials, stats);
          // The skipped step wrote nothing; the replicas the test poisoned get the reference's values back.
          for (auto& p : processes) {
            for (std::size_t t = 1; t < towers; ++t) {
              for (std::size_t v = 0; v < variables.count(); ++v)
                std::copy(reference.parameter(v).begin(), reference.parameter(v).end(), p.devices.replica(t).data(v));
            }
          }
          continue;
        }
        ++done;
        if (checked) CHECK(std::sqrt(partials.sum_of_squares()) == *stats.gradient_norm);
        for (auto& p : processes) {
          for (std::size_t t = 0; t < towers; ++t) {
            for (std::size_t v = 0; v < variables.count(); ++v)
              REQUIRE(first_bitwise_difference(p.devices.replica(t).view(v), reference.parameter(v)) == -1);
          }
        }
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated GPU towers across processes (contributions, exchange, owners, gather) equal one process "
                   "bitwise",
                   "[multi_tensor][sharded]", layout::flat<float>, layout::per_variable<float>) {
  const optim::sgd::hyper_parameters momentum = momentum_hyper_parameters();
  const optim::adam::hyper_parameters adam = adam_hyper_parameters();
  for (bool checked : {false, true}) {
    check_emulated_processes<optim::sgd, TestType>(momentum, checked, 81);
    check_emulated_processes<optim::adam, TestType>(adam, checked, 82);
    check_emulated_processes<optim::adamw, TestType>(optim::adamw::hyper_parameters{}, checked, 83);
  }
}

namespace {

// The base of an allocation as cuda_device_memory makes them (256-byte aligned). The tables are only
// checked, never read, so no memory stands behind it: ResNet-50's state would be 200 MB per case.
struct fake_allocation {
  float* get() const { return reinterpret_cast<float*>(std::uintptr_t(1) << 40); }
};
fake_allocation aligned_storage(std::size_t) { return {}; }

// Every table reduce::sharded with GPU towers builds over compact storage (reduce/sharded/gpu_towers.cuh,
// reduce/sharded/gpu_towers_across_processes.cuh), built by the same functions, must keep every vector the kernels move
// aligned: check_vector_aligned throws where it would not.
void check_compact_tables_aligned(const variable_set& variables, std::size_t chunk_elements, std::size_t vector_bytes) {
  const std::vector<tensor_chunk> table = make_chunk_table(variables, chunk_elements);
  const std::size_t count = variables.count();
  const std::size_t slots = 2;  // Adam's
  for (std::size_t owners = 1; owners <= 8; ++owners) {
    INFO("one process, " << owners << " owners");
    for (const owner_slice& slice : cut_into_slices(table, owners)) {
      if (slice.empty()) continue;
      const std::vector<tensor_chunk> mine = slice.chunk_list(table);
      const auto state = aligned_storage(slots * slice.stored_elements);
      const auto copy = aligned_storage(slice.stored_elements);
      check_vector_aligned(slice_row_pointers(slice, state.get(), slots, count), count, mine, vector_bytes, "state");
      check_vector_aligned(slice_pointers(slice, copy.get(), count), count, mine, vector_bytes, "a copied tower's slice");
    }
  }
  for (int processes = 1; processes <= 4; ++processes) {
    for (std::size_t contributions = 1; contributions <= 3; ++contributions) {
      for (int rank = 0; rank < processes; ++rank) {
        INFO(processes << " processes, rank " << rank << ", " << contributions << " contributions each");
        const exchange_plan plan(table, count, processes, rank, contributions);
        const auto send = aligned_storage(plan.send_elements());
        const auto received = aligned_storage(plan.receive_elements());
        const auto updated = aligned_storage(plan.mine().stored_elements);
        const auto gathered = aligned_storage(plan.total());
        for (int owner = 0; owner < processes; ++owner)
          check_vector_aligned(plan.send_row_pointers(owner, send.get()), count, plan.slice(owner).chunk_list(table), vector_bytes, "send");
        const std::vector<tensor_chunk> mine = plan.mine().chunk_list(table);
        check_vector_aligned(plan.received_row_pointers(received.get()), count, mine, vector_bytes, "received");
        check_vector_aligned(slice_pointers(plan.mine(), updated.get(), count), count, mine, vector_bytes, "master");
        check_vector_aligned(padded_flat_pointers(gathered.get(), variables), count, table, vector_bytes, "gathered");
        // The blocks the transports move start aligned too, and the gather fills the padded space.
        for (const auto& blocks : {plan.send_blocks(sizeof(float)), plan.receive_blocks(sizeof(float)), plan.gather_blocks(sizeof(float))}) {
          for (std::size_t offset : blocks.offsets) CHECK(offset % 256 == 0);
        }
        CHECK(plan.total() == padded_flat_starts(variables).back());
      }
    }
  }
}

}  // namespace

TEST_CASE("reduce::sharded's compact storage keeps vector I/O aligned for the test models, the MLP and ResNet-50 with 1-8 owners and "
          "1-4 processes",
          "[multi_tensor][sharded][alignment]") {
  const std::vector<std::pair<const char*, variable_set>> models{
      {"GPU test model", {{"w", {300, 70}}, {"b", {70}}, {"s", {}}, {"odd", {5003}}}},
      {"host test model", {{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {9001}}}},
      {"MLP 784-256-128-10", towerpipe_examples::mlp({784, 256, 128, 10}).variables()},
      {"ResNet-50", towerpipe_bench::read_shapes(TOWERPIPE_BENCH_SHAPES_DIR "/resnet50.shapes")}};
  for (const auto& [name, variables] : models) {
    // The default launch policy (4096-element chunks, 16-byte vectors) and a screen tile's chunks.
    for (std::size_t chunk_elements : {std::size_t(4096), std::size_t(1024)}) {
      INFO(name << ", chunks of " << chunk_elements);
      check_compact_tables_aligned(variables, chunk_elements, 16);
    }
  }
}

TEST_CASE("exchange_plan takes at most 1024 rows per owner by default (GPU towers), any int count when told (host towers)",
          "[multi_tensor][sharded]") {
  const variable_set variables{{"w", {4096}}};
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 2048);
  CHECK_THROWS_WITH(exchange_plan(table, 1, 2, 0, 600),
                    "towerpipe: reduce::sharded sums at most 1024 contributions per element; 2 processes send 600 each (use a "
                    "power-of-two number of towers per process: one each)");
  CHECK_NOTHROW(exchange_plan(table, 1, 2, 0, 512));
  const exchange_plan host(table, 1, 2, 1, 600, max_host_process_rows);
  CHECK(host.rows() == 1200);
  CHECK(host.mine().stored_elements == 2048);  // the second of two equal halves
  CHECK(host.receive_elements() == 1200 * 2048);
}

TEST_CASE("check_vector_aligned names the table, role, variable and element a kernel could not take",
          "[multi_tensor][alignment]") {
  const variable_set variables{{"a", {5}}, {"b", {300}}};
  const std::vector<tensor_chunk> table = make_chunk_table(variables, 256);
  const auto storage = aligned_storage(1024);
  // Variables end to end without padding: "b" starts 5 floats (20 bytes) in.
  const std::vector<float*> unpadded{storage.get(), storage.get() + 5};
  CHECK_THROWS_WITH(check_vector_aligned(unpadded, 2, table, 16, "end to end"),
                    "towerpipe: end to end: role 0, variable 1, element 0 lies at an address that is not 16-byte aligned, as the kernel's "
                    "vector I/O needs");
  CHECK_NOTHROW(check_vector_aligned(unpadded, 2, table, 4, "end to end"));
  CHECK_NOTHROW(check_vector_aligned(padded_flat_pointers(storage.get(), variables), 2, table, 16, "padded"));
}
