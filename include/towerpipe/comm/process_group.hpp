#pragma once
// process_group — the processes a pipeline spans, and the three collectives reduce::sharded needs from
// them. The library's core does not depend on any transport: comm/mpi.hpp implements this interface
// over MPI, and a pipeline without one (pipeline_options::processes empty) is a group of one.
//
// Every collective is called by every process of the group in the same order (like MPI's), moves
// bytes without interpreting them, and either completes or throws a towerpipe::error — after the
// implementation's deadline at the latest, naming the operation (`what`) and this process's rank.
// Never a hang: a process that exits or stops calling makes the others fail.

#include <cstddef>
#include <string>
#include <vector>

namespace towerpipe {

class process_group {
 public:
  virtual ~process_group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A description for messages and fingerprints, e.g. "MPI, 4 processes".
  virtual std::string describe() const = 0;
  // Whether the collectives may be called from a thread other than the pipeline's — one thread at a time,
  // never two at once. reduce::sharded then exchanges gradient buckets from its worker thread while the
  // towers run (where every process's group says so); else after the towers.
  virtual bool callable_from_any_thread() const { return false; }

  // Every process's `bytes` bytes at `data` (each may give a different count), in rank order.
  virtual std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char* what) = 0;

  // Personalised all-to-all: send_bytes[r] bytes at send + send_offsets[r] go to rank r; from rank r
  // arrive recv_bytes[r] bytes at recv + recv_offsets[r]. Counts must agree pairwise.
  virtual void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets,
                          const std::vector<std::size_t>& send_bytes, char* recv,
                          const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                          const char* what) = 0;

  // Every rank's block into every rank's `out`: rank r's block (block_bytes[r] bytes at `mine` on rank r)
  // lands at out + block_offsets[r]. `mine` may not overlap `out`.
  virtual void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                                 const std::vector<std::size_t>& block_bytes, const char* what) = 0;
};

}  // namespace towerpipe
