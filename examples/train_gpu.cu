// The training program's GPU towers (examples/train.cpp has the rest; train_gpu.cuh the towers'
// program and backends): the fp32 towers' trainings. 16-bit GPU towers build in train_gpu_mixed.cu.
#include "train_gpu.cuh"
#if defined(TOWERPIPE_EXAMPLES_NCCL)
#include <towerpipe/comm/nccl_over_mpi.cuh>
#endif

namespace towerpipe_examples::training {

int visible_gpus() { return towerpipe::detail::cuda_device_count(); }
#if defined(TOWERPIPE_EXAMPLES_NCCL)
std::shared_ptr<process_group> nccl_group(MPI_Comm comm, int device) { return nccl_process_group_over_mpi(comm, device); }
#endif

TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_on_gpus, layout::flat<float>)
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_on_gpus, layout::per_variable<float>)

}  // namespace towerpipe_examples::training
