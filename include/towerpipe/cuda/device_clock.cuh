#pragma once
// Device event times on the host clock: an event that a device completed at a known host time is the
// origin; any later timing event recorded on that device converts to host time through the elapsed
// time between the two (towers on different devices share no device clock).

#include <chrono>

#include "towerpipe/cuda/device.cuh"
#include "towerpipe/trace/timeline.hpp"

namespace towerpipe {
namespace detail {

class device_clock {
 public:
  // Records the origin on `stream` and waits for it: call once, before the work to be timed.
  template <class Executor>
  device_clock(const Executor&, int device, const cuda_stream& stream) : origin_(device, true) {
    origin_.record(stream);
    origin_.synchronize();
    origin_host_ = timeline::clock::now();
  }

  // The host time at which `event` (a completed timing event of this device) happened.
  timeline::clock::time_point host_time(const cuda_event& event) const {
    return origin_host_ + std::chrono::duration_cast<timeline::clock::duration>(
                              std::chrono::duration<double>(seconds_between(origin_, event)));
  }

 private:
  cuda_event origin_;
  timeline::clock::time_point origin_host_;
};

}  // namespace detail
}  // namespace towerpipe
