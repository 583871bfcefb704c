#pragma once
// A device tower's view of the step (exec/tower_context.hpp has the gradient contract): the shard,
// parameters and gradients are in the tower's device memory, and work goes on stream(). On simulated
// devices (exec::simulated) the tower function runs on the host "as" its stream: each access through the
// context is declared to the executor (stream_host_access), which orders it after the stream's work so
// far; on CUDA those declarations cost nothing.

#include <cstddef>
#include <utility>

#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/kernels/access_hook.hpp"

namespace towerpipe {
namespace detail {

template <class Layout, class Executor>
class device_towers;

template <class Layout, class Executor>
class device_tower_context
    : public tower_context_base<device_tower_context<Layout, Executor>,
                                typename Layout::template buffer<decltype(std::declval<const Executor&>().device_memory(0))>,
                                typename Layout::value_type> {
  using base = typename device_tower_context::tower_context_base;

 public:
  using value_type = typename Layout::value_type;

  int device() const { return device_; }
  // The stream the tower's work goes on (cudaStream_t with exec::cuda).
  auto stream() const { return stream_.get(); }
  const Executor& executor() const { return exec_; }

  // A device float for tower functions that return nothing: they write their shard's mean loss here
  // (on stream()), and the step reads it back with the rest.
  float* device_loss() const {
    exec_.stream_host_access(stream_, device_loss_, sizeof(float), operand_access::write);
    return device_loss_;
  }

 private:
  friend base;
  friend class device_towers<Layout, Executor>;
  template <class... BaseArguments>
  device_tower_context(const Executor& exec, int device, const typename Executor::stream& stream, float* device_loss,
                       BaseArguments&&... arguments)
      : base(std::forward<BaseArguments>(arguments)...), exec_(exec), device_(device), stream_(stream), device_loss_(device_loss) {
    for (const batch_input& input : this->shard().inputs()) exec_.stream_host_access(stream_, input.data(), input.bytes(), operand_access::read);
  }

  void fill_zero(value_type* target, std::size_t count) const {
    exec_.memset_async(target, 0, count * sizeof(value_type), stream_);
  }
  // From device memory (this device, or one with peer access), on stream().
  void copy_into(value_type* target, const value_type* source, std::size_t count) const {
    exec_.copy_async(target, source, count * sizeof(value_type), stream_);
  }
  // The base's hook: the tower function reads a parameter, or writes a gradient, from here on.
  void note_access(const value_type* data, std::size_t count, operand_access access) const {
    exec_.stream_host_access(stream_, data, count * sizeof(value_type), access);
  }

  const Executor& exec_;
  int device_;
  const typename Executor::stream& stream_;
  float* device_loss_;
};

}  // namespace detail
}  // namespace towerpipe
