// sharded_equivalence_gpu.cu's mode "equal" for layout::flat<bfloat16>, a unit of its own (sharded_equivalence.hpp).
#define TOWERPIPE_TEST_GPU_TOWERS
#include "sharded_equivalence.hpp"

template void towerpipe_mpi_test::every_optimizer<towerpipe::layout::flat<towerpipe::bfloat16>>(std::size_t, const std::shared_ptr<towerpipe::process_group>&);
