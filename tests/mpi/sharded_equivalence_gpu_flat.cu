// sharded_equivalence_gpu.cu's mode "equal" for layout::flat<float>, a unit of its own (sharded_equivalence.hpp).
#define TOWERPIPE_TEST_GPU_TOWERS
#include "sharded_equivalence.hpp"

template void towerpipe_mpi_test::every_optimizer<towerpipe::layout::flat<float>>(std::size_t, const std::shared_ptr<towerpipe::process_group>&);
