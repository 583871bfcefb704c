// comm/nccl.cuh and comm/nccl_over_mpi.cuh compiled where the build itself has no NCCL (the ci preset) but
// the toolkit ships nccl.h: ctest cuda.nccl_headers_compile keeps the NCCL code compiled in CI.
#include <towerpipe/comm/nccl_over_mpi.cuh>
#include <towerpipe/comm/nccl.cuh>  // include guard

int main() { return towerpipe::nccl_process_group_over_mpi != nullptr ? 0 : 1; }
