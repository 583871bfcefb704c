// Entry point of the GPU tests: with no usable CUDA device they exit with 77, which CTest's
// SKIP_RETURN_CODE reports as skipped (never as passed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess || devices == 0) {
    std::printf("GPU tests skipped: %s\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
