#pragma once
// The simulated devices' happens-before core: the ops enqueued on streams, run lazily when the host
// synchronises with them, the host clock, and the race detector; the engine
// (executor/simulated/engine.hpp) builds the API on it and calls it under its lock.
// Work runs in a seeded random order that keeps stream order and event waits only; every op carries vector clocks, and
// conflicting accesses not ordered by happens-before are races (executor/simulated/access_history.hpp).
// Why: docs/design-notes.md#executor-simulated-ordering

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/executor/simulated/access_history.hpp"
#include "towerpipe/executor/simulated/memory_registry.hpp"
#include "towerpipe/executor/simulated/op_queue.hpp"
#include "towerpipe/executor/simulated/vector_clock.hpp"

namespace towerpipe {
namespace detail {
namespace simulation {

// The simulated clock: an op takes a latency plus its bytes at a bandwidth, and starts when its stream
// and the record it waits for are done, so event times depend on the work and its dependencies only.
constexpr double op_latency_seconds = 2e-6;
constexpr double device_bytes_per_second = 2e12;  // a launch, a copy within one device
constexpr double link_bytes_per_second = 5e10;    // a copy between devices or with the host

// Throws the first of `violations`, with a count of the others, and empties it; nothing if empty.
inline void throw_first(std::vector<std::string>& violations) {
  if (violations.empty()) return;
  const std::string first = violations.front();
  const std::size_t more = violations.size() - 1;
  violations.clear();
  if (more == 0) fail(first);
  fail(first, " (and ", more, " more violation(s) found with it)");
}

inline std::string stream_text(const stream_state& s) {
  return make_message("stream '", s.label, "' (#", s.component, ", device ", s.device, ")");
}

class ordering {
 public:
  explicit ordering(std::uint64_t seed) : queues_(seed) {}
  ordering(const ordering&) = delete;
  ordering& operator=(const ordering&) = delete;

  op_queues& queues() { return queues_; }
  const vector_clock& host_clock() const { return host_clock_; }

  // ---- the violations found by the call under way ----
  void report(std::string violation) { found_.push_back(std::move(violation)); }
  const std::vector<std::string>& found() const { return found_; }
  void throw_found() { throw_first(found_); }
  void forget_found() { found_.clear(); }

  // ---- ops ----
  std::shared_ptr<op> enqueue(std::size_t stream, const std::string& what, std::vector<op_access> accesses, std::function<void()> work,
                              double seconds, std::shared_ptr<const op> awaited = nullptr) {
    stream_state& s = queues_.stream(stream);
    auto o = std::make_shared<op>();
    o->sequence = ++op_sequence_;
    o->name = std::make_shared<const std::string>(make_message(what, " (op #", o->sequence, ") on ", stream_text(s)));
    o->stream = stream;
    join(s.clock, host_clock_);
    if (awaited != nullptr) join(s.clock, awaited->clock);
    o->at = {s.component, tick(s.clock, s.component)};
    o->clock = s.clock;
    o->accesses = std::move(accesses);
    o->awaited = std::move(awaited);
    o->work = std::move(work);
    o->seconds = seconds;
    s.pending.push_back(o);
    return o;
  }

  // ---- the host synchronising ----
  // Runs what is pending on `stream`; the host clock is not joined (stream_op is the stream's own).
  void drain(std::size_t stream) {
    run_until([&] { return queues_.stream(stream).pending.empty(); });
  }
  void drain_and_join(std::size_t stream) {
    drain(stream);
    join(host_clock_, queues_.stream(stream).clock);
  }
  void drain_device_and_join(int device) {
    const auto on_device = [&](const stream_state& s) { return s.device == device; };
    run_until([&] {
      return std::none_of(queues_.streams().begin(), queues_.streams().end(),
                          [&](const stream_state& s) { return on_device(s) && !s.pending.empty(); });
    });
    for (const stream_state& s : queues_.streams()) {
      if (on_device(s)) join(host_clock_, s.clock);
    }
  }
  void wait_for(const std::shared_ptr<const op>& record) {
    run_until([&] { return record->executed; });
    join(host_clock_, record->clock);
  }

  // Freeing drains the owning device (every device, for pinned memory) and any work using the memory (cudaFree).
  void free(allocation freed, memory_registry& memory) {
    const auto drained_here = [&](const stream_state& s) { return freed.owner == pinned_host || s.device == freed.owner; };
    std::vector<std::shared_ptr<const op>> users;  // pending work elsewhere that uses the memory
    for (const stream_state& s : queues_.streams()) {
      for (const std::shared_ptr<op>& o : s.pending) {
        if (std::any_of(o->accesses.begin(), o->accesses.end(), [&](const op_access& a) { return a.holder.id == freed.id; }))
          users.push_back(o);
      }
    }
    run_until([&] {
      return std::all_of(users.begin(), users.end(), [](const std::shared_ptr<const op>& o) { return o->executed; }) &&
             std::none_of(queues_.streams().begin(), queues_.streams().end(),
                          [&](const stream_state& s) { return drained_here(s) && !s.pending.empty(); });
    });
    for (const stream_state& s : queues_.streams()) {
      if (drained_here(s)) join(host_clock_, s.clock);
    }
    host_op(make_message("free of ", describe(freed)), {{freed, freed.base, freed.end(), access_kind::write}});
    history_.forget(freed.id);
    memory.release(freed.base);
  }

  // ---- accesses made now ----
  // An access the host makes now, as one op of its own.
  void host_op(const std::string& what, const std::vector<op_access>& accesses) {
    const epoch at{host_component, tick(host_clock_, host_component)};
    const std::uint64_t sequence = ++op_sequence_;
    const auto name = std::make_shared<const std::string>(make_message("the host's ", what, " (op #", sequence, ")"));
    check_and_record(accesses, host_clock_, at, sequence, name);
  }
  // Host code acting as `stream`'s own work, as an op of the stream made now: ordered after the
  // stream's work and the host's past; the host clock is not joined.
  void stream_op(std::size_t stream, const op_access& access) {
    stream_state& s = queues_.stream(stream);
    join(s.clock, host_clock_);
    const epoch at{s.component, tick(s.clock, s.component)};
    const std::uint64_t sequence = ++op_sequence_;
    const auto name = std::make_shared<const std::string>(make_message("host access as ", stream_text(s), " (op #", sequence, ")"));
    check_and_record({access}, s.clock, at, sequence, name);
  }

 private:
  template <class Done>
  void run_until(const Done& done) {
    while (!done()) {
      const std::shared_ptr<op> next = queues_.take_next();
      if (next == nullptr) fail("simulation: the awaited work cannot run (nothing is ready)");
      execute(*next);
    }
  }

  void execute(op& o) {
    for (const op_access& a : o.accesses) {
      history_.conflicts(a.holder.id, a.lo, a.hi, a.kind, o.clock, [&](const access_record& earlier) {
        report_race(earlier.op, o.sequence, race_text(a.holder, *earlier.by, earlier.kind, earlier.lo, earlier.hi, *o.name, a, ""));
      });
    }
    if (o.work) {
      try {
        o.work();
      } catch (...) {
        found_.push_back(current_exception_text());
      }
      o.work = nullptr;  // what it captured goes
    }
    for (const op_access& a : o.accesses) history_.record(a.holder.id, {a.lo, a.hi, a.kind, o.at, o.sequence, o.name}, o.clock);
    stream_state& s = queues_.stream(o.stream);
    const double start = std::max(s.ready_at, o.awaited != nullptr ? o.awaited->finished_at : 0.0);
    o.finished_at = s.ready_at = start + o.seconds;
    o.executed = true;
  }

  // Accesses made now by the host or as a stream: checked against what ran and against what is still
  // pending (which nothing orders before them: a synchronisation would have run it), then recorded.
  void check_and_record(const std::vector<op_access>& accesses, const vector_clock& clock, const epoch& at, std::uint64_t sequence,
                        const std::shared_ptr<const std::string>& name) {
    for (const op_access& a : accesses) {
      history_.conflicts(a.holder.id, a.lo, a.hi, a.kind, clock, [&](const access_record& earlier) {
        report_race(earlier.op, sequence, race_text(a.holder, *earlier.by, earlier.kind, earlier.lo, earlier.hi, *name, a, ""));
      });
      for (const stream_state& s : queues_.streams()) {
        for (const std::shared_ptr<op>& pending : s.pending) {
          for (const op_access& p : pending->accesses) {
            if (p.holder.id == a.holder.id && p.lo < a.hi && a.lo < p.hi && conflicting(p.kind, a.kind))
              report_race(pending->sequence, sequence,
                          race_text(a.holder, *pending->name, p.kind, p.lo, p.hi, *name, a, ", still pending,"));
          }
        }
      }
    }
    for (const op_access& a : accesses) history_.record(a.holder.id, {a.lo, a.hi, a.kind, at, sequence, name}, clock);
  }

  // A race between two ops is reported once, however many of their accesses conflict and from whichever
  // side it is seen (a host access that raced with pending work meets it again when the work runs).
  void report_race(std::uint64_t one, std::uint64_t other, std::string text) {
    if (reported_.insert({std::min(one, other), std::max(one, other)}).second) found_.push_back(std::move(text));
  }

  static std::string race_text(const allocation& holder, const std::string& earlier, access_kind earlier_kind,
                               std::uintptr_t earlier_lo, std::uintptr_t earlier_hi, const std::string& later, const op_access& access,
                               const char* earlier_state) {
    const auto bytes = [&](std::uintptr_t lo, std::uintptr_t hi) {
      return make_message("bytes [", lo - holder.base, ", ", hi - holder.base, ")");
    };
    return make_message("race on ", describe(holder), ": ", earlier, earlier_state, " ", verb(earlier_kind), " ",
                        bytes(earlier_lo, earlier_hi), " and ", later, " ", verb(access.kind), " ", bytes(access.lo, access.hi),
                        ", and no event wait or host synchronisation orders them");
  }

  access_history history_;
  op_queues queues_;
  vector_clock host_clock_{0};
  std::set<std::pair<std::uint64_t, std::uint64_t>> reported_;  // races, as pairs of op sequence numbers
  std::vector<std::string> found_;  // by the call under way
  std::uint64_t op_sequence_ = 0;
};

}  // namespace simulation
}  // namespace detail
}  // namespace towerpipe
