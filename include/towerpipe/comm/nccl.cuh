#pragma once
// nccl_process_group — a process_group (comm/process_group.hpp) over NCCL, for reduce::sharded with GPU
// towers across processes: its bulk traffic (gradient contributions to their owners, new parameters to
// everyone) stays on the devices (device_collectives, comm/device_collectives.hpp). Needs NCCL (it ships
// with the CUDA toolkit on our machines; CMake: link libnccl). NCCL refuses two ranks on one GPU: one
// process per device.
//
//   // rank 0 makes the id and hands it to the others however it likes (comm/nccl_over_mpi.cuh: MPI)
//   options.processes = std::make_shared<towerpipe::nccl_process_group>(id, rank, ranks, device);
//   // or the caller's own communicator, which stays the caller's (but see caller_communicator)
//   options.processes = std::make_shared<towerpipe::nccl_process_group>(comm, device);
//
// towerpipe never asks NCCL to add anything: the sums are the owners' own, in the canonical order, and
// NCCL only moves bytes (grouped ncclSend/ncclRecv for the all-to-all, one ncclBroadcast per owner for
// the gather of unequal slices, ncclAllGather for the small host collectives). So no NCCL setting
// (NCCL_ALGO, NCCL_PROTO, the number of channels, the network) changes a result, only its speed.
//
// Never a hang: a communicator this group creates is non-blocking (ncclConfig_t::blocking = 0), and every
// operation is polled (ncclCommGetAsyncError, cudaStreamQuery) until it completes or the deadline
// passes; then the communicator is aborted (ncclCommAbort) and a towerpipe::error names the rank and the
// operation. A caller's communicator is aborted too unless the caller says otherwise
// (caller_communicator::leave_to_caller): NCCL kernels spinning on a peer that never comes block every
// device-wide wait after them, such as the cudaFree of the pipeline's buffers while the error unwinds.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/comm/device_collectives.hpp"
#include "towerpipe/cuda/memory.cuh"

namespace towerpipe {

class nccl_process_group final : public process_group, public device_collectives<detail::cuda_stream> {
 public:
  // What becomes of a caller's communicator when an operation passes the deadline. abort_at_deadline:
  // aborted (ncclCommAbort frees it: the caller must not destroy it then; the error says so).
  // leave_to_caller: left as it is; the caller must abort it before anything waits for the device
  // (destroying the pipeline does), or that wait hangs.
  enum class caller_communicator { abort_at_deadline, leave_to_caller };

  // Creates this rank's communicator from an id every rank shares (ncclGetUniqueId on one rank).
  nccl_process_group(const ncclUniqueId& id, int rank, int ranks, int device,
                     std::chrono::milliseconds deadline = std::chrono::seconds(60))
      : deadline_(deadline), device_(device), rank_(rank), size_(ranks), owned_(true), stream_(device) {
    detail::device_guard on(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = ncclCommInitRankConfig(&comm_, ranks, id, rank, &config);
    if (started != ncclSuccess && started != ncclInProgress) fail_with(started, "creating the communicator");
    wait_for_communicator("creating the communicator");
  }
  // Uses the caller's communicator on `device` (the one it was created for); the caller destroys it.
  nccl_process_group(ncclComm_t comm, int device, std::chrono::milliseconds deadline = std::chrono::seconds(60),
                     caller_communicator at_deadline = caller_communicator::abort_at_deadline)
      : deadline_(deadline),
        device_(device),
        owned_(false),
        abort_at_deadline_(at_deadline == caller_communicator::abort_at_deadline),
        comm_(comm),
        stream_(device) {
    check(ncclCommUserRank(comm, &rank_), "reading the communicator's rank");
    check(ncclCommCount(comm, &size_), "reading the communicator's size");
  }
  // A communicator of its own is finalised (flushing what it has queued) within the deadline, else aborted.
  ~nccl_process_group() override {
    if (!owned_ || comm_ == nullptr) return;
    const detail::device_guard on(device_, std::nothrow);
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t state = ncclCommFinalize(comm_);
    while (state == ncclInProgress && std::chrono::steady_clock::now() - start <= deadline_) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  nccl_process_group(const nccl_process_group&) = delete;
  nccl_process_group& operator=(const nccl_process_group&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device_of_buffers() const override { return device_; }
  std::string describe() const override { return "NCCL, " + std::to_string(size_) + " processes"; }

  // Host collectives: through a device buffer of the group's (small data: configuration, weights, losses).
  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char* what) override {
    const auto mine = static_cast<std::uint64_t>(bytes);
    std::vector<std::uint64_t> sizes(static_cast<std::size_t>(size_));
    all_gather_equal(&mine, sizes.data(), sizeof mine, what);
    std::uint64_t widest = 0;
    for (std::uint64_t n : sizes) widest = std::max(widest, n);
    std::vector<char> padded(static_cast<std::size_t>(widest), '\0'), all(static_cast<std::size_t>(widest) * sizes.size());
    if (bytes != 0) std::memcpy(padded.data(), data, bytes);
    all_gather_equal(padded.data(), all.data(), static_cast<std::size_t>(widest), what);
    std::vector<std::string> texts;
    for (std::size_t r = 0; r < sizes.size(); ++r)
      texts.emplace_back(all.data() + r * static_cast<std::size_t>(widest), static_cast<std::size_t>(sizes[r]));
    return texts;
  }
  void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                  char* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                  const char* what) override {
    char* device_send = stage_in(send, detail::extent_of(send_offsets, send_bytes), 0);
    char* device_recv = scratch(detail::extent_of(recv_offsets, recv_bytes), 1);
    all_to_all_on_device(device_send, send_offsets, send_bytes, device_recv, recv_offsets, recv_bytes, stream_, what);
    stage_out(recv, device_recv, detail::extent_of(recv_offsets, recv_bytes));
  }
  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char* what) override {
    const std::size_t all = detail::extent_of(block_offsets, block_bytes);
    char* device_mine = stage_in(mine, block_bytes[static_cast<std::size_t>(rank_)], 0);
    char* device_out = scratch(all, 1);
    all_gather_blocks_on_device(device_mine, device_out, block_offsets, block_bytes, stream_, what);
    stage_out(out, device_out, all);
  }

  // Device collectives: grouped point-to-point for the all-to-all.
  void all_to_all_on_device(const void* send, const std::vector<std::size_t>& send_offsets,
                            const std::vector<std::size_t>& send_bytes, void* recv, const std::vector<std::size_t>& recv_offsets,
                            const std::vector<std::size_t>& recv_bytes, const detail::cuda_stream& on_stream, const char* what) override {
    const cudaStream_t stream = on_stream.get();
    detail::device_guard on(device_);
    run_group(what, stream, [&] {
      for (int r = 0; r < size_; ++r) {
        const auto peer = static_cast<std::size_t>(r);
        if (send_bytes[peer] != 0)
          check(ncclSend(static_cast<const char*>(send) + send_offsets[peer], send_bytes[peer], ncclUint8, r, comm_, stream), what);
        if (recv_bytes[peer] != 0)
          check(ncclRecv(static_cast<char*>(recv) + recv_offsets[peer], recv_bytes[peer], ncclUint8, r, comm_, stream), what);
      }
    });
  }
  // One broadcast per owner, grouped: NCCL's all-gather for blocks of unequal sizes (ncclAllGather takes
  // equal counts, and the owners' slices are whole chunks, so unequal).
  void all_gather_blocks_on_device(const void* mine, void* out, const std::vector<std::size_t>& block_offsets,
                                   const std::vector<std::size_t>& block_bytes, const detail::cuda_stream& on_stream, const char* what) override {
    const cudaStream_t stream = on_stream.get();
    detail::device_guard on(device_);
    run_group(what, stream, [&] {
      for (int r = 0; r < size_; ++r) {
        const auto owner = static_cast<std::size_t>(r);
        if (block_bytes[owner] == 0) continue;
        char* target = static_cast<char*>(out) + block_offsets[owner];
        check(ncclBroadcast(r == rank_ ? mine : target, target, block_bytes[owner], ncclUint8, r, comm_, stream), what);
      }
    });
  }

 private:
  // Enqueues the calls of `body` as one NCCL group on `stream`, then waits for them (see the top).
  template <class Body>
  void run_group(const char* what, cudaStream_t stream, Body&& body) {
    if (aborted_) detail::fail("rank ", rank_, ": ", what, ": the NCCL communicator was aborted after an earlier error");
    check(ncclGroupStart(), what);
    body();
    const ncclResult_t ended = ncclGroupEnd();
    if (ended != ncclSuccess && ended != ncclInProgress) fail_with(ended, what);
    wait_for_communicator(what);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) TOWERPIPE_CUDA_CHECK(state);
      poll_communicator(what, start);
    }
    poll_communicator(what, start);  // an error NCCL raised while the stream finished
  }

  // Equal-sized blocks of host data, through the scratch buffers (ncclAllGather).
  void all_gather_equal(const void* mine, void* all, std::size_t bytes, const char* what) {
    if (bytes == 0) return;  // nothing to move (and no buffer to name)
    char* device_mine = stage_in(mine, bytes, 0);
    char* device_all = scratch(bytes * static_cast<std::size_t>(size_), 1);
    detail::device_guard on(device_);
    run_group(what, stream_.get(), [&] { check(ncclAllGather(device_mine, device_all, bytes, ncclUint8, comm_, stream_.get()), what); });
    stage_out(all, device_all, bytes * static_cast<std::size_t>(size_));
  }

  char* scratch(std::size_t bytes, int which) {
    if (bytes > scratch_bytes_[which]) {
      scratch_[which] = cuda_device_memory{device_}.allocate<char>(bytes, 256);
      scratch_bytes_[which] = bytes;
    }
    return scratch_[which].get();
  }
  char* stage_in(const void* host, std::size_t bytes, int which) {
    char* device = scratch(bytes, which);
    detail::device_guard on(device_);
    if (bytes != 0) TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_.get()));
    return device;
  }
  void stage_out(void* host, const char* device, std::size_t bytes) {
    detail::device_guard on(device_);
    if (bytes != 0) TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_.get()));
    TOWERPIPE_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  }

  // Until the communicator has no operation in progress (non-blocking communicators), within the deadline.
  void wait_for_communicator(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), what);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail_with(state, what);
      past_deadline(what, start);
      std::this_thread::yield();
    }
  }
  // One poll while a stream works: an error NCCL raised, or the deadline.
  void poll_communicator(const char* what, std::chrono::steady_clock::time_point start) {
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), what);
    if (state != ncclSuccess && state != ncclInProgress) fail_with(state, what);
    past_deadline(what, start);
    std::this_thread::yield();
  }
  void past_deadline(const char* what, std::chrono::steady_clock::time_point start) {
    if (std::chrono::steady_clock::now() - start <= deadline_) return;
    const bool abort = owned_ || abort_at_deadline_;
    if (abort) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    aborted_ = true;
    detail::fail("rank ", rank_, " of ", size_, ": ", what, " did not complete within ", std::chrono::duration<double>(deadline_).count(),
                 " s: another process has exited, stopped, or is not making the same call (",
                 owned_  ? "the NCCL communicator was aborted; end the program"
                 : abort ? "the caller's NCCL communicator was aborted, which frees it: do not destroy it; end the program"
                         : "the caller's NCCL communicator is left as it is: abort it with ncclCommAbort before anything waits "
                           "for the device, then end the program",
                 ")");
  }

  void check(ncclResult_t status, const char* what) {
    if (status != ncclSuccess && status != ncclInProgress) fail_with(status, what);
  }
  [[noreturn]] void fail_with(ncclResult_t status, const char* what) {
    const char* detail_text = comm_ != nullptr ? ncclGetLastError(comm_) : "";
    detail::fail("rank ", rank_, ": NCCL failed in ", what, ": ", ncclGetErrorString(status),
                 detail_text != nullptr && *detail_text != '\0' ? std::string(" (") + detail_text + ")" : std::string());
  }

  std::chrono::milliseconds deadline_;
  int device_, rank_ = 0, size_ = 1;
  bool owned_, abort_at_deadline_ = true, aborted_ = false;
  ncclComm_t comm_ = nullptr;
  detail::cuda_stream stream_;  // the host collectives' stream
  cuda_device_memory::owner<char> scratch_[2];
  std::size_t scratch_bytes_[2] = {0, 0};
};

}  // namespace towerpipe
