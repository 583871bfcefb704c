#pragma once
// An nccl_process_group (comm/nccl.cuh) whose ranks are an MPI communicator's: rank 0 makes the NCCL id
// and MPI carries it to the others (the usual bootstrap under mpirun). Needs MPI and NCCL.
//
//   MPI_Init(&argc, &argv);
//   options.processes = towerpipe::nccl_process_group_over_mpi(MPI_COMM_WORLD, device);

#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <memory>

#include "towerpipe/comm/mpi.hpp"
#include "towerpipe/comm/nccl.cuh"

namespace towerpipe {

inline std::shared_ptr<nccl_process_group> nccl_process_group_over_mpi(MPI_Comm comm, int device,
                                                                       std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
  mpi_process_group group(comm, deadline);  // its all_gather has the deadline; a duplicate communicator
  ncclUniqueId id{};
  if (group.rank() == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) detail::fail("rank 0: ncclGetUniqueId failed: ", ncclGetErrorString(made));
  }
  const std::vector<std::string> ids = group.all_gather(&id, group.rank() == 0 ? sizeof id : 0, "passing the NCCL id");
  std::memcpy(&id, ids[0].data(), sizeof id);
  return std::make_shared<nccl_process_group>(id, group.rank(), group.size(), device, deadline);
}

}  // namespace towerpipe
