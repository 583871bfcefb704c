// towerpipe_gpu_benchmark's rows for reduce::host (gpu_step_benchmark.cuh), a unit of their own.
#include "gpu_step_benchmark.cuh"

template struct towerpipe_gpu_bench::backend_rows<towerpipe::reduce::host>;
