#pragma once
// one_of<Reducers...> — a reducer that is one of several, chosen at run time: reduce::automatic's chosen
// candidate (reduce/choice/automatic.hpp), reduce::sharded on device towers within a process or across
// processes (reduce/sharded/device_towers.hpp). The one place that forwards the reducer contract
// (reduce/common/contract.hpp): a new contract member is an edit here, and nowhere else.

#include <cstddef>
#include <memory>
#include <variant>
#include <vector>

#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/reduce/common/contract.hpp"

namespace towerpipe {
namespace detail {

template <class... Reducers>
class one_of {
  using first = std::tuple_element_t<0, std::tuple<Reducers...>>;

 public:
  using towers_type = typename first::towers_type;
  using master_type = typename first::master_type;
  static constexpr reducer_capabilities capabilities{(Reducers::capabilities.spans_processes || ...),
                                                     (Reducers::capabilities.spreads_state || ...), false};

  one_of() = default;
  // The I-th of Reducers, built from `setup`.
  template <std::size_t I, class Setup>
  static one_of make(const Setup& setup) {
    one_of r;
    r.reducer_.template emplace<I>(std::make_unique<std::tuple_element_t<I, std::tuple<Reducers...>>>(setup));
    return r;
  }

  // f(reducer&) on the one it is.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit([&](auto& r) -> decltype(auto) { return f(*r); }, reducer_);
  }

  backend_choice choice() const { return visit([](auto& r) { return r.choice(); }); }
  bool buckets_during_towers() const { return visit([](auto& r) { return r.buckets_during_towers(); }); }
  template <class Work>
  void begin_step(towers_type& towers, const Work& work) {
    visit([&](auto& r) { r.begin_step(towers, work); });
  }
  void reduce_part(towers_type& towers, const step_part& part) {
    visit([&](auto& r) { r.reduce_part(towers, part); });
  }
  screen_partials finish(towers_type& towers, stage_seconds& stages) {
    return visit([&](auto& r) { return r.finish(towers, stages); });
  }
  void apply(towers_type& towers, master_type scale, stage_seconds& stages) {
    visit([&](auto& r) { r.apply(towers, scale, stages); });
  }
  void abandon(towers_type& towers) {
    visit([&](auto& r) { r.abandon(towers); });
  }

  std::size_t state_slots() const { return visit([](auto& r) { return r.state_slots(); }); }
  tensor_view<const master_type> state(std::size_t slot, std::size_t index) {
    return visit([&](auto& r) { return tensor_view<const master_type>(r.state(slot, index)); });
  }
  void set_state(std::size_t slot, std::size_t index, const master_type* values) {
    visit([&](auto& r) { r.set_state(slot, index, values); });
  }
  tensor_view<const master_type> master(std::size_t index) {
    return visit([&](auto& r) { return tensor_view<const master_type>(r.master(index)); });
  }
  void set_master(std::size_t index, const master_type* values) {
    visit([&](auto& r) { r.set_master(index, values); });
  }
  std::vector<std::size_t> state_bytes_per_tower() const { return visit([](auto& r) { return r.state_bytes_per_tower(); }); }

 private:
  std::variant<std::unique_ptr<Reducers>...> reducer_;
};

}  // namespace detail
}  // namespace towerpipe
