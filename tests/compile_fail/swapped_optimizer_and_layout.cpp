// expect: the third parameter must be an optimizer
#include <towerpipe/towerpipe.hpp>

using namespace towerpipe;
using trainer = pipeline<exec::host, reduce::host, layout::flat<float>, optim::adam>;
trainer* instantiate = nullptr;
std::size_t towers() { return instantiate->towers(); }
