# A build configured without NCCL (TOWERPIPE_ENABLE_NCCL=OFF, or NCCL not found) builds nothing of NCCL:
# no header unit of comm/nccl*.cuh, no object that defines TOWERPIPE_TEST_NCCL or TOWERPIPE_EXAMPLES_NCCL,
# and nothing linked against libnccl. (The compile side is guarded too: such a build's CUDA targets find
# cmake/no_nccl/nccl.h first, which stops the compile.)
# Run as: cmake -DBUILD_FILE=<build>/build.ninja -P nccl_left_out.cmake
file(READ ${BUILD_FILE} build)
foreach(pattern "towerpipe_comm_nccl[a-z_]*_cuh" "TOWERPIPE_TEST_NCCL" "TOWERPIPE_EXAMPLES_NCCL" "libnccl")
  if(build MATCHES "${pattern}")
    message(FATAL_ERROR "a build without NCCL builds '${CMAKE_MATCH_0}' (${BUILD_FILE})")
  endif()
endforeach()
if(NOT build MATCHES "towerpipe_cuda_header_units" OR NOT build MATCHES "towerpipe_gpu_mpi_tests")
  message(FATAL_ERROR "a build without NCCL must still build the CUDA header units and the GPU MPI tests (${BUILD_FILE})")
endif()
message(STATUS "nothing of NCCL in ${BUILD_FILE}")
