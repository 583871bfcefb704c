#pragma once
// Where reduce::sharded's contributions travel between processes (host or GPU towers): the chunk table cut into one
// slice per process, and the exchange's buffers in elements, computed alike by every process. Plain C++.
// Why: docs/design-notes.md#plan-exchange_plan

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/owner_slices.hpp"

namespace towerpipe {
namespace detail {

// Rows an owner sums at most (processes x contributions each) with GPU towers: the bound of the canonical
// tree's slots in kernels/process_agents.hpp.
constexpr int max_process_rows = 1024;
// The same with host towers: the block tree's 32 scratch arrays (canonical_block_sum) take any int count.
constexpr int max_host_process_rows = std::numeric_limits<int>::max();

// Rows each process sends each owner (exchange_plan's `contributions`), for reduce::sharded's host and
// GPU forms alike: with a power of two of towers its canonical partial (a subtree of the global tree,
// kernels/process_agents.hpp), else one per tower.
inline std::size_t contributions_per_process(std::size_t towers) {
  const bool power_of_two = towers != 0 && (towers & (towers - 1)) == 0;
  return power_of_two ? 1 : towers;
}

class exchange_plan {
 public:
  // contributions: rows each process sends each owner (1: its partial; else one per tower); max_rows: the
  // most rows the owner's sum takes.
  // bucket_of: per variable, its gradient bucket (buckets numbered from 0); empty: one bucket.
  exchange_plan(const std::vector<tensor_chunk>& table, std::size_t variables, int processes, int rank, std::size_t contributions,
                int max_rows = max_process_rows, const std::vector<std::size_t>& bucket_of = {})
      : slices_(cut_into_slices(table, static_cast<std::size_t>(processes))),
        variables_(variables),
        rank_(rank),
        contributions_(contributions) {
    if (static_cast<std::size_t>(processes) * contributions > static_cast<std::size_t>(max_rows))
      fail("reduce::sharded sums at most ", max_rows, " contributions per element; ", processes, " processes send ", contributions,
           " each (use a power-of-two number of towers per process: one each)");
    if (!bucket_of.empty() && bucket_of.size() != variables)
      fail("exchange_plan: ", bucket_of.size(), " bucket numbers for ", variables, " variables");
    for (std::size_t b : bucket_of) buckets_ = std::max(buckets_, b + 1);
    std::size_t first = 0;
    for (const owner_slice& slice : slices_) {
      first_.push_back(first);
      first += slice.stored_elements;
      bucketed_slices_.push_back(bucketed(slice, bucket_of, buckets_));
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

  std::size_t buckets() const { return buckets_; }

  // Pointer-table entries (role = row k, then variable) of the rows this process sends `owner`.
  template <class T>
  std::vector<T*> send_row_pointers(int owner, T* send) const {
    return row_pointers(owner, send + contributions_ * first(owner), 1);
  }
  // The same for the rows this process, as owner, received (role = global row).
  template <class T>
  std::vector<T*> received_row_pointers(T* received) const {
    return row_pointers(rank_, received, static_cast<std::size_t>(processes()));
  }

  // Offsets and sizes in bytes, per process, for process_group::all_to_all and all_gather_blocks.
  struct blocks {
    std::vector<std::size_t> offsets, bytes;
  };
  // The whole exchange.
  blocks send_blocks(std::size_t value_bytes) const { return pieces(true, value_bytes, 0, buckets_); }
  blocks receive_blocks(std::size_t value_bytes) const { return pieces(false, value_bytes, 0, buckets_); }
  // Bucket `bucket`'s exchange only.
  blocks send_blocks(std::size_t value_bytes, std::size_t bucket) const { return pieces(true, value_bytes, bucket, bucket + 1); }
  blocks receive_blocks(std::size_t value_bytes, std::size_t bucket) const {
    return pieces(false, value_bytes, bucket, bucket + 1);
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
  // A slice's storage in a block of the exchange (see the top): bucket b's rows start at contributions *
  // first[b], each first[b + 1] - first[b] long; each of the slice's ranges lies at range_at within its
  // bucket's row, on a multiple of stored_alignment as in the slice's own compact storage, which has the
  // same length.
  struct bucketed_slice {
    std::vector<std::size_t> first;     // per bucket, and last the slice's stored_elements
    std::vector<std::size_t> range_at;  // per range of the slice
    std::vector<std::size_t> range_bucket;
    std::size_t length(std::size_t bucket) const { return first[bucket + 1] - first[bucket]; }
  };
  static bucketed_slice bucketed(const owner_slice& slice, const std::vector<std::size_t>& bucket_of, std::size_t buckets) {
    bucketed_slice b;
    std::vector<std::size_t> length(buckets, 0);
    for (const element_range& range : slice.ranges) {
      const std::size_t bucket = bucket_of.empty() ? 0 : bucket_of[range.variable];
      b.range_bucket.push_back(bucket);
      b.range_at.push_back(length[bucket]);
      length[bucket] += padded_to_stored_alignment(range.end - range.begin);
    }
    b.first.push_back(0);
    for (std::size_t bucket = 0; bucket < buckets; ++bucket) b.first.push_back(b.first.back() + length[bucket]);
    return b;
  }

  // `block_count` blocks of contributions_ rows of owner's slice from `base`, each bucket-major (see the top):
  // entries [row][variable], row j * contributions_ + k for row k of block j, as slice_pointers makes
  // them (nullptr for the variables the slice does not hold).
  template <class T>
  std::vector<T*> row_pointers(int owner, T* base, std::size_t block_count) const {
    const owner_slice& s = slice(owner);
    const bucketed_slice& b = bucketed_slices_[static_cast<std::size_t>(owner)];
    const std::size_t rows = block_count * contributions_;
    std::vector<T*> pointers(rows * variables_, nullptr);
    for (std::size_t row = 0; row < rows; ++row) {
      const std::size_t block = row / contributions_, k = row % contributions_;
      for (std::size_t i = 0; i < s.ranges.size(); ++i) {
        const std::size_t bucket = b.range_bucket[i];
        T* at = base + contributions_ * (block * s.stored_elements + b.first[bucket]) + k * b.length(bucket) + b.range_at[i];
        // unsigned address arithmetic, as in slice_pointers: at - range.begin may lie before the buffer
        pointers[row * variables_ + s.ranges[i].variable] =
            reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(at) - s.ranges[i].begin * sizeof(T));
      }
    }
    return pointers;
  }

  // Buckets [from, to), per process r: `send`, owner r's part of the send buffer; else what this process receives from r.
  blocks pieces(bool send, std::size_t value_bytes, std::size_t from, std::size_t to) const {
    blocks b;
    for (int r = 0; r < processes(); ++r) {
      const bucketed_slice& piece = bucketed_slices_[static_cast<std::size_t>(send ? r : rank_)];
      const std::size_t block = send ? first(r) : static_cast<std::size_t>(r) * mine().stored_elements;
      b.offsets.push_back(contributions_ * (block + piece.first[from]) * value_bytes);
      b.bytes.push_back(contributions_ * (piece.first[to] - piece.first[from]) * value_bytes);
    }
    return b;
  }

  std::vector<owner_slice> slices_;
  std::size_t variables_;
  std::vector<std::size_t> first_;
  std::size_t total_ = 0;
  int rank_;
  std::size_t contributions_;
  std::size_t buckets_ = 1;
  std::vector<bucketed_slice> bucketed_slices_;  // per owner
};

}  // namespace detail
}  // namespace towerpipe
