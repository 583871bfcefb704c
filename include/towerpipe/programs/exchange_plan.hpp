#pragma once
// Where reduce::sharded's contributions travel between processes, with host towers
// (reduce/sharded/host_towers.hpp) and with GPU towers (reduce/sharded/gpu_towers_across_processes.cuh):
// the chunk table cut into one slice per process (programs/owner_slices.hpp: whole chunks, so whole screen
// tiles), and the buffers of the exchange, in elements, as every process computes them alike. Every row
// is a slice's compact storage (slice.stored_elements long, each range on a multiple of stored_alignment
// elements), so every block starts aligned for vector I/O. Plain C++: the host tests emulate the
// exchange with it.
//
//   send buffer     owner-major: owner r's block at contributions * first(r), its contributions (rows)
//                   one after another: one block per owner, whatever the rows, so that the all-to-all
//                   moves one piece per pair of processes.
//   receive buffer  rank-major: process p's block at p * contributions * mine, so row k of process p is
//                   row p * contributions + k: the global order of the canonical tree's leaves.
//   gather          slice r's new parameters land at first(r) of a buffer of every variable end to end,
//                   each padded (padded_flat_starts: the slices' storage in owner order).

#include <cstddef>
#include <limits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/programs/chunk_table.hpp"
#include "towerpipe/programs/owner_slices.hpp"

namespace towerpipe {
namespace detail {

// Rows an owner sums at most (processes x contributions each) with GPU towers: the bound of the canonical
// tree's slots in programs/process_agents.hpp.
constexpr int max_process_rows = 1024;
// The same with host towers: the block tree's 32 scratch arrays (canonical_block_sum) take any int count.
constexpr int max_host_process_rows = std::numeric_limits<int>::max();

// Rows each process sends each owner (exchange_plan's `contributions`), for reduce::sharded's host and
// GPU forms alike: with a power of two of towers its canonical partial (a subtree of the global tree,
// programs/process_agents.hpp), else one per tower.
inline std::size_t contributions_per_process(std::size_t towers) {
  const bool power_of_two = towers != 0 && (towers & (towers - 1)) == 0;
  return power_of_two ? 1 : towers;
}

class exchange_plan {
 public:
  // contributions: rows each process sends each owner (1: its partial; else one per tower); max_rows: the
  // most rows the owner's sum takes.
  exchange_plan(const std::vector<tensor_chunk>& table, std::size_t variables, int processes, int rank, std::size_t contributions,
                int max_rows = max_process_rows)
      : slices_(cut_into_slices(table, static_cast<std::size_t>(processes))),
        variables_(variables),
        rank_(rank),
        contributions_(contributions) {
    if (static_cast<std::size_t>(processes) * contributions > static_cast<std::size_t>(max_rows))
      fail("reduce::sharded sums at most ", max_rows, " contributions per element; ", processes, " processes send ", contributions,
           " each (use a power-of-two number of towers per process: one each)");
    std::size_t first = 0;
    for (const owner_slice& slice : slices_) {
      first_.push_back(first);
      first += slice.stored_elements;
    }
    total_ = first;
  }

  int processes() const { return static_cast<int>(slices_.size()); }
  const owner_slice& slice(int owner) const { return slices_[static_cast<std::size_t>(owner)]; }
  const owner_slice& mine() const { return slice(rank_); }
  std::size_t first(int owner) const { return first_[static_cast<std::size_t>(owner)]; }
  std::size_t total() const { return total_; }
  std::size_t contributions() const { return contributions_; }
  // The rows an owner sums: every process's contributions.
  int rows() const { return processes() * static_cast<int>(contributions_); }
  std::size_t send_elements() const { return contributions_ * total_; }
  std::size_t receive_elements() const { return static_cast<std::size_t>(rows()) * mine().stored_elements; }

  // Pointer-table entries (role = row k, then variable) of the rows this process sends `owner`.
  template <class T>
  std::vector<T*> send_row_pointers(int owner, T* send) const {
    return slice_row_pointers(slice(owner), send + contributions_ * first(owner), contributions_, variables_);
  }
  // The same for the rows this process, as owner, received (role = global row).
  template <class T>
  std::vector<T*> received_row_pointers(T* received) const {
    return slice_row_pointers(mine(), received, static_cast<std::size_t>(rows()), variables_);
  }

  // Offsets and sizes in bytes, per process, for process_group::all_to_all and all_gather_blocks.
  struct blocks {
    std::vector<std::size_t> offsets, bytes;
  };
  blocks send_blocks(std::size_t value_bytes) const {
    blocks b;
    for (int r = 0; r < processes(); ++r) {
      b.offsets.push_back(contributions_ * first(r) * value_bytes);
      b.bytes.push_back(contributions_ * slice(r).stored_elements * value_bytes);
    }
    return b;
  }
  blocks receive_blocks(std::size_t value_bytes) const {
    blocks b;
    for (int r = 0; r < processes(); ++r) {
      b.offsets.push_back(static_cast<std::size_t>(r) * contributions_ * mine().stored_elements * value_bytes);
      b.bytes.push_back(contributions_ * mine().stored_elements * value_bytes);
    }
    return b;
  }
  blocks gather_blocks(std::size_t value_bytes) const {
    blocks b;
    for (int r = 0; r < processes(); ++r) {
      b.offsets.push_back(first(r) * value_bytes);
      b.bytes.push_back(slice(r).stored_elements * value_bytes);
    }
    return b;
  }

 private:
  std::vector<owner_slice> slices_;
  std::size_t variables_;
  std::vector<std::size_t> first_;
  std::size_t total_ = 0;
  int rank_;
  std::size_t contributions_;
};

}  // namespace detail
}  // namespace towerpipe
