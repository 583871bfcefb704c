#pragma once
// thread_process_group — a process_group (comm/process_group.hpp) whose ranks are threads of one
// process, with mpi_process_group's contract: every rank makes the same collectives in the same order,
// each completes or throws a towerpipe::error by the deadline, naming the ranks that never arrived;
// ranks that make different calls all fail, naming the call.
// Why: docs/design-notes.md#comm-thread_group

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/core/error.hpp"

namespace towerpipe {

class thread_process_group final : public process_group {
 public:
  static std::vector<std::shared_ptr<thread_process_group>> create(int ranks,
                                                                   std::chrono::milliseconds deadline = std::chrono::seconds(60)) {
    if (ranks < 1) detail::fail("thread_process_group: needs at least one rank, ", ranks, " given");
    const auto shared = std::make_shared<board>(ranks, deadline);
    std::vector<std::shared_ptr<thread_process_group>> group;
    for (int r = 0; r < ranks; ++r) group.push_back(std::shared_ptr<thread_process_group>(new thread_process_group(shared, r)));
    return group;
  }

  int rank() const override { return rank_; }
  int size() const override { return board_->ranks; }
  std::string describe() const override { return "threads, " + std::to_string(board_->ranks) + " ranks"; }
  bool callable_from_any_thread() const override { return true; }  // the ranks meet on a board under a mutex

  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char* what) override {
    std::vector<std::string> mine{std::string(static_cast<const char*>(data), bytes)};
    std::vector<std::string> all;
    for (std::vector<std::string>& posted : board_->exchange(rank_, std::move(mine), what)) all.push_back(std::move(posted[0]));
    return all;
  }

  void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                  char* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                  const char* what) override {
    std::vector<std::string> pieces;  // pieces[r]: what goes to rank r
    for (int r = 0; r < size(); ++r) pieces.emplace_back(send + send_offsets[index(r)], send_bytes[index(r)]);
    const std::vector<std::vector<std::string>> posted = board_->exchange(rank_, std::move(pieces), what);
    for (int r = 0; r < size(); ++r) {
      const std::string& piece = posted[index(r)][index(rank_)];
      if (piece.size() != recv_bytes[index(r)])
        detail::fail("rank ", rank_, ": ", what, ": rank ", r, " sent ", piece.size(), " bytes, ", recv_bytes[index(r)], " expected");
      if (!piece.empty()) std::memcpy(recv + recv_offsets[index(r)], piece.data(), piece.size());  // recv may be null when empty
    }
  }

  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char* what) override {
    const std::vector<std::string> all = all_gather(mine, block_bytes[index(rank_)], what);
    for (int r = 0; r < size(); ++r) {
      if (all[index(r)].size() != block_bytes[index(r)])
        detail::fail("rank ", rank_, ": ", what, ": rank ", r, " gave ", all[index(r)].size(), " bytes, ", block_bytes[index(r)],
                     " expected");
      if (!all[index(r)].empty()) std::memcpy(out + block_offsets[index(r)], all[index(r)].data(), all[index(r)].size());
    }
  }

 private:
  // Where the ranks meet: each collective is one round; the last rank to post completes it.
  struct board {
    board(int count, std::chrono::milliseconds wait) : ranks(count), deadline(wait), posts(index(count)), whats(index(count)) {}

    // Every rank's pieces, once every rank has posted its own.
    std::vector<std::vector<std::string>> exchange(int rank, std::vector<std::string> pieces, const char* what) {
      std::unique_lock<std::mutex> lock(mutex);
      if (!broken.empty()) detail::fail("rank ", rank, ": ", what, ": the group failed earlier (", broken, ")");
      const std::size_t my_round = round;
      posts[index(rank)] = std::move(pieces);
      whats[index(rank)] = what;
      if (++arrived == ranks) {
        arrived = 0;
        ++round;
        results = std::move(posts);
        posts.assign(index(ranks), {});
        result_whats = whats;
        std::fill(whats.begin(), whats.end(), nullptr);
        changed.notify_all();
      } else if (!changed.wait_for(lock, deadline, [&] { return round != my_round || !broken.empty(); })) {
        std::string missing;
        for (int r = 0; r < ranks; ++r) {
          if (whats[index(r)] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        broken = detail::make_message("rank ", rank, " of ", ranks, ": ", what, " did not complete within ",
                                      std::chrono::duration<double>(deadline).count(),
                                      " s: another rank has stopped or is not making the same call; nothing came from rank(s) ",
                                      missing);
        changed.notify_all();
        detail::fail(broken);
      }
      if (round == my_round) detail::fail("rank ", rank, ": ", what, ": the group failed (", broken, ")");
      // Everyone arrived; every rank checks that all made the same call, so that all fail alike.
      for (int r = 0; r < ranks; ++r) {
        if (std::strcmp(result_whats[index(r)], result_whats[0]) != 0)
          detail::fail("rank ", rank, ": the ranks make different calls: rank ", r, " is ", result_whats[index(r)], ", rank 0 is ",
                       result_whats[0]);
      }
      return results;
    }

    const int ranks;
    const std::chrono::milliseconds deadline;
    std::mutex mutex;
    std::condition_variable changed;
    std::size_t round = 0;
    int arrived = 0;
    std::vector<std::vector<std::string>> posts;             // this round's, per rank
    std::vector<const char*> whats;                          // this round's calls, per rank; null: not arrived
    std::vector<std::vector<std::string>> results;           // the last completed round's posts
    std::vector<const char*> result_whats;
    std::string broken;  // the deadline error that broke the group
  };

  static std::size_t index(int r) { return static_cast<std::size_t>(r); }

  thread_process_group(std::shared_ptr<board> shared, int rank) : board_(std::move(shared)), rank_(rank) {}

  std::shared_ptr<board> board_;
  int rank_;
};

}  // namespace towerpipe
