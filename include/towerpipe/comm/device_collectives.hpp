#pragma once
// device_collectives — the two bulk collectives of reduce::sharded across processes with device towers
// (reduce/sharded/device_towers_across_processes.hpp), on device memory. A process_group that can move
// device memory itself (comm/nccl.cuh) implements this interface too; for any other group (comm/mpi.hpp,
// comm/thread_group.hpp) the reducer uses staged_collectives below, which copies through pinned host
// memory and calls the group's host collectives.
// Why: docs/design-notes.md#comm-device_collectives

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "towerpipe/comm/process_group.hpp"

namespace towerpipe {

// Stream: the executor's stream type (docs/architecture.md, "The executor").
template <class Stream>
class device_collectives {
 public:
  virtual ~device_collectives() = default;
  // The device whose memory and streams it takes; -1: any.
  virtual int device_of_buffers() const = 0;
  virtual void all_to_all_on_device(const void* send, const std::vector<std::size_t>& send_offsets,
                                    const std::vector<std::size_t>& send_bytes, void* recv,
                                    const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                                    const Stream& stream, const char* what) = 0;
  virtual void all_gather_blocks_on_device(const void* mine, void* out, const std::vector<std::size_t>& block_offsets,
                                           const std::vector<std::size_t>& block_bytes, const Stream& stream, const char* what) = 0;
};

namespace detail {

// The end of the blocks' extent: the bytes from the buffer's start that the blocks cover.
inline std::size_t extent_of(const std::vector<std::size_t>& offsets, const std::vector<std::size_t>& bytes) {
  std::size_t end = 0;
  for (std::size_t r = 0; r < offsets.size(); ++r) end = std::max(end, offsets[r] + bytes[r]);
  return end;
}

// Device collectives over a process group's host collectives: device to pinned host memory, the group's
// collective, back to the device. Costs two passes over each buffer through host memory; works with any
// transport.
template <class Executor>
class staged_collectives final : public device_collectives<typename Executor::stream> {
 public:
  using stream = typename Executor::stream;
  staged_collectives(const Executor& exec, process_group& group) : exec_(exec), group_(group) {}
  int device_of_buffers() const override { return -1; }

  void all_to_all_on_device(const void* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                            void* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>& recv_bytes,
                            const stream& s, const char* what) override {
    const std::size_t out = extent_of(send_offsets, send_bytes), in = extent_of(recv_offsets, recv_bytes);
    staged(send, out, recv, in, s, [&](const char* host_send, char* host_recv) {
      group_.all_to_all(host_send, send_offsets, send_bytes, host_recv, recv_offsets, recv_bytes, what);
    });
  }

  void all_gather_blocks_on_device(const void* mine, void* out, const std::vector<std::size_t>& block_offsets,
                                   const std::vector<std::size_t>& block_bytes, const stream& s, const char* what) override {
    const std::size_t my_bytes = block_bytes[static_cast<std::size_t>(group_.rank())];
    staged(mine, my_bytes, out, extent_of(block_offsets, block_bytes), s, [&](const char* host_mine, char* host_all) {
      group_.all_gather_blocks(host_mine, host_all, block_offsets, block_bytes, what);
    });
  }

 private:
  // `out` bytes of `send` to host memory, the group's collective from there into host memory, `in` bytes of that to `recv`.
  template <class Collective>
  void staged(const void* send, std::size_t out, void* recv, std::size_t in, const stream& s, Collective&& collective) {
    if (out > out_bytes_) host_out_ = exec_.pinned_memory().template allocate<char>(out_bytes_ = out);
    if (in > in_bytes_) host_in_ = exec_.pinned_memory().template allocate<char>(in_bytes_ = in);
    exec_.copy_async(host_out_.get(), send, out, s);
    exec_.synchronize(s);
    exec_.host_reads(host_out_.get(), out);
    exec_.host_writes(host_in_.get(), in);
    collective(static_cast<const char*>(host_out_.get()), host_in_.get());
    exec_.copy_async(recv, host_in_.get(), in, s);
    exec_.synchronize(s);
  }

  const Executor& exec_;
  process_group& group_;
  typename decltype(std::declval<const Executor&>().pinned_memory())::template owner<char> host_out_, host_in_;
  std::size_t out_bytes_ = 0, in_bytes_ = 0;
};

}  // namespace detail
}  // namespace towerpipe
