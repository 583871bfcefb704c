// Where no CUDA device is visible (as in CI), building a GPU pipeline must fail with a clear
// towerpipe::error, not crash or hang. Where a device is visible this check does not apply: exit 77,
// which CTest reports as skipped.
#include <towerpipe/cuda.cuh>

#include <cstdio>
#include <string>

int main() {
  using namespace towerpipe;
  if (detail::cuda_device_count() > 0) {
    std::puts("a CUDA device is visible: the no-device check is skipped");
    return 77;
  }
  try {
    pipeline<exec::cuda, reduce::device0, optim::adam, layout::flat<float>> p(
        variable_set{{"w", {4}}}, {{"x", dtype::float32, {1}}}, 2, optim::adam::hyper_parameters{});
  } catch (const towerpipe::error& e) {
    const std::string expected = "exec::cuda needs a CUDA device, and none is visible";
    if (std::string(e.what()).find(expected) == std::string::npos) {
      std::printf("FAILED: unexpected message: %s\n", e.what());
      return 1;
    }
    std::printf("passed: %s\n", e.what());
    return 0;
  }
  std::puts("FAILED: a GPU pipeline was built without any CUDA device");
  return 1;
}
