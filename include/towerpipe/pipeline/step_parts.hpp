#pragma once
// step_parts<Towers, Reducer> — drives a step's parts through the reducer (reduce/common/contract.hpp): each gradient
// bucket once every tower marked it, on a worker thread while the towers go on; after the towers, the rest as one part.
// Why: docs/design-notes.md#pipeline-step_parts

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "towerpipe/core/log.hpp"

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/executor/background_worker.hpp"
#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/reduce/common/contract.hpp"
#include "towerpipe/plan/buckets.hpp"
#include "towerpipe/trace/tracer.hpp"

namespace towerpipe {
namespace detail {

template <class Towers, class Reducer>
class step_parts final : public tower_ready_listener {
 public:
  // `element_bytes`: a gradient element as the towers hold it (for the buckets' byte cap).
  // `tracer`: where a bucket reduced during the towers is drawn (row "reduce (during towers)").
  step_parts(const variable_set& variables, const gradient_buckets& buckets, std::size_t element_bytes, Towers& towers,
             Reducer& reducer, const tracer& tracer)
      : plan_(make_bucket_plan(variables, buckets, element_bytes)),
        readiness_(plan_, towers.towers()),
        marks_per_step_(towers.towers() * variables.count()),
        towers_(towers),
        reducer_(reducer),
        tracer_(tracer) {
    towers_.prepare_bucket_events(plan_.count());
    towers_.set_ready_listener(this);
    if (plan_.count() == 1 && variables.count() > 1)
      one_bucket_note_ = make_message("one gradient bucket: the first bucket's cap of ", std::min(buckets.first_cap_bytes, buckets.cap_bytes),
                                      " bytes holds all ", variables.total_size() * element_bytes, " bytes of gradients, so marking them ",
                                      "ready overlaps nothing with the towers; pipeline_options::buckets.first_cap_bytes below that cuts ",
                                      "more buckets (or buckets.groups names them)");
  }
  ~step_parts() { towers_.set_ready_listener(nullptr); }

  std::size_t buckets() const { return plan_.count(); }

  // Before the towers run: the reducer begins the step; buckets go during the towers where the work says so.
  template <class Work>
  void begin(const Work& work, std::int64_t step) {
    step_ = step;
    bucket_span_ = work.checked ? "bucket: average + screen" : "bucket: average + apply";
    readiness_.reset();
    reduced_.assign(plan_.count(), 0);
    marks_left_ = marks_per_step_;
    during_towers_ = work.parts_during_towers;
    seconds_during_towers_ = 0;
    reducer_.begin_step(towers_, work);
  }

  void gradient_ready(std::size_t tower, std::size_t variable) override {
    if (!one_bucket_note_.empty() && !one_bucket_noted_.exchange(true)) log_note(one_bucket_note_);  // said once, at the first mark
    const mark_count marked = mark(tower, variable);
    if (!marked.completed || !during_towers_) return;
    worker_.post([this, bucket = marked.bucket, marks_to_come = marked.marks_to_come] {
      const auto start = timeline::clock::now();
      reducer_.reduce_part(towers_, step_part{plan_.buckets[bucket], bucket});
      reduced_[bucket] = marks_to_come ? hidden : reduced;
      tracer_.span(bucket_span_, start, timeline::clock::now(), step_, "reduce (during towers)");
    });
  }
  // What the tower left unmarked counts as marked. A bucket whose last tower completes it here waits for
  // the rest; but one this tower completes before another tower's explicit mark completes it goes during
  // the towers, and must see this tower's completion too (its event, recorded now, after all its work).
  void tower_returned(std::size_t tower, const std::vector<char>& ready) override {
    for (std::size_t v = 0; v < ready.size(); ++v) {
      if (!ready[v]) mark(tower, v);
    }
  }

  // After every tower returned: waits for the buckets in flight, then reduces what they left; rethrows
  // the first failure (a bucket's, else the rest's). `settling`: across processes, also after a tower or
  // a bucket failed, since the processes' exchanges must stay in step (reduce/common/contract.hpp).
  void after_towers(bool settling) {
    towers_ended_ = step_clock::now();
    std::exception_ptr failure;
    try {
      seconds_during_towers_ += worker_.drain();
    } catch (...) {
      if (!settling) throw;
      failure = std::current_exception();
    }
    rest_.clear();
    for (std::size_t b = 0; b < plan_.count(); ++b) {
      if (reduced_[b] == 0) rest_.insert(rest_.end(), plan_.buckets[b].begin(), plan_.buckets[b].end());
    }
    try {
      reducer_.reduce_part(towers_, step_part{rest_, no_bucket});  // even empty: the reducer finishes the parts there
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
    if (failure) std::rethrow_exception(failure);
  }

  // The buckets reduced while some tower still had gradients to mark (see the top).
  std::size_t buckets_during_towers() const { return std::count(reduced_.begin(), reduced_.end(), hidden); }
  double seconds_during_towers() const { return seconds_during_towers_; }
  // When the towers had ended (after_towers began).
  step_clock::time_point towers_ended() const { return towers_ended_; }

  // After a failure anywhere in the step: the buckets in flight waited for, the reducer's enqueued work
  // too; returns how many buckets were reduced. A failure of either is dropped: the step fails with the
  // first error (after a sticky CUDA error, the reducer's own synchronisation reports the fault again).
  std::size_t abandon() {
    try {
      worker_.drain();
    } catch (...) {
    }
    try {
      reducer_.abandon(towers_);
    } catch (...) {
    }
    return reduced_.size() - std::count(reduced_.begin(), reduced_.end(), 0);
  }

 private:
  // Marks `variable` ready on `tower`: the bucket that mark completed on that tower (or no_bucket), whether
  // it completed that bucket for every tower, and whether marks were still to come then. One lock for both
  // counts: of two towers' last marks, the one that completes the bucket sees the other counted, so the
  // bucket that the step's last mark completes is never reported as reduced during the towers.
  struct mark_count {
    std::size_t bucket;
    bool completed, marks_to_come;
  };
  mark_count mark(std::size_t tower, std::size_t variable) {
    const std::size_t bucket = readiness_.mark_for_tower(tower, variable);
    if (bucket != no_bucket && during_towers_) towers_.record_bucket_done(tower, bucket);
    const std::lock_guard<std::mutex> lock(marks_mutex_);
    const bool marks_to_come = --marks_left_ > 0;
    return {bucket, bucket != no_bucket && readiness_.tower_completed(bucket), marks_to_come};
  }

  bucket_plan plan_;
  bucket_readiness readiness_;  // refers to plan_
  std::size_t marks_per_step_;  // towers x variables
  Towers& towers_;
  Reducer& reducer_;
  const tracer& tracer_;
  std::int64_t step_ = 0;
  const char* bucket_span_ = "";
  bool during_towers_ = false;
  double seconds_during_towers_ = 0;  // the worker's, this step
  step_clock::time_point towers_ended_;
  static constexpr char reduced = 1, hidden = 2;  // reduced_: by the worker; and while marks were to come
  std::vector<char> reduced_;        // [bucket]: reduced, hidden or 0 this step (written by the worker, read after a drain)
  std::mutex marks_mutex_;
  std::size_t marks_left_ = 0;       // this step's marks still to come, over every tower (under marks_mutex_)
  std::vector<std::size_t> rest_;    // the variables after_towers reduces
  std::string one_bucket_note_;      // a model of one bucket (more than one variable): what its first mark logs
  std::atomic<bool> one_bucket_noted_{false};
  background_worker worker_;         // last: joined before the rest goes
};

}  // namespace detail
}  // namespace towerpipe
