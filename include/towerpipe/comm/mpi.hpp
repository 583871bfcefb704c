#pragma once
// mpi_process_group — a process_group over MPI (reduce::sharded across processes); include it where <mpi.h> is.
// The caller initialises and finalises MPI. Each operation has a deadline (60 s unless given); past it the group is
// broken (every later call fails with the first error) and MPI is no use: end the program. Messages are at most 2 GiB.
// Why: docs/design-notes.md#comm-mpi

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/core/error.hpp"

namespace towerpipe {

class mpi_process_group final : public process_group {
 public:
  explicit mpi_process_group(MPI_Comm comm = MPI_COMM_WORLD,
                             std::chrono::milliseconds deadline = std::chrono::seconds(60))
      : deadline_(deadline) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) detail::fail("mpi_process_group: MPI is not initialised (call MPI_Init first)");
    check(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm, &size_), "MPI_Comm_size");
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Comm_idup(comm, &comm_, &request), "MPI_Comm_idup");
    wait(request, "duplicating the communicator");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~mpi_process_group() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  mpi_process_group(const mpi_process_group&) = delete;
  mpi_process_group& operator=(const mpi_process_group&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return "MPI, " + std::to_string(size_) + " processes"; }
  bool callable_from_any_thread() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_SERIALIZED;
  }
  std::chrono::milliseconds deadline() const { return deadline_; }

  // Every call starts with the sizes, sent point to point like the blocks that follow: past the deadline,
  // the ranks nothing came from are known and named. (Every step's first collective and the
  // configuration check are all_gathers, so a process that has exited or stopped is named there.)
  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char* what) override {
    enter(what);
    const auto mine = static_cast<std::uint64_t>(bytes);
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size_));
    sizes[static_cast<std::size_t>(rank_)] = mine;
    std::vector<transfer> receives, sends;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      receives.push_back({r, &sizes[static_cast<std::size_t>(r)], sizeof(std::uint64_t)});
      sends.push_back({r, &mine, sizeof mine});
    }
    exchange(receives, sends, sizes_tag, what);
    std::vector<std::size_t> offsets, counts;
    std::size_t total = 0;
    for (std::uint64_t n : sizes) {
      offsets.push_back(total);
      counts.push_back(static_cast<std::size_t>(n));
      total += static_cast<std::size_t>(n);
    }
    std::string gathered(total, '\0');
    all_gather_blocks(static_cast<const char*>(data), gathered.data(), offsets, counts, what);
    std::vector<std::string> texts;
    for (std::size_t r = 0; r < counts.size(); ++r) texts.push_back(gathered.substr(offsets[r], counts[r]));
    return texts;
  }

  void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                  char* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                  const char* what) override {
    enter(what);
    std::vector<transfer> receives, sends;
    for (int r = 0; r < size_; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (r == rank_) {
        if (send_bytes[i] != recv_bytes[i])
          detail::fail("rank ", rank_, ": ", what, ": sends itself ", send_bytes[i], " bytes but expects ", recv_bytes[i]);
        if (send_bytes[i] > 0) std::memcpy(recv + recv_offsets[i], send + send_offsets[i], send_bytes[i]);
        continue;
      }
      receives.push_back({r, recv_bytes[i] > 0 ? recv + recv_offsets[i] : nullptr, checked_count(recv_bytes[i], what)});
      sends.push_back({r, send_bytes[i] > 0 ? send + send_offsets[i] : nullptr, checked_count(send_bytes[i], what)});
    }
    exchange(receives, sends, data_tag, what);
  }

  // An all-to-all in which this rank sends every rank its own block.
  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char* what) override {
    const std::vector<std::size_t> at_start(block_bytes.size(), 0),
        my_bytes(block_bytes.size(), block_bytes[static_cast<std::size_t>(rank_)]);
    all_to_all(mine, at_start, my_bytes, out, block_offsets, block_bytes, what);
  }

 private:
  static constexpr int sizes_tag = 0x7417, data_tag = 0x7418, gave_up_tag = 0x7419;

  // One message of an exchange: to or from `peer`, `bytes` at `data` (null where there are none; the
  // message is sent all the same, so that its arrival says the peer made the call).
  struct transfer {
    int peer;
    const void* data;
    std::size_t bytes;
  };

  // Every operation starts here: after a deadline error, on this process or (as its notice says) on
  // another, the group is broken and every call fails at once, repeating the first error.
  void enter(const char* what) {
    poll_notices(what);
    const std::string broken = broken_reason();
    if (!broken.empty()) detail::fail("rank ", rank_, ": ", what, ": the process group failed earlier (", broken, ")");
  }

  std::string broken_reason() const {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    return broken_;
  }

  // Breaks the group with `reason` (the first reason stays), tells every other rank once (so that a
  // rank still waiting elsewhere, for this one among others, stops at once rather than at its own
  // deadline, and does not name this live rank as one that sent nothing), and throws it.
  [[noreturn]] void break_group(const std::string& reason) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(broken_mutex_);
      if (broken_.empty()) {
        broken_ = reason;
        first = true;
      }
    }
    if (first) {
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        MPI_Request request = MPI_REQUEST_NULL;
        // Sent from broken_, which stays as it is for the group's life; freeing the request leaves the
        // send to complete on its own (to a rank that has exited it never does; the program's MPI_Abort
        // ends it).
        if (MPI_Isend(broken_.data(), static_cast<int>(std::min<std::size_t>(broken_.size(), 4096)), MPI_CHAR, r, gave_up_tag,
                      comm_, &request) == MPI_SUCCESS &&
            request != MPI_REQUEST_NULL)
          MPI_Request_free(&request);
      }
    }
    detail::fail(reason);
  }

  // Whether another rank has given up (its deadline passed): then this one does too, naming it.
  void poll_notices(const char* what) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, gave_up_tag, comm_, &arrived, &status) != MPI_SUCCESS || !arrived) return;
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string notice(static_cast<std::size_t>(std::max(length, 0)), '\0');
    MPI_Recv(notice.data(), length, MPI_CHAR, status.MPI_SOURCE, gave_up_tag, comm_, MPI_STATUS_IGNORE);
    if (!broken_reason().empty()) return;  // broken already: enter() says so
    break_group(detail::make_message("rank ", rank_, " of ", size_, ": ", what, " stopped: rank ", status.MPI_SOURCE,
                                     " gave up first (", notice, ")"));
  }

  // Receives and sends every transfer, within the deadline. Past it (or when another rank gives up
  // meanwhile), the pending requests are cancelled (so that nothing lands in freed memory later), the
  // group breaks, and the error names the ranks that sent nothing in this operation.
  void exchange(const std::vector<transfer>& receive_list, const std::vector<transfer>& send_list, int tag, const char* what) {
    std::vector<MPI_Request> receives(receive_list.size(), MPI_REQUEST_NULL), sends(send_list.size(), MPI_REQUEST_NULL);
    const auto cancel_pending = [&] {
      for (std::vector<MPI_Request>* pending : {&receives, &sends}) {
        for (MPI_Request& request : *pending) {
          if (request == MPI_REQUEST_NULL) continue;
          MPI_Cancel(&request);
          MPI_Request_free(&request);
        }
      }
    };
    try {
      for (std::size_t i = 0; i < receive_list.size(); ++i)
        check(MPI_Irecv(receive_list[i].data == nullptr ? &empty_ : const_cast<void*>(receive_list[i].data),
                        static_cast<int>(receive_list[i].bytes), MPI_BYTE, receive_list[i].peer, tag, comm_, &receives[i]),
              what);
      for (std::size_t i = 0; i < send_list.size(); ++i)
        check(MPI_Isend(send_list[i].data == nullptr ? &empty_ : send_list[i].data, static_cast<int>(send_list[i].bytes), MPI_BYTE,
                        send_list[i].peer, tag, comm_, &sends[i]),
              what);
      std::size_t receiving = receives.size();
      const auto start = std::chrono::steady_clock::now();
      for (;;) {
        // Each receive on its own, so that its status is read when it completes: a shorter message than
        // expected is not an MPI error, but a sign that the ranks are not making the same call.
        for (std::size_t i = 0; i < receives.size() && receiving > 0; ++i) {
          if (receives[i] == MPI_REQUEST_NULL) continue;
          int done = 0;
          MPI_Status status;
          check(MPI_Test(&receives[i], &done, &status), what);
          if (!done) continue;
          --receiving;
          int count = 0;
          MPI_Get_count(&status, MPI_BYTE, &count);
          if (static_cast<std::size_t>(count) != receive_list[i].bytes)
            detail::fail("rank ", rank_, ": ", what, ": rank ", receive_list[i].peer, " sent ", count, " bytes, ",
                         receive_list[i].bytes, " expected (the ranks are not making the same call)");
        }
        int sent = 0;
        check(MPI_Testall(static_cast<int>(sends.size()), sends.data(), &sent, MPI_STATUSES_IGNORE), what);
        if (receiving == 0 && sent) return;
        if (std::chrono::steady_clock::now() - start > deadline_) break;
        poll_notices(what);
        // MPI moves a large message in fragments and makes progress only inside MPI_Test: sleeping
        // between polls would stall every fragment (a 100 MB exchange took 6x longer with 200 us naps).
        // Yielding keeps the transfer moving and lets the process's other threads, or other processes, run.
        std::this_thread::yield();
      }
    } catch (...) {
      cancel_pending();
      if (!broken_reason().empty()) throw;  // another rank gave up, or this one did (a notice): as it said
      break_group(detail::current_exception_text());  // an MPI error, or a message of another size
    }
    const auto unfinished = [&](std::vector<MPI_Request>& requests, const std::vector<transfer>& list) {
      std::string ranks;
      for (std::size_t i = 0; i < requests.size(); ++i) {
        int done = 0;
        MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE);
        if (!done) ranks += (ranks.empty() ? "" : ", ") + std::to_string(list[i].peer);
      }
      return ranks;
    };
    const std::string silent = unfinished(receives, receive_list), not_taking = unfinished(sends, send_list);
    cancel_pending();
    break_group(detail::make_message(
        "rank ", rank_, " of ", size_, ": ", what, " did not complete within ", std::chrono::duration<double>(deadline_).count(),
        " s: another process has exited, stopped, or is not making the same call (MPI cannot be used reliably after this: end "
        "the program, e.g. with MPI_Abort)",
        silent.empty() ? std::string() : "; nothing came from rank(s) " + silent,
        silent.empty() && !not_taking.empty() ? "; rank(s) " + not_taking + " did not take what this rank sent" : std::string()));
  }

  // Polls the request until it completes or the deadline passes (the communicator's duplication).
  void wait(MPI_Request& request, const char* what) const {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (std::chrono::steady_clock::now() - start > deadline_)
        detail::fail("rank ", rank_, " of ", size_, ": ", what, " did not complete within ",
                     std::chrono::duration<double>(deadline_).count(), " s: another process has exited or stopped");
      std::this_thread::yield();
    }
  }

  void check(int status, const char* what) const {
    if (status == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(status, text, &length);
    detail::fail("rank ", rank_, ": MPI failed in ", what, ": ", std::string(text, static_cast<std::size_t>(length)));
  }

  std::size_t checked_count(std::size_t bytes, const char* what) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      detail::fail("rank ", rank_, ": ", what, " would move ", bytes, " bytes in one MPI message; the limit is 2 GiB");
    return bytes;
  }

  std::chrono::milliseconds deadline_;
  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  char empty_ = 0;  // where a message of no bytes points
  mutable std::mutex broken_mutex_;
  std::string broken_;  // the error that broke the group (its own deadline, or another rank's notice); empty: whole
};

}  // namespace towerpipe
