#pragma once
// The simulated devices' work: ops in per-stream FIFO queues, events as their last record, and the
// scheduler that picks, among the streams whose next op may run (an op that waits for an event's
// record runs only after that record), one at random from a seeded generator. Any order it produces
// is one a GPU could: stream order and event waits are all it respects. Not thread-safe: the engine
// (executor/simulated/engine.hpp) calls it under its lock.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "towerpipe/executor/simulated/access_history.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/vector_clock.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

// Bytes [lo, hi) of an allocation that an op touches.
struct op_access {
  allocation holder;
  std::uintptr_t lo, hi;
  access_kind kind;
};

struct op {
  std::uint64_t sequence = 0;
  std::shared_ptr<const std::string> name;  // "launch of ... (op #12) on stream 'x' (#3, device 1)"
  std::size_t stream = 0;
  vector_clock clock;  // the stream's clock joined with the host's and the awaited record's, ticked
  epoch at;
  std::vector<op_access> accesses;
  std::shared_ptr<const op> awaited;  // a wait: the record it waits for
  std::function<void()> work;        // what it does to memory; none for records and waits
  double seconds = 0;                // how long it takes on the simulated clock
  bool executed = false;
  double finished_at = 0;  // simulated time, once executed
};

struct stream_state {
  int device;
  std::string label;
  std::size_t component;  // its component of the vector clocks
  vector_clock clock;     // of its last op
  std::deque<std::shared_ptr<op>> pending;
  double ready_at = 0;  // simulated time its last op finished
};

struct event_state {
  int device;
  bool timing;
  std::shared_ptr<const op> last_record;  // null until recorded
};

class op_queues {
 public:
  explicit op_queues(std::uint64_t seed) : random_(seed) {}

  std::size_t add_stream(int device, std::string label) {
    streams_.push_back({device, std::move(label), streams_.size() + 1, {}, {}, 0});
    return streams_.size() - 1;
  }
  std::size_t add_event(int device, bool timing) {
    events_.push_back({device, timing, nullptr});
    return events_.size() - 1;
  }
  stream_state& stream(std::size_t id) { return streams_[id]; }
  const stream_state& stream(std::size_t id) const { return streams_[id]; }
  event_state& event(std::size_t id) { return events_[id]; }
  std::deque<stream_state>& streams() { return streams_; }

  // The next op to run, taken off its queue; null when nothing is pending.
  std::shared_ptr<op> take_next() {
    ready_.clear();
    for (std::size_t s = 0; s < streams_.size(); ++s) {
      const std::deque<std::shared_ptr<op>>& queue = streams_[s].pending;
      if (!queue.empty() && (queue.front()->awaited == nullptr || queue.front()->awaited->executed)) ready_.push_back(s);
    }
    if (ready_.empty()) return nullptr;
    stream_state& chosen = streams_[ready_[static_cast<std::size_t>(random_() % ready_.size())]];
    std::shared_ptr<op> next = std::move(chosen.pending.front());
    chosen.pending.pop_front();
    return next;
  }

 private:
  // Deques: references stay valid as streams and events are added. Streams outlive their handles, so
  // that the work enqueued on them still runs.
  std::deque<stream_state> streams_;
  std::deque<event_state> events_;
  std::vector<std::size_t> ready_;
  std::mt19937_64 random_;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
