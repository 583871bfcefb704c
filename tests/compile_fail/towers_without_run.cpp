// expect: the execution space's towers lack 'run(fn, step)'
#include <towerpipe/towerpipe.hpp>

using namespace towerpipe;

// An execution space whose towers implement everything of exec/towers_contract.hpp but run().
struct towers_without_run {
  using value_type = float;
  using context = int;
  towers_without_run(const variable_set&, std::size_t, const pipeline_options&) {}
  std::size_t towers() const { return 1; }
  void stage(const batch&, const std::vector<shard>&) {}
  std::size_t staged() const { return 0; }
  const std::vector<shard>& next_shards() const { return shards; }
  void discard_next() {}
  tensor_view<const float> parameter_on_host(std::size_t) { return {}; }
  void set_parameter(std::size_t, const float*) {}
  std::vector<shard> shards;
};
struct incomplete_exec {
  using policy_kind = detail::exec_policy_kind;
  template <class Layout>
  using towers = towers_without_run;
};
namespace towerpipe {
template <class Optim, class Layout>
struct reducer_for<incomplete_exec, reduce::host, Optim, Layout> {
  using type = detail::host_reducer<Optim, Layout>;
};
}  // namespace towerpipe
using trainer = pipeline<incomplete_exec, reduce::host, optim::sgd, layout::flat<float>>;
trainer* instantiate = nullptr;
std::size_t towers() { return instantiate->towers(); }
