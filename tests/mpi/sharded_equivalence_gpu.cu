// tests/mpi/sharded_equivalence.cpp with the sharded pipeline's towers on GPUs (see its top).
#define TOWERPIPE_TEST_GPU_TOWERS
#include "sharded_equivalence.cpp"
