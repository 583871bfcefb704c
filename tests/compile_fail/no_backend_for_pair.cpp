// expect: no reduction backend for this execution space. Valid pairs: (exec::host, reduce::host)
#include <towerpipe/towerpipe.hpp>

using namespace towerpipe;

// A reduction policy that no execution space supports.
struct unsupported_reduce {
  using policy_kind = detail::reduce_policy_kind;
};
using trainer = pipeline<exec::host, unsupported_reduce, optim::sgd, layout::flat<float>>;
trainer* instantiate = nullptr;
std::size_t towers() { return instantiate->towers(); }
