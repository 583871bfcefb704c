// The training program's GPU towers (examples/train.cpp has the rest; train_gpu.cuh the towers'
// program and backends): the visible GPUs and the NCCL group. The trainings, one per optimizer and
// layout, are translation units examples/CMakeLists.txt generates from train_gpu_unit.cu.in.
#include "train_gpu.cuh"
#if defined(TOWERPIPE_EXAMPLES_NCCL)
#include <towerpipe/comm/nccl_over_mpi.cuh>
#endif

namespace towerpipe_examples::training {

int visible_gpus() { return towerpipe::detail::cuda_device_count(); }
#if defined(TOWERPIPE_EXAMPLES_NCCL)
std::shared_ptr<process_group> nccl_group(MPI_Comm comm, int device) { return nccl_process_group_over_mpi(comm, device); }
#endif

}  // namespace towerpipe_examples::training
