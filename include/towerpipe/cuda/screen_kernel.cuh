#pragma once
// The gradient screen on a device (kernels/screen.hpp): a warp per tile runs the lane program, adds the
// 32 lane sums with warp shuffles in the screen's pairwise order, and takes the smallest non-finite key
// with cub::WarpReduce (a minimum, so its order does not matter) and one atomicMin per warp that found
// one. The shuffle tree is written out rather than left to cub::WarpReduce because the norm's order must
// be the one the host follows, bit for bit, and CUB does not promise an order for sums.

#include <cuda_runtime.h>

#include <cub/warp/warp_reduce.cuh>
#include <cuda/functional>

#include <algorithm>
#include <utility>
#include <vector>

#include "towerpipe/core/host_memory.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/kernels/screen.hpp"

namespace towerpipe {
namespace detail {

constexpr int screen_warps_per_block = 4;

template <class Source, class T>
__global__ void __launch_bounds__(screen_warps_per_block * 32)
    screen_kernel(Source source, pointer_table<T> averaged, const tensor_chunk* tiles, int tile_count,
                  double* tile_sums, nonfinite_key* first_nonfinite) {
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int tile = static_cast<int>(blockIdx.x) * screen_warps_per_block + warp;
  if (tile >= tile_count) return;  // the whole warp: tile depends on the warp only
  const unsigned lane = threadIdx.x % 32;
  const screen_lane_result mine = screen_lane(source, averaged, tiles[tile], lane);
  // Lane 0 ends with ((s0 + s1) + (s2 + s3)) + ...: pairwise_lane_sum's tree.
  double sum = mine.sum_of_squares;
  for (unsigned offset = 1; offset < screen_lanes; offset *= 2)
    sum = rounded_add(sum, __shfl_down_sync(0xFFFFFFFFu, sum, offset));
  using warp_minimum = cub::WarpReduce<nonfinite_key>;
  __shared__ typename warp_minimum::TempStorage storage[screen_warps_per_block];
  const nonfinite_key first = warp_minimum(storage[warp]).Reduce(mine.first_nonfinite, ::cuda::minimum<>{});
  if (lane == 0) {
    tile_sums[tile] = sum;
    if (first != no_nonfinite) atomicMin(first_nonfinite, first);
  }
}

// The screen's tile table and outputs on one device, and its launch.
class device_screen {
 public:
  template <class Executor>
  device_screen(const Executor& exec, const variable_set& variables, int device)
      : device_screen(exec, make_chunk_table(variables, screen_tile_elements), device) {}
  // The screen of some of the tiles (reduce::sharded: an owner's), in the order given.
  template <class Executor>
  device_screen(const Executor&, std::vector<tensor_chunk> tiles, int device)
      : device_(device),
        tiles_(std::move(tiles)),
        device_tiles_(cuda_device_memory{device}.allocate<tensor_chunk>(std::max<std::size_t>(tiles_.size(), 1), 256)),
        tile_sums_(cuda_device_memory{device}.allocate<double>(std::max<std::size_t>(tiles_.size(), 1), 256)),
        first_nonfinite_(cuda_device_memory{device}.allocate<nonfinite_key>(1, 256)),
        host_first_(cuda_pinned_memory{}.allocate<nonfinite_key>(1, 64)) {
    device_guard on(device);
    if (!tiles_.empty()) copy_to_device_now(device_tiles_.get(), tiles_.data(), tiles_.size() * sizeof(tensor_chunk));
  }

  // The key word to lower, for passes that check raw operands before the screen (the p2p tree's rounds).
  nonfinite_key* first_nonfinite() const { return first_nonfinite_.get(); }

  // Resets the key; call on `stream` before anything of the step records into it.
  void reset(const cuda_stream& stream) const {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaMemsetAsync(first_nonfinite_.get(), 0xFF, sizeof(nonfinite_key), stream.get()));
  }

  const std::vector<tensor_chunk>& tiles() const { return tiles_; }

  // Over the tiles [run.first, run.last) (every_chunk: all; a gradient bucket's); every launch since
  // reset() lowers the one key, each writes its tiles' sums.
  template <class Source, class T>
  void launch(const Source& source, const pointer_table<T>& averaged, const cuda_stream& stream,
              chunk_group run = every_chunk) const {
    if (run.last == every_chunk.last) run.last = tiles_.size();
    if (run.first > run.last || run.last > tiles_.size())
      fail("screen tiles [", run.first, ", ", run.last, ") launched from a table of ", tiles_.size());
    device_guard on(device_);
    const int tiles = static_cast<int>(run.last - run.first);
    const unsigned blocks = static_cast<unsigned>(std::max(1, (tiles + screen_warps_per_block - 1) / screen_warps_per_block));
    screen_kernel<Source, T><<<blocks, screen_warps_per_block * 32, 0, stream.get()>>>(
        source, averaged, device_tiles_.get() + run.first, tiles, tile_sums_.get() + run.first, first_nonfinite_.get());
    TOWERPIPE_CUDA_CHECK(cudaGetLastError());
    read_key(stream);
  }
  // The key as it stands on `stream`, for results().
  void read_key(const cuda_stream& stream) const {
    device_guard on(device_);
    TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(host_first_.get(), first_nonfinite_.get(), sizeof(nonfinite_key),
                                         cudaMemcpyDeviceToHost, stream.get()));
  }

  // After the stream has passed launch(): what the screen found.
  screen_partials results() const {
    device_guard on(device_);
    screen_partials partials;
    partials.tile_sums.resize(tiles_.size());
    if (!tiles_.empty())  // an owner of no tiles (more owners than chunks) has nothing to copy
      TOWERPIPE_CUDA_CHECK(cudaMemcpy(partials.tile_sums.data(), tile_sums_.get(), tiles_.size() * sizeof(double),
                                      cudaMemcpyDeviceToHost));
    partials.first_nonfinite = *host_first_.get();
    return partials;
  }

 private:
  int device_;
  std::vector<tensor_chunk> tiles_;
  cuda_device_memory::owner<tensor_chunk> device_tiles_;
  cuda_device_memory::owner<double> tile_sums_;
  cuda_device_memory::owner<nonfinite_key> first_nonfinite_;
  cuda_pinned_memory::owner<nonfinite_key> host_first_;
};

}  // namespace detail
}  // namespace towerpipe
