// expect: the first parameter must be an execution space
#include <towerpipe/towerpipe.hpp>

using namespace towerpipe;
using trainer = pipeline<reduce::host, exec::host, optim::sgd, layout::flat<float>>;
trainer* instantiate = nullptr;
std::size_t towers() { return instantiate->towers(); }
