// The device reducers in one process — reduce::device0, reduce::p2p_tree, reduce::sharded for GPU
// towers — run on the host with their own wiring: the tables and copy lists they are built from
// (wiring/copy_wiring.hpp, wiring/owner_wiring.hpp), the per-element programs (kernels/agents.hpp)
// over them through the host dispatch (programs/host_dispatch.hpp), in the order the reducers launch
// them. Direct or through copies (the copies start as NaN), they must give bitwise the host pipeline's
// parameters, norm, clip and first non-finite.
#include <towerpipe/kernels/agents.hpp>
#include <towerpipe/wiring/copy_wiring.hpp>
#include <towerpipe/programs/host_dispatch.hpp>
#include <towerpipe/wiring/owner_wiring.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "emulated_towers.hpp"
#include "test_support.hpp"

using namespace towerpipe;
using namespace towerpipe::detail;
using namespace towerpipe_tests;

namespace {

template <class Optim, class Layout>
using towers_of = emulated_towers<Optim, Layout>;
template <class Optim>
using constants_of = typename Optim::template step_constants<float>;

// The parts of an unchecked step as the reducers take them (reduce/overlapped_reduction.hpp): gradient
// buckets, then what the towers left; by default one part of every variable (the whole step). Each
// emulated reducer calls before_part(part), where set, as a part starts.
using step_parts = std::vector<std::vector<std::size_t>>;
using part_hook = std::function<void(const std::vector<std::size_t>&)>;

// The chunks of `table` that a part's launches cover: the runs of its variables (chunks_by_variable, as
// the reducers find them), in order.
inline std::vector<tensor_chunk> part_chunks(const std::vector<tensor_chunk>& table, std::size_t variables,
                                             const std::vector<std::size_t>& part) {
  std::vector<tensor_chunk> chunks;
  for (const chunk_group& run : chunks_by_variable(table, variables).runs(part))
    chunks.insert(chunks.end(), table.begin() + static_cast<std::ptrdiff_t>(run.first), table.begin() + static_cast<std::ptrdiff_t>(run.last));
  return chunks;
}

// A checked step's whole average on the reducing device, as device0 and p2p_tree keep it.
template <class Optim, class Layout>
struct whole_average {
  explicit whole_average(towers_of<Optim, Layout>& towers)
      : buffer(towers.variables()), pointers(gather_pointers<float>(std::vector<decltype(&buffer)>{&buffer})) {}
  typename Layout::template buffer<host_memory, float> buffer;
  std::vector<float*> pointers;
};

// reduce::device0 (reduce/device0.cuh): the root reads every tower's gradients in place or from its
// copy, and writes every replica in place or into its copy, copied out after the pass.
template <class Optim, class Layout>
class emulated_device0 {
 public:
  emulated_device0(towers_of<Optim, Layout>& towers, bool unrolled)
      : parts{every_variable(towers.variables().count())},
        towers_(towers),
        copies_(towers, 0, nan_filled_memory{}, true),
        average_(towers),
        unrolled_(unrolled) {}

  step_parts parts;
  part_hook before_part;
  void average_and_apply(const std::vector<float>& weights, const constants_of<Optim>& c) {
    for (const std::vector<std::size_t>& part : parts) {
      if (before_part) before_part(part);
      average_and_apply_part(weights, c, part_chunks(towers_.chunks(), towers_.variables().count(), part));
    }
  }
  void average_and_apply_part(const std::vector<float>& weights, const constants_of<Optim>& c, const std::vector<tensor_chunk>& chunks) {
    run_copies_on_host(copies_.gradients_in());
    const auto apply = replicas_apply(c);
    const int n = static_cast<int>(towers_.towers());
    fused_apply_agent<Optim, float, 8> eight{const_table(copies_.gradients(), towers_.count()), n, {}, apply};  // only when n == 8
    fused_apply_agent<Optim, float, 0> any{const_table(copies_.gradients(), towers_.count()), n, {}, apply};
    std::copy(weights.begin(), weights.end(), eight.weights);
    std::copy(weights.begin(), weights.end(), any.weights);
    if (unrolled_ && n == 8) run_agent_on_host(eight, chunks);
    else run_agent_on_host(any, chunks);
    run_copies_on_host(copies_.replicas_out());
  }
  screen_partials screen_average(const std::vector<float>& weights) {
    run_copies_on_host(copies_.gradients_in());
    screen_partials partials;
    const pointer_table<float> averaged = table(average_.pointers, towers_.count());
    accumulating_source<tower_average_source<float, 0, weight_array<float>>, float> source{
        {const_table(copies_.gradients(), towers_.count()), static_cast<int>(towers_.towers()), {}}, averaged, {}};
    std::copy(weights.begin(), weights.end(), source.inner.weights.value);
    screen_tiles(source, averaged, make_chunk_table(towers_.variables(), screen_tile_elements), partials);
    return partials;
  }
  void apply_averaged(float scale, const constants_of<Optim>& c) {
    run_agent_on_host(fused_apply_agent<Optim, float, 1>{const_table(average_.pointers, towers_.count()), 1, {scale}, replicas_apply(c)},
                      towers_.chunks());
    run_copies_on_host(copies_.replicas_out());
  }

 private:
  optimizer_apply<Optim, float> replicas_apply(const constants_of<Optim>& c) {
    return towers_.apply(table(copies_.replicas(), towers_.count()), static_cast<int>(towers_.towers()), c);
  }

  towers_of<Optim, Layout>& towers_;
  tower_copies<typename towers_of<Optim, Layout>::copy_buffer> copies_;
  whole_average<Optim, Layout> average_;
  bool unrolled_;
};

// reduce::p2p_tree (reduce/p2p_tree.cuh) as tree_wiring wires it: each edge reads its right operand in
// place or from the left tower's scratch, filled just before the edge; the root's pass writes the
// replicas the wiring gives it; every other tower pulls its parent's, by the copy agent or a copy. With
// 16-bit towers (checked steps only) the towers with children keep float partial sums of their own, the
// scratches are a 16-bit one for raw operands and a float one for partial sums, and the root's
// optimizer reads and writes a float master.
template <class Optim, class Layout>
class emulated_p2p_tree {
  using stored_type = typename Layout::value_type;
  static constexpr bool mixed = !std::is_same<stored_type, float>::value;
  using towers_type = towers_of<Optim, Layout>;
  using copy_buffer = typename towers_type::copy_buffer;
  using partial_buffer = std::conditional_t<mixed, typename towers_type::float_copy_buffer, typename towers_type::device_buffer>;
  using partial_scratch_buffer = typename towers_type::float_copy_buffer;

 public:
  explicit emulated_p2p_tree(towers_type& towers)
      : parts{every_variable(towers.variables().count())},
        towers_(towers),
        wiring_(towers.access()),
        raw_scratch_(towers.towers()),
        partial_scratch_(towers.towers()),
        average_(towers),
        master_(variables_if(mixed, towers.variables())),
        master_pointers_(gather_pointers<float>(std::vector<decltype(&master_)>{&master_})) {
    const std::size_t n = towers.towers();
    std::vector<partial_buffer*> partials(n, nullptr);
    for (std::size_t t = 0; t < n; ++t) {
      if (!wiring_.has_children[t]) continue;
      if constexpr (mixed) {
        own_partials_.push_back(std::make_unique<partial_buffer>(towers.variables(), nan_filled_memory{}));
        partials[t] = own_partials_.back().get();
      } else {
        partials[t] = &towers.gradients(t);
      }
    }
    for (std::size_t t = 0; t < n; ++t) {
      if (wiring_.needs_scratch[t] && (!mixed || wiring_.needs_raw_scratch[t]))
        raw_scratch_[t] = std::make_unique<copy_buffer>(towers.variables(), nan_filled_memory{});
      if (mixed && wiring_.needs_partial_scratch[t])
        partial_scratch_[t] = std::make_unique<partial_scratch_buffer>(towers.variables(), nan_filled_memory{});
      raw_.push_back(wiring_.raw_pointers<stored_type>(towers, t, raw_scratch_[t].get()));
      sums_.push_back(wiring_.partial_pointers<float>(partials, t, partial_scratch(t), towers.variables().count()));
    }
    raw_operand_copies_.resize(n);
    partial_operand_copies_.resize(n);
    pull_copies_.resize(n);
    for (std::size_t t = 1; t < n; ++t) {
      const std::size_t up = static_cast<std::size_t>(wiring_.parent[t]);
      raw_operand_copies_[t] = wiring_.raw_operand_copies<stored_type>(towers, t, raw_scratch_[up].get());
      partial_operand_copies_[t] = wiring_.partial_operand_copies<float>(towers, t, partials, partial_scratch(up));
      pull_copies_[t] = wiring_.pull_copies<stored_type>(towers, t);
    }
    root_targets_ = wiring_.root_target_pointers<stored_type>(towers);
  }

  step_parts parts;
  part_hook before_part;
  // Mixed precision: the master the root's optimizer reads and writes.
  void parameter_set(std::size_t v, const std::vector<float>& values) { std::copy(values.begin(), values.end(), master_.data(v)); }
  tensor_view<const float> master(std::size_t v) const { return master_.view(v); }

  // Each part's rounds, root edge and pulls over the part's chunks only.
  void average_and_apply(const std::vector<float>& weights, const constants_of<Optim>& c) {
    static_assert(!mixed, "mixed-precision steps are always checked ones");
    for (const std::vector<std::size_t>& part : parts) {
      if (before_part) before_part(part);
      const std::vector<tensor_chunk> chunks = part_chunks(towers_.chunks(), towers_.variables().count(), part);
      const auto rounds = run_tree(weights, nullptr, chunks);
      if (rounds.empty()) {
        run_agent_on_host(fused_apply_agent<Optim, float, 1>{const_table(raw_[0], count()), 1, {weights[0]}, root_apply(c)}, chunks);
      } else {
        run_agent_on_host(tree_root_agent<Optim, float>{operands(0), rounds.back().front(), root_apply(c)}, chunks);
      }
      broadcast(rounds, chunks);
    }
  }
  screen_partials screen_average(const std::vector<float>& weights) {
    screen_partials partials;
    const auto rounds = run_tree(weights, &partials.first_nonfinite, towers_.chunks());
    const pointer_table<float> averaged = table(average_.pointers, count());
    const std::vector<tensor_chunk> tiles = make_chunk_table(towers_.variables(), screen_tile_elements);
    if (rounds.empty()) {
      accumulating_source<tower_average_source<float, 0, weight_array<float>, stored_type>, float> source{
          {const_table(raw_[0], count()), 1, {}}, averaged, {}};
      source.inner.weights.value[0] = weights[0];
      screen_tiles(source, averaged, tiles, partials);
    } else {
      const edge_average_source<float, stored_type> edge{operands(0), rounds.back().front()};
      screen_tiles(accumulating_source<edge_average_source<float, stored_type>, float>{edge, averaged, {}}, averaged, tiles, partials);
    }
    return partials;
  }
  void apply_averaged(float scale, const constants_of<Optim>& c) {
    run_agent_on_host(fused_apply_agent<Optim, float, 1, stored_type>{const_table(average_.pointers, count()), 1, {scale}, root_apply(c)},
                      towers_.chunks());
    broadcast(canonical_tree_rounds<float>(static_cast<int>(towers_.towers()), std::vector<float>(towers_.towers(), 1.0f)),
              towers_.chunks());
  }

 private:
  int count() const { return towers_.count(); }
  const partial_scratch_buffer* partial_scratch(std::size_t t) const {
    if constexpr (mixed) return partial_scratch_[t].get();
    else return raw_scratch_[t].get();
  }
  tree_operands<float, stored_type> operands(std::size_t t) const { return {const_table(raw_[t], count()), table(sums_[t], count())}; }
  optimizer_apply<Optim, float, stored_type> root_apply(const constants_of<Optim>& c) {
    return towers_.apply(table(root_targets_, count()), wiring_.root_replicas(), c,
                         mixed ? table(master_pointers_, count()) : pointer_table<float>{});
  }

  // Every round but the last over `chunks`, then the root edge's operand (the reducer's run_rounds).
  std::vector<std::vector<tree_edge<float>>> run_tree(const std::vector<float>& weights, nonfinite_key* first_nonfinite,
                                                      const std::vector<tensor_chunk>& chunks) {
    const auto rounds = canonical_tree_rounds<float>(static_cast<int>(towers_.towers()), weights);
    const auto copy_operand = [&](int tower) {
      run_copies_on_host(raw_operand_copies_[static_cast<std::size_t>(tower)]);
      run_copies_on_host(partial_operand_copies_[static_cast<std::size_t>(tower)]);
    };
    for (std::size_t r = 0; r + 1 < rounds.size(); ++r) {
      for (const tree_edge<float>& edge : rounds[r]) {
        copy_operand(edge.right);
        run_agent_on_host(tree_round_agent<float, stored_type>{operands(static_cast<std::size_t>(edge.left)), edge, first_nonfinite}, chunks);
      }
    }
    if (!rounds.empty()) copy_operand(rounds.back().front().right);
    return rounds;
  }
  void broadcast(const std::vector<std::vector<tree_edge<float>>>& rounds, const std::vector<tensor_chunk>& chunks) {
    for (auto r = rounds.rbegin(); r != rounds.rend(); ++r) {
      for (const tree_edge<float>& edge : *r) {
        const std::size_t child = static_cast<std::size_t>(edge.right), parent = static_cast<std::size_t>(edge.left);
        if (wiring_.written_by_root[child]) continue;
        if (wiring_.pulls_directly[child]) {
          const auto one_role = [](auto& buffer) { return gather_pointers<stored_type>(std::vector<decltype(&buffer)>{&buffer}); };
          const std::vector<stored_type*> source = one_role(towers_.replica(parent)), target = one_role(towers_.replica(child));
          run_agent_on_host(copy_agent<stored_type>{const_table(source, count()), table(target, count()), 1}, chunks);
        } else {
          run_copies_on_host(pull_copies_[child]);
        }
      }
    }
  }

  towers_type& towers_;
  tree_wiring wiring_;
  std::vector<std::unique_ptr<copy_buffer>> raw_scratch_;
  std::vector<std::unique_ptr<partial_scratch_buffer>> partial_scratch_;  // mixed precision only
  std::vector<std::unique_ptr<partial_buffer>> own_partials_;             // mixed precision only
  std::vector<std::vector<stored_type*>> raw_;
  std::vector<std::vector<float*>> sums_;
  std::vector<copy_list<stored_type>> raw_operand_copies_, pull_copies_;
  std::vector<copy_list<float>> partial_operand_copies_;
  std::vector<stored_type*> root_targets_;
  whole_average<Optim, Layout> average_;
  typename towers_type::float_buffer master_;  // mixed precision only (else empty)
  std::vector<float*> master_pointers_;
};

// reduce::sharded for GPU towers in one process (reduce/sharded/gpu_towers.cuh): owner k holds slice k
// and only that slice's state and checked average (slice_owner); it reads and writes the towers it
// reaches in place and the others through compact copies of its slice (slice_copies). With 16-bit towers
// (mixed precision: checked steps only) each owner also keeps its fp32 master slice, and the towers'
// buffers and the copies hold 16-bit values.
template <class Optim, class Layout>
class emulated_sharded {
 public:
  using stored_type = typename Layout::value_type;
  static constexpr bool mixed = !std::is_same<stored_type, float>::value;

  emulated_sharded(towers_of<Optim, Layout>& towers, const typename Optim::hyper_parameters& h, bool checked)
      : parts{every_variable(towers.variables().count())}, towers_(towers) {
    std::vector<owner_slice> slices = cut_into_slices(towers.chunks(), towers.towers());
    for (std::size_t k = 0; k < slices.size(); ++k) {
      if (slices[k].empty()) continue;
      owners_.push_back(std::make_unique<owner>(
          owner{slice_owner<float, host_memory>(std::move(slices[k]), towers.chunks(), towers.variables().count(), Optim::state_slots(h),
                                                owner_keeps{checked || mixed, mixed}, host_memory{}),
                nullptr}));
      owners_.back()->copies = std::make_unique<slice_copies<stored_type, nan_filled_memory>>(owners_.back()->parts.slice(), towers, k,
                                                                                             nan_filled_memory{});
    }
  }

  // Mixed precision: every owner's part of the master (parameter_set), and the owners' parts of it
  // gathered (master_on_host).
  void parameter_set(std::size_t v, const std::vector<float>& values) {
    for (auto& o : owners_) set_master_slice(o->parts, v, values);
  }
  std::vector<float> master(std::size_t v) const {
    std::vector<float> whole(towers_.variables()[v].size, std::nanf(""));
    for (const auto& o : owners_) master_slice_into(o->parts, v, whole);
    return whole;
  }

  step_parts parts;
  part_hook before_part;
  // Each part: every owner's pass over the part's chunks in its slice.
  void average_and_apply(const std::vector<float>& weights, const constants_of<Optim>& c) {
    for (const std::vector<std::size_t>& part : parts) {
      if (before_part) before_part(part);
      for (auto& o : owners_) {
        run_copies_on_host(o->copies->gradients_in());
        run_copies_on_host(o->copies->master_in());
        fused_apply_agent<Optim, float, 0> agent{const_table(o->copies->gradients(), count()), static_cast<int>(towers_.towers()), {},
                                                 apply(*o, c)};
        std::copy(weights.begin(), weights.end(), agent.weights);
        run_agent_on_host(agent, part_chunks(o->parts.chunks(), towers_.variables().count(), part));
        run_copies_on_host(o->copies->replicas_out());
      }
    }
  }
  // Each owner screens its slice's average over its tiles; in owner order they are the whole table's.
  screen_partials screen_average(const std::vector<float>& weights) {
    screen_partials partials;
    for (auto& o : owners_) {
      run_copies_on_host(o->copies->gradients_in());
      const pointer_table<float> averaged = table(o->parts.average(), count());
      accumulating_source<tower_average_source<float, 0, weight_array<float>, stored_type>, float> source{
          {const_table(o->copies->gradients(), count()), static_cast<int>(towers_.towers()), {}}, averaged, {}};
      std::copy(weights.begin(), weights.end(), source.inner.weights.value);
      screen_tiles(source, averaged, make_chunk_table(o->parts.slice().ranges, screen_tile_elements), partials);
    }
    return partials;
  }
  void apply_averaged(float scale, const constants_of<Optim>& c) {
    for (auto& o : owners_) {
      if (!mixed) run_copies_on_host(o->copies->master_in());  // mixed: the owner's master slice is its own
      run_agent_on_host(fused_apply_agent<Optim, float, 1, stored_type>{const_table(o->parts.average(), count()), 1, {scale}, apply(*o, c)},
                        o->parts.chunks());
      run_copies_on_host(o->copies->replicas_out());
    }
  }

 private:
  struct owner {
    slice_owner<float, host_memory> parts;
    std::unique_ptr<slice_copies<stored_type, nan_filled_memory>> copies;
  };
  int count() const { return towers_.count(); }
  // The owner's optimizer: its slice of the state; it reads the master (role 0, or with mixed precision
  // its master slice) and writes every role (rounded, with mixed precision).
  optimizer_apply<Optim, float, stored_type> apply(const owner& o, const constants_of<Optim>& c) {
    return {table(o.copies->replicas(), count()), table(o.parts.state(), count()), static_cast<int>(towers_.towers()), o.parts.slots(),
            c, mixed ? table(o.parts.master(), count()) : pointer_table<float>{}};
  }

  towers_of<Optim, Layout>& towers_;
  std::vector<std::unique_ptr<owner>> owners_;
};

enum class backend { device0_unrolled, device0_runtime_towers, p2p_tree, sharded };

// body(reducer) with the emulated reducer of `kind` over `towers`.
template <class Optim, class Layout, class Body>
void with_backend(backend kind, towers_of<Optim, Layout>& towers, const typename Optim::hyper_parameters& h, bool checked, Body&& body) {
  if (kind == backend::p2p_tree) {
    emulated_p2p_tree<Optim, Layout> reducer(towers);
    body(reducer);
  } else if (kind == backend::sharded) {
    emulated_sharded<Optim, Layout> reducer(towers, h, checked);
    body(reducer);
  } else {
    emulated_device0<Optim, Layout> reducer(towers, kind == backend::device0_unrolled);
    body(reducer);
  }
}

template <class Towers>
void fill_gradients_with_nan(Towers& towers) {
  for (std::size_t t = 0; t < towers.towers(); ++t) {
    for (std::size_t v = 0; v < towers.variables().count(); ++v) {
      for (float& x : towers.gradients(t).view(v)) x = std::nanf("");
    }
  }
}

// `parts`: an unchecked step's parts (empty: the whole step as one). With parts, a part's gradients
// are there only from its start (NaN before: an earlier part that read them would spread NaN), and no
// earlier part may have written its variables' replicas (poisoned NaN).
template <class Optim, class Layout>
void check_emulated_backend(backend kind, topology links, const typename Optim::hyper_parameters& h, std::uint64_t salt,
                            const step_parts& parts = {}) {
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<float>>;
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {7}}};
  random_source random(salt);
  INFO(Optim::name << " " << Layout::name << ", backend " << static_cast<int>(kind) << ", topology " << static_cast<int>(links)
                   << ", seed " << random.seed());
  for (std::size_t n = 1; n <= 8; ++n) {
    INFO(n << " towers");
    const std::size_t examples = 3 * n - 1;  // uneven shards: distinct weights
    trainer reference(variables, {{"x", dtype::float32, {1}}}, n, h);
    towers_of<Optim, Layout> towers(variables, n, h, 256, links);
    std::vector<float> weights;
    for (const shard& s : plan_split(examples, n, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const std::vector<float> initial = random.normal(variables[v].size);
      reference.set_parameter(v, initial.data(), initial.size());
      for (std::size_t t = 0; t < n; ++t) std::copy(initial.begin(), initial.end(), towers.replica(t).data(v));
    }
    const std::vector<float> x(examples, 1.0f);
    batch b;
    b.add("x", x.data(), examples, {1});
    with_backend(kind, towers, h, false, [&](auto& reducer) {
      if (!parts.empty()) reducer.parts = parts;
      for (std::int64_t step = 1; step <= 10; ++step) {
        INFO("step " << step);
        const auto grads = draw_gradients(random, variables, n);
        step_and_load(reference, towers, b, grads);
        towers.poison_replicas();
        if (!parts.empty()) reducer.before_part = [&](const std::vector<std::size_t>& part) {
          for (std::size_t v : part) {
            for (std::size_t t = 0; t < n; ++t) {
              const auto replica = towers.replica(t).view(v);
              if (t > 0) REQUIRE(std::all_of(replica.begin(), replica.end(), [](float value) { return std::isnan(value); }));
              std::copy(grads[t][v].begin(), grads[t][v].end(), towers.gradients(t).data(v));
            }
          }
        };
        if (!parts.empty()) fill_gradients_with_nan(towers);
        reducer.average_and_apply(weights, Optim::template constants<float>(h, step));
        for (std::size_t t = 0; t < n; ++t) {
          for (std::size_t v = 0; v < variables.count(); ++v)
            REQUIRE(first_bitwise_difference(towers.replica(t).view(v), reference.parameter(v)) == -1);
        }
      }
    });
  }
}

// One checked step of an emulated reducer (screen_average, then apply_averaged) beside the host
// reference's, on fresh gradients of type G with a NaN every third step: a skipped step's first non-finite
// is the host's; else the norm is, and the apply runs with the clip (which the step exercises), the
// replicas but the root's poisoned before it. Returns whether the step was applied (`done` counts them).
template <class G, class Optim, class Trainer, class Towers, class Reducer>
bool emulated_checked_step(Trainer& reference, Towers& towers, Reducer& reducer, random_source& random, const batch& b,
                           const std::vector<float>& weights, int step, double max_norm, const typename Optim::hyper_parameters& h,
                           std::int64_t& done) {
  const std::size_t n = towers.towers();
  auto grads = draw_gradients<G>(random, towers.variables(), n);
  if (step % 3 == 0) grads[(n - 1) / 2][3][static_cast<std::size_t>(step) * 611] = quiet_nan<G>();
  const step_stats stats = step_and_load(reference, towers, b, grads);
  const screen_partials partials = reducer.screen_average(weights);
  if (stats.skipped) {
    check_same_nonfinite(partials, stats);
    return false;
  }
  ++done;
  REQUIRE(partials.first_nonfinite == no_nonfinite);
  CHECK(std::sqrt(partials.sum_of_squares()) == *stats.gradient_norm);
  CHECK(stats.clip_coefficient < 1.0);  // the clip is exercised
  towers.poison_replicas();
  reducer.apply_averaged(clip_coefficient(partials, max_norm), Optim::template constants<float>(h, done));
  return true;
}

}  // namespace

TEMPLATE_TEST_CASE("emulated device backends, wired as on the GPU (direct or copied), equal the host pipeline bitwise for "
                   "1..8 towers",
                   "[multi_tensor][canonical]", layout::flat<float>, layout::per_variable<float>) {
  for (backend kind : {backend::device0_unrolled, backend::device0_runtime_towers, backend::p2p_tree, backend::sharded}) {
    for (topology links : {topology::one_device, topology::one_device_no_direct_access, topology::peer_pairs}) {
      for_each_optimizer(61, [&](auto optimizer, const auto& h, std::uint64_t salt) {
        check_emulated_backend<typename decltype(optimizer)::type, TestType>(kind, links, h, salt);
      });
    }
  }
}

// Gradient buckets (reduce/overlapped_reduction.hpp) on one device, where the reducers take them during
// the towers: each part's launches over its variables' chunk runs only — p2p_tree's rounds, root edge
// and pulls; each sharded owner's pass over the part's chunks in its slice — step after step give the
// host pipeline's bits. Buckets of one variable in backward order with nothing left after the towers;
// buckets of variables apart in the table (a part of several runs); a bucket of one variable's chunks
// cut between owners.
TEMPLATE_TEST_CASE("emulated device backends reduce gradient buckets part by part, bitwise the host pipeline",
                   "[multi_tensor][canonical][overlap]", layout::flat<float>, layout::per_variable<float>) {
  const std::vector<step_parts> plans{{{3}, {2}, {1}, {0}, {}}, {{1, 3}, {0}, {2}}, {{0}, {3, 2, 1}}};
  for (backend kind : {backend::device0_runtime_towers, backend::p2p_tree, backend::sharded}) {
    for (const step_parts& parts : plans) {
      for_each_optimizer(81, [&](auto optimizer, const auto& h, std::uint64_t salt) {
        check_emulated_backend<typename decltype(optimizer)::type, TestType>(kind, topology::one_device, h, salt, parts);
      });
    }
  }
}

TEMPLATE_TEST_CASE("emulated checked steps of the device backends equal the host's: norm, clip, first non-finite",
                   "[multi_tensor][checked]", layout::flat<float>, layout::per_variable<float>) {
  using trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;
  // "tail" spans three screen tiles, the last one partial and not a whole number of groups.
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {4101}}};
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  random_source random(70);
  for (backend kind : {backend::device0_runtime_towers, backend::p2p_tree, backend::sharded}) {
    for (topology links : {topology::one_device, topology::one_device_no_direct_access, topology::peer_pairs}) {
      for (std::size_t n = 1; n <= 8; ++n) {
        INFO("backend " << static_cast<int>(kind) << ", topology " << static_cast<int>(links) << ", " << n << " towers, seed "
                        << random.seed());
        const std::size_t examples = 3 * n - 1;
        pipeline_options options;
        options.max_grad_norm = 3.0;
        trainer reference(variables, {{"x", dtype::float32, {1}}}, n, h, options);
        // Chunks of one screen tile: the owners' slices start on tiles (plan/owner_slices.hpp).
        towers_of<optim::adam, TestType> towers(variables, n, h, screen_tile_elements, links);
        std::vector<float> weights;
        for (const shard& s : plan_split(examples, n, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
        const std::vector<float> x(examples, 1.0f);
        batch b;
        b.add("x", x.data(), examples, {1});
        std::int64_t done = 0;
        with_backend(kind, towers, h, true, [&](auto& reducer) {
          for (int step = 1; step <= 6; ++step) {
            INFO("step " << step);
            if (!emulated_checked_step<float, optim::adam>(reference, towers, reducer, random, b, weights, step, options.max_grad_norm, h,
                                                           done))
              continue;
            for (std::size_t t = 0; t < n; ++t) {
              for (std::size_t v = 0; v < variables.count(); ++v)
                REQUIRE(first_bitwise_difference(towers.replica(t).view(v), reference.parameter(v)) == -1);
            }
          }
        });
      }
    }
  }
}

namespace {

// A device reducer with 16-bit towers (mixed precision, checked steps only), emulated: the fp32 master
// bitwise the host mixed pipeline's (pipeline<exec::host, reduce::host, Optim, layout::flat<Half>>, an
// independent implementation), every replica's 16-bit patterns its towers' rounded copy, the norm and
// the first non-finite the host's; replicas are poisoned before each apply. Emulated: emulated_sharded
// (one process; each owner keeps its slice of the master) or emulated_p2p_tree (float partial sums of
// the towers with children beside their 16-bit gradients, copied raw or as partial sums).
// An emulated reducer for checked steps over `towers`.
template <class Emulated, class Towers, class Hyper>
Emulated make_emulated(Towers& towers, const Hyper& h) {
  if constexpr (std::is_constructible<Emulated, Towers&, const Hyper&, bool>::value) return Emulated(towers, h, true);
  else return Emulated(towers);
}

template <template <class, class> class Emulated, class Optim, class Layout>
void check_emulated_mixed(topology links, const typename Optim::hyper_parameters& h, std::uint64_t salt) {
  using half_type = typename Layout::value_type;
  using trainer = pipeline<exec::host, reduce::host, Optim, layout::flat<half_type>>;
  // "tail" spans three screen tiles, the last one partial and not a whole number of groups.
  const variable_set variables{{"w", {37, 29}}, {"b", {29}}, {"s", {}}, {"tail", {4101}}};
  random_source random(salt);
  for (std::size_t n = 1; n <= 8; ++n) {
    INFO(Optim::name << " " << Layout::name << ", topology " << static_cast<int>(links) << ", " << n << " towers, seed " << random.seed());
    const std::size_t examples = 3 * n - 1;
    pipeline_options options;
    options.max_grad_norm = 3.0;
    trainer reference(variables, {{"x", dtype::float32, {1}}}, n, h, options);
    towers_of<Optim, Layout> towers(variables, n, h, screen_tile_elements, links);
    Emulated<Optim, Layout> reducer = make_emulated<Emulated<Optim, Layout>>(towers, h);
    const std::vector<float> weights = tower_weights(examples, n);
    for (std::size_t v = 0; v < variables.count(); ++v) {
      const std::vector<float> initial = random.normal(variables[v].size);
      reference.set_parameter(v, initial.data(), initial.size());
      reducer.parameter_set(v, initial);
      for (std::size_t t = 0; t < n; ++t) set_replica(towers, t, v, initial);
    }
    const std::vector<float> x(examples, 1.0f);
    batch b;
    b.add("x", x.data(), examples, {1});
    std::int64_t done = 0;
    for (int step = 1; step <= 6; ++step) {
      INFO("step " << step);
      if (!emulated_checked_step<half_type, Optim>(reference, towers, reducer, random, b, weights, step, options.max_grad_norm, h, done))
        continue;
      for (std::size_t v = 0; v < variables.count(); ++v) {
        REQUIRE(first_bitwise_difference(reducer.master(v), reference.parameter(v)) == -1);
        for (std::size_t t = 0; t < n; ++t)
          REQUIRE(first_bitwise_difference(towers.replica(t).view(v), reference.execution_space().shared_parameters().view(v)) == -1);
      }
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("emulated sharded with bf16 and fp16 towers (direct or copied) equals the host's mixed-precision pipeline "
                   "bitwise for 1..8 towers",
                   "[multi_tensor][checked][mixed]", layout::flat<bfloat16>, layout::per_variable<float16>, layout::flat<float16>,
                   layout::per_variable<bfloat16>) {
  for (topology links : {topology::one_device, topology::one_device_no_direct_access, topology::peer_pairs}) {
    for_each_optimizer(91, [&](auto optimizer, const auto& h, std::uint64_t salt) {
      check_emulated_mixed<emulated_sharded, typename decltype(optimizer)::type, TestType>(links, h, salt);
    });
  }
}

TEMPLATE_TEST_CASE("emulated p2p_tree with bf16 and fp16 towers keeps float partial sums (direct or copied): bitwise the host's "
                   "mixed-precision pipeline for 1..8 towers",
                   "[multi_tensor][checked][mixed]", layout::flat<bfloat16>, layout::per_variable<float16>) {
  for (topology links : {topology::one_device, topology::one_device_no_direct_access, topology::peer_pairs}) {
    for_each_optimizer(95, [&](auto optimizer, const auto& h, std::uint64_t salt) {
      check_emulated_mixed<emulated_p2p_tree, typename decltype(optimizer)::type, TestType>(links, h, salt);
    });
  }
}
