// libFuzzer harness for the checkpoint reader: any input is either loaded completely or rejected with a
// towerpipe::error that leaves the pipeline exactly as it was. Anything else — another exception type,
// a crash, a sanitizer report, a rejected input that changed a bit — aborts the run.
//
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -I include tests/fuzz/checkpoint_fuzz.cpp
//   ./a.out -max_total_time=600 tests/fuzz/corpus        (tests/fuzz/run.cmake does this for ctest)
//
// With TOWERPIPE_FUZZ_WRITE_SEEDS=DIR set, the first call writes valid checkpoints of the harness's
// pipeline (fresh, after training steps, and with user data) into DIR: how tests/fuzz/corpus was made
// (fresh.ckpt and three_steps.ckpt are format version 2, version1_fresh.ckpt version 1; the *_v3 seeds
// version 3, with the user_data line). An accepted input's user data must be exactly its declared size.
#include <towerpipe/towerpipe.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace towerpipe;
using trainer = pipeline<exec::host, reduce::host, optim::adam, layout::flat<float>>;

namespace {

trainer make_trainer() {
  pipeline_options options;
  options.host_threads = 1;
  return trainer({{"w", {5, 3}}, {"b", {3}}}, {{"x", dtype::float32, {1}}}, 2, {}, options);
}

// Every bit of the pipeline's parameters, optimizer state and step count, in one string.
std::string snapshot(const trainer& p) {
  std::string bits;
  const std::int64_t steps = p.steps_done();
  bits.append(reinterpret_cast<const char*>(&steps), sizeof steps);
  const auto add = [&](tensor_view<const float> view) {
    bits.append(reinterpret_cast<const char*>(view.data()), view.size() * sizeof(float));
  };
  for (std::size_t v = 0; v < p.variables().count(); ++v) {
    add(p.parameter(v));
    for (std::size_t slot = 0; slot < p.optimizer_state_slots(); ++slot) add(p.optimizer_state(slot, v));
  }
  return bits;
}

void train(trainer& p, int steps) {
  const std::vector<float> x(4, 1.0f);
  for (int s = 0; s < steps; ++s) {
    batch b;
    b.add("x", x.data(), 4, {1});
    p.step(b, [&](trainer::tower_context& tower) {
      for (std::size_t v = 0; v < 2; ++v) {
        auto g = tower.gradient(v);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.25f * float(i + 1) - float(tower.tower() + s);
      }
      return 0.0;
    });
  }
}

void write_seeds(const char* directory) {
  trainer p = make_trainer();
  save_checkpoint(p, std::string(directory) + "/fresh_v3.ckpt");
  train(p, 3);
  save_checkpoint(p, std::string(directory) + "/three_steps_user_data_v3.ckpt", std::string("epoch 1\0batch 7", 15));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static bool seeded = false;
  if (!seeded) {
    seeded = true;
    if (const char* directory = std::getenv("TOWERPIPE_FUZZ_WRITE_SEEDS")) write_seeds(directory);
  }
  static trainer p = make_trainer();
  static const std::string original = [] {
    train(p, 2);
    return detail::checkpoint_bytes(p);
  }();
  static const std::string before = snapshot(p);
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const std::string user_data = detail::load_checkpoint_bytes(p, bytes, "fuzz input");
    if (user_data.size() > max_checkpoint_user_data || user_data.size() >= bytes.size()) {
      std::fprintf(stderr, "an accepted checkpoint returned %zu bytes of user data\n", user_data.size());
      std::abort();
    }
  } catch (const error&) {
    if (snapshot(p) != before) {
      std::fprintf(stderr, "a rejected checkpoint changed the pipeline\n");
      std::abort();
    }
    return 0;
  }
  // Accepted: put the pipeline back for the next input.
  detail::load_checkpoint_bytes(p, original, "the harness's own checkpoint");
  return 0;
}
