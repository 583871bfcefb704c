#pragma once
// Host stand-ins for exec::cuda's towers, for running the device reducers' own wiring
// (wiring/copy_wiring.hpp, wiring/owner_wiring.hpp, wiring/exchange_buffers.hpp) on the host
// (programs/host_dispatch.hpp), and the reference the emulated steps are compared with.
#include <towerpipe/kernels/agents.hpp>
#include <towerpipe/wiring/copy_wiring.hpp>
#include <towerpipe/programs/host_dispatch.hpp>
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "test_support.hpp"

namespace towerpipe_tests {

using namespace towerpipe;
using namespace towerpipe::detail;

// A quiet NaN of T: float, double, or a 16-bit stored type (bfloat16, float16: rounded from float's).
template <class T>
T quiet_nan() {
  if constexpr (std::is_floating_point<T>::value) return std::numeric_limits<T>::quiet_NaN();
  else return narrow<T>(std::numeric_limits<float>::quiet_NaN());
}

// Host memory that starts as NaN: the reducers' copies are allocated from it, so that a pass reading a
// copy no copy filled shows.
struct nan_filled_memory : host_memory {
  template <class T>
  owner<T> allocate(std::size_t count, std::size_t alignment) const {
    owner<T> result = host_memory::allocate<T>(count, alignment);
    std::fill_n(result.get(), count, quiet_nan<T>());
    return result;
  }
};

// The towers' devices and links the copying paths are checked under (wiring/copy_wiring.hpp): all on one
// device; one device with pipeline_options::direct_device_access off (how the GPU tests run the copying
// paths on one GPU); one device per tower, peer access only within pairs (0, 1), (2, 3), ...
enum class topology { one_device, one_device_no_direct_access, peer_pairs };

inline tower_access access_for(topology links, std::size_t towers) {
  std::vector<int> devices(towers, 0);
  std::set<std::pair<int, int>> peers;
  if (links == topology::peer_pairs) {
    for (std::size_t t = 0; t < towers; ++t) devices[t] = static_cast<int>(t);
    for (int t = 0; t + 1 < static_cast<int>(towers); t += 2) peers.insert({{t, t + 1}, {t + 1, t}});
  }
  return tower_access(devices, peers, links != topology::one_device_no_direct_access);
}

// exec::cuda's towers as the reducers' wiring sees them (towers(), device(t), gradients(t), replica(t),
// access()), in host memory, with the optimizer state of a reducer that keeps it whole on tower 0's
// device (device0, p2p_tree). 16-bit layouts (mixed precision): 16-bit gradients and replicas, the
// state in float, and apply() takes the float master's table.
template <class Optim, class Layout>
class emulated_towers {
 public:
  using stored_type = typename Layout::value_type;
  using master_type = master_type_t<stored_type>;
  using device_buffer = typename Layout::template buffer<host_memory>;
  using copy_buffer = typename Layout::template buffer<nan_filled_memory>;
  using float_buffer = typename Layout::template buffer<host_memory, float>;
  using float_copy_buffer = typename Layout::template buffer<nan_filled_memory, float>;

  emulated_towers(const variable_set& variables, std::size_t towers, const typename Optim::hyper_parameters& h,
                  std::size_t chunk_elements = 256, topology links = topology::one_device)
      : variables_(variables), access_(access_for(links, towers)), chunks_(make_chunk_table(variables, chunk_elements)) {
    for (std::size_t t = 0; t < towers; ++t) {
      gradients_.emplace_back(variables);
      replicas_.emplace_back(variables);
    }
    for (int s = 0; s < Optim::state_slots(h); ++s) state_.emplace_back(variables);
    std::vector<float_buffer*> slots;
    for (float_buffer& slot : state_) slots.push_back(&slot);
    state_pointers_ = gather_pointers<float>(slots);
  }

  std::size_t towers() const { return gradients_.size(); }
  int device(std::size_t t) const { return access_.device(t); }
  const tower_access& access() const { return access_; }
  device_buffer& gradients(std::size_t t) { return gradients_[t]; }
  device_buffer& replica(std::size_t t) { return replicas_[t]; }
  const variable_set& variables() const { return variables_; }
  int count() const { return static_cast<int>(variables_.count()); }
  const std::vector<tensor_chunk>& chunks() const { return chunks_; }

  // The optimizer with the whole state, writing the first replica_count roles of `replicas`; `master`:
  // with 16-bit towers, the float master it reads and writes (role 0).
  optimizer_apply<Optim, float, stored_type> apply(pointer_table<stored_type> replicas, int replica_count,
                                                   const typename Optim::template step_constants<float>& c,
                                                   pointer_table<float> master = {}) {
    return {replicas, {state_pointers_.data(), count()}, replica_count, static_cast<int>(state_.size()), c, master};
  }

  // Poisons every replica but the root's, so that an element a pass forgets to write shows.
  void poison_replicas() {
    for (std::size_t t = 1; t < replicas_.size(); ++t) {
      for (std::size_t v = 0; v < variables_.count(); ++v) {
        for (stored_type& x : replicas_[t].view(v)) x = quiet_nan<stored_type>();
      }
    }
  }

 private:
  const variable_set& variables_;
  tower_access access_;
  std::vector<tensor_chunk> chunks_;
  std::vector<device_buffer> gradients_, replicas_;
  std::vector<float_buffer> state_;
  std::vector<float*> state_pointers_;
};

// The towers' weights for `examples` split over `towers` (split_policy::weighted, as the pipeline's).
inline std::vector<float> tower_weights(std::size_t examples, std::size_t towers) {
  std::vector<float> weights;
  for (const shard& s : plan_split(examples, towers, split_policy::weighted)) weights.push_back(static_cast<float>(s.weight));
  return weights;
}

// Tower t's replica of variable v set to `values`, rounded to the towers' type (as set_parameter does).
template <class Towers>
void set_replica(Towers& towers, std::size_t t, std::size_t v, const std::vector<float>& values) {
  using stored_type = typename Towers::stored_type;
  std::transform(values.begin(), values.end(), towers.replica(t).data(v), [](float x) { return narrow<stored_type>(x); });
}

// The pipeline's set_parameter as a reducer hears it (parameter_set) where an owner keeps a master slice
// (wiring/owner_wiring.hpp slice_owner: across processes, or with mixed precision): the owner's part of
// variable v's values; and that part back into `whole` (the reducer's master_on_host).
template <class Owner>
void set_master_slice(Owner& owner, std::size_t v, const std::vector<float>& values) {
  owner.slice().for_each_stored_range_of(v, [&](const element_range& r, std::size_t offset) {
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(r.begin), values.begin() + static_cast<std::ptrdiff_t>(r.end),
              owner.master_storage() + offset);
  });
}
template <class Owner>
void master_slice_into(const Owner& owner, std::size_t v, std::vector<float>& whole) {
  owner.slice().for_each_stored_range_of(v, [&](const element_range& r, std::size_t offset) {
    std::copy_n(owner.master_storage() + offset, r.end - r.begin, whole.begin() + static_cast<std::ptrdiff_t>(r.begin));
  });
}

// A pointer table over entries the wiring built ([role][variable]), as the kernels get it uploaded.
template <class T>
pointer_table<T> table(const std::vector<T*>& pointers, int variables) {
  return {pointers.data(), variables};
}
template <class T>
pointer_table<const T> const_table(const std::vector<T*>& pointers, int variables) {
  return {pointers.data(), variables};
}

inline optim::sgd::hyper_parameters momentum_hyper_parameters() {
  optim::sgd::hyper_parameters h;
  h.lr = 0.05;
  h.momentum = 0.9;
  h.weight_decay = 0.01;
  return h;
}
inline optim::adam::hyper_parameters adam_hyper_parameters() {
  optim::adam::hyper_parameters h;
  h.lr = 0.01;
  h.weight_decay = 0.1;
  return h;
}

template <class T>
struct type_tag {
  using type = T;
};
// check(type_tag<Optim>, hyper-parameters, seed salt) for SGD with momentum, Adam and AdamW.
template <class Check>
void for_each_optimizer(std::uint64_t salt, Check&& check) {
  check(type_tag<optim::sgd>{}, momentum_hyper_parameters(), salt);
  check(type_tag<optim::adam>{}, adam_hyper_parameters(), salt + 1);
  check(type_tag<optim::adamw>{}, optim::adamw::hyper_parameters{}, salt + 2);
}

// One step's random gradients: [tower][variable], of type G (16-bit: rounded from the same draws).
template <class G = float>
std::vector<std::vector<std::vector<G>>> draw_gradients(random_source& random, const variable_set& variables, std::size_t towers) {
  std::vector<std::vector<std::vector<G>>> grads(towers);
  for (auto& tower : grads) {
    for (const variable& v : variables) {
      std::vector<G> values;
      for (float value : random.wide(v.size)) values.push_back(narrow<G>(value));
      tower.push_back(values);
    }
  }
  return grads;
}

// A skipped step's report: the screen found what the host pipeline reported.
inline void check_same_nonfinite(const screen_partials& partials, const step_stats& stats) {
  REQUIRE(partials.first_nonfinite != no_nonfinite);
  const nonfinite_place place = decode_nonfinite_key(partials.first_nonfinite);
  CHECK(place.variable == stats.nonfinite->variable);
  CHECK(place.element == stats.nonfinite->element);
  CHECK(place.tower == *stats.nonfinite->tower);
}

// One step of the host reference on `grads` ([tower][variable]); step_and_load: and the same gradients
// into the emulated towers' buffers.
template <class Trainer, class G>
step_stats reference_step(Trainer& reference, const batch& b, const std::vector<std::vector<std::vector<G>>>& grads) {
  return reference.step(b, [&](typename Trainer::tower_context& tower) {
    for (std::size_t v = 0; v < grads[tower.tower()].size(); ++v)
      tower.write_gradient(v, grads[tower.tower()][v].data(), grads[tower.tower()][v].size());
    return 0.0;
  });
}
template <class Trainer, class Towers, class G>
step_stats step_and_load(Trainer& reference, Towers& towers, const batch& b, const std::vector<std::vector<std::vector<G>>>& grads) {
  const step_stats stats = reference_step(reference, b, grads);
  for (std::size_t t = 0; t < grads.size(); ++t) {
    for (std::size_t v = 0; v < grads[t].size(); ++v) std::copy(grads[t][v].begin(), grads[t][v].end(), towers.gradients(t).data(v));
  }
  return stats;
}

// A checked step's screen (kernels/screen.hpp) on the host over `tiles`, as the screen kernel's warps
// compute it, appended to `partials`.
template <class Source>
void screen_tiles(const Source& source, const pointer_table<float>& averaged, const std::vector<tensor_chunk>& tiles,
                  screen_partials& partials) {
  for (const tensor_chunk& tile : tiles) {
    const screen_lane_result r = screen_tile_as_a_warp(source, averaged, tile);
    partials.tile_sums.push_back(r.sum_of_squares);
    partials.first_nonfinite = std::min(partials.first_nonfinite, r.first_nonfinite);
  }
}

inline float clip_coefficient(const screen_partials& partials, double max_norm) {
  return static_cast<float>(std::min(1.0, max_norm / (std::sqrt(partials.sum_of_squares()) + 1e-6)));
}

}  // namespace towerpipe_tests
