// expect: a tower function for exec::host must return its shard's mean loss
#include <towerpipe/towerpipe.hpp>

using namespace towerpipe;
using trainer = pipeline<exec::host, reduce::host, optim::sgd, layout::flat<float>>;

void step(trainer& p, const batch& b) {
  p.step(b, [](trainer::tower_context& tower) { tower.gradient(0)[0] = 1.0f; });
}
