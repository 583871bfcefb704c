#pragma once
// mpi_process_group — a process_group (comm/process_group.hpp) over MPI, for pipelines whose towers
// span several processes (reduce::sharded). Include it where MPI is: <mpi.h> and the MPI library
// (CMake: find_package(MPI) and MPI::MPI_CXX; towerpipe's own headers do not need it otherwise).
//
//   MPI_Init(&argc, &argv);   // the caller's: towerpipe never initialises or finalises MPI
//   towerpipe::pipeline_options options;
//   options.processes = std::make_shared<towerpipe::mpi_process_group>(MPI_COMM_WORLD);
//
// It works on a duplicate of the communicator it is given, so its traffic never matches the user's.
// Every operation is non-blocking underneath and waited for with a deadline (60 s unless given): past
// it, the operation throws a towerpipe::error instead of waiting for a process that has exited or
// stopped. MPI offers no way to cancel a collective, so after such an error the program should end
// (MPI_Abort) rather than go on using MPI. Collectives are called from the thread that calls the
// pipeline where MPI was initialised with MPI_THREAD_FUNNELED; with MPI_THREAD_SERIALIZED (or
// MULTIPLE: MPI_Init_thread) reduce::sharded also exchanges gradient buckets from its worker thread
// while the towers run, one call at a time. Messages are limited to 2 GiB each (MPI's int counts).

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
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

  // Every call starts with the sizes, sent point to point rather than as a collective: past the
  // deadline, the ranks nothing came from are known and named. (Every step's first collective and the
  // configuration check are all_gathers, so a process that has exited or stopped is named there.)
  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char* what) override {
    const auto mine = static_cast<std::uint64_t>(bytes);
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size_));
    sizes[static_cast<std::size_t>(rank_)] = mine;
    exchange_sizes(mine, sizes, what);
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
    const std::vector<int> send_counts = ints(send_bytes, what), send_displacements = ints(send_offsets, what);
    const std::vector<int> recv_counts = ints(recv_bytes, what), recv_displacements = ints(recv_offsets, what);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(send, send_counts.data(), send_displacements.data(), MPI_BYTE, recv, recv_counts.data(),
                         recv_displacements.data(), MPI_BYTE, comm_, &request),
          what);
    wait(request, what);
  }

  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char* what) override {
    const std::vector<int> counts = ints(block_bytes, what), displacements = ints(block_offsets, what);
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgatherv(mine, counts[static_cast<std::size_t>(rank_)], MPI_BYTE, out, counts.data(),
                          displacements.data(), MPI_BYTE, comm_, &request),
          what);
    wait(request, what);
  }

 private:
  static constexpr int sizes_tag = 0x7417;

  // Sends `mine` to every other rank and receives theirs into sizes[r], within the deadline; past it,
  // the pending requests are cancelled (so that nothing lands in freed memory later) and the error
  // names the ranks that sent nothing.
  void exchange_sizes(const std::uint64_t& mine, std::vector<std::uint64_t>& sizes, const char* what) const {
    std::vector<MPI_Request> receives, sends;
    std::vector<int> from;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      from.push_back(r);
      receives.emplace_back(MPI_REQUEST_NULL);
      sends.emplace_back(MPI_REQUEST_NULL);
      check(MPI_Irecv(&sizes[static_cast<std::size_t>(r)], 1, MPI_UINT64_T, r, sizes_tag, comm_, &receives.back()), what);
      check(MPI_Isend(&mine, 1, MPI_UINT64_T, r, sizes_tag, comm_, &sends.back()), what);
    }
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int received = 0, sent = 0;
      check(MPI_Testall(static_cast<int>(receives.size()), receives.data(), &received, MPI_STATUSES_IGNORE), what);
      check(MPI_Testall(static_cast<int>(sends.size()), sends.data(), &sent, MPI_STATUSES_IGNORE), what);
      if (received && sent) return;
      if (std::chrono::steady_clock::now() - start > deadline_) break;
      std::this_thread::yield();
    }
    std::string missing;
    for (std::size_t i = 0; i < receives.size(); ++i) {
      int done = 0;
      MPI_Test(&receives[i], &done, MPI_STATUS_IGNORE);
      if (!done) missing += (missing.empty() ? "" : ", ") + std::to_string(from[i]);
    }
    for (std::vector<MPI_Request>* pending : {&receives, &sends}) {
      for (MPI_Request& request : *pending) {
        if (request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&request);
        MPI_Request_free(&request);
      }
    }
    fail_past_deadline(what, missing.empty() ? std::string() : "; nothing came from rank(s) " + missing);
  }

  [[noreturn]] void fail_past_deadline(const char* what, const std::string& detail) const {
    detail::fail("rank ", rank_, " of ", size_, ": ", what, " did not complete within ", std::chrono::duration<double>(deadline_).count(),
                 " s: another process has exited, stopped, or is not making the same call (MPI cannot be used "
                 "reliably after this: end the program, e.g. with MPI_Abort)",
                 detail);
  }

  // Polls the request until it completes or the deadline passes.
  void wait(MPI_Request& request, const char* what) const {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (std::chrono::steady_clock::now() - start > deadline_) fail_past_deadline(what, "");
      // MPI moves a large message in fragments and makes progress only inside MPI_Test: sleeping between
      // polls would stall every fragment (a 100 MB exchange took 6x longer with 200 us naps). Yielding
      // keeps the transfer moving and lets the process's other threads, or other processes, run.
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

  std::vector<int> ints(const std::vector<std::size_t>& values, const char* what) const {
    std::vector<int> result;
    for (std::size_t v : values) {
      if (v > static_cast<std::size_t>(INT_MAX))
        detail::fail("rank ", rank_, ": ", what, " would move ", v, " bytes in one MPI message; the limit is 2 GiB");
      result.push_back(static_cast<int>(v));
    }
    return result;
  }

  std::chrono::milliseconds deadline_;
  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace towerpipe
