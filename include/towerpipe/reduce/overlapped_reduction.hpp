#pragma once
// The overlapped reduction: each gradient bucket (step/buckets.hpp) reduced as soon as every tower has
// marked it ready (tower_context::gradient_ready), on a thread of its own (exec/background_worker.hpp)
// while the towers' backward passes go on; what is left when the towers return — the buckets the last
// tower completed by returning, or every bucket of towers that mark nothing — is reduced after them, as
// the unbucketed step is. A bucket's reduction is a part of the step over its variables: in a checked
// step the average and screen (the apply follows the verdict, after the towers), in an unchecked one
// the average, the optimizer and the new parameters. Bitwise the unbucketed step whatever the buckets
// (step/buckets.hpp says why).
//
// Taken by reducers that reduce parts of a step (reduce/reducer_contract.hpp: screen_part,
// average_and_apply_part); the pipeline drives it. Across processes the pipeline also settles the step
// (settle(): reduce::sharded's exchange of what the towers left) before the processes agree on the
// towers' outcome.

#include <cstddef>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/exec/background_worker.hpp"
#include "towerpipe/exec/tower_context.hpp"
#include "towerpipe/step/buckets.hpp"

namespace towerpipe {
namespace detail {

class overlapped_reduction final : public tower_ready_listener {
 public:
  // A part of the step (step/buckets.hpp): a bucket, on the worker while the towers run, or what is left
  // after them.
  using part = std::function<void(const step_part&)>;
  // Told on a tower's thread when that tower has completed a bucket (by its marks, or by returning),
  // before any other tower can see it complete, while buckets go during the towers (GPU towers record an
  // event on their stream there, which the bucket's pass waits for).
  using tower_done = std::function<void(std::size_t tower, std::size_t bucket)>;

  // `element_bytes`: a gradient element as the towers hold it (for the buckets' byte cap).
  overlapped_reduction(const variable_set& variables, const gradient_buckets& buckets, std::size_t towers,
                       std::size_t element_bytes, tower_done on_tower_done = {})
      : plan_(make_bucket_plan(variables, buckets, element_bytes)),
        readiness_(plan_, towers),
        tower_done_(std::move(on_tower_done)) {}

  const bucket_plan& plan() const { return plan_; }

  // Before the towers run: what reduces a part of this step, and whether buckets may be reduced while
  // they run (else every bucket waits for finish()); `settle`, where given, what settle() does.
  void begin_step(part reduce, bool during_towers, part settle = {}) {
    readiness_.reset();
    reduced_.assign(plan_.count(), 0);
    reduce_ = std::move(reduce);
    settle_ = std::move(settle);
    during_towers_ = during_towers;
    seconds_during_towers_ = 0;
  }

  void gradient_ready(std::size_t tower, std::size_t variable) override {
    const std::size_t bucket = readiness_.mark_for_tower(tower, variable);
    if (bucket == no_bucket) return;
    if (during_towers_ && tower_done_) tower_done_(tower, bucket);
    if (!readiness_.tower_completed(bucket) || !during_towers_) return;
    worker_.post([this, bucket] {
      reduce_(step_part{plan_.buckets[bucket], bucket});
      reduced_[bucket] = 1;
    });
  }
  // What the tower left unmarked counts as marked. A bucket whose last tower completes it here waits for
  // finish(); but one this tower completes before another tower's explicit mark completes it goes during
  // the towers, and must see this tower's completion too (its event, recorded now, after all its work).
  void tower_returned(std::size_t tower, const std::vector<char>& ready) override {
    for (std::size_t v = 0; v < ready.size(); ++v) {
      if (ready[v]) continue;
      const std::size_t bucket = readiness_.mark_for_tower(tower, v);
      if (bucket == no_bucket) continue;
      if (during_towers_ && tower_done_) tower_done_(tower, bucket);
      readiness_.tower_completed(bucket);
    }
  }

  struct outcome {
    std::size_t buckets_during_towers = 0;  // reduced while the towers ran
    double seconds_during_towers = 0;       // the worker's time on them
  };
  // After every tower returned, or one failed, while buckets went during the towers: waits for the
  // buckets in flight, then hands what is left to `settle` (where given) — also after a failure, which
  // it rethrows then (the first, a bucket's or the settling's). Across processes this runs before the
  // processes agree on the towers, so a bucket's failure is in every process's verdict even without a
  // `settle` (reduce::sharded with GPU towers): found only in finish(), it would fail this process
  // alone and leave the others in the exchange.
  void settle() {
    if (!during_towers_) return;
    std::exception_ptr failure;
    try {
      seconds_during_towers_ += worker_.drain();
    } catch (...) {
      failure = std::current_exception();
    }
    if (settle_) {
      try {
        settle_(step_part{rest(), no_bucket});
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
  // After every tower returned (and settle()): waits for the buckets in flight, then reduces the others.
  outcome finish() {
    outcome result;
    seconds_during_towers_ += worker_.drain();
    result.seconds_during_towers = seconds_during_towers_;
    for (char done : reduced_) result.buckets_during_towers += done != 0;
    reduce_(step_part{rest(), no_bucket});  // even empty: the reducer finishes the step there
    return result;
  }
  // After a tower failed: waits for the buckets in flight (a failure among them is dropped: the step
  // fails with the tower's) and returns how many were reduced.
  std::size_t abandon() {
    try {
      worker_.drain();
    } catch (...) {
    }
    std::size_t reduced = 0;
    for (char done : reduced_) reduced += done != 0;
    return reduced;
  }

 private:
  // The variables of the buckets not reduced during the towers (those in flight done).
  std::vector<std::size_t> rest() const {
    std::vector<std::size_t> variables;
    for (std::size_t b = 0; b < plan_.count(); ++b) {
      if (!reduced_[b]) variables.insert(variables.end(), plan_.buckets[b].begin(), plan_.buckets[b].end());
    }
    return variables;
  }

  bucket_plan plan_;
  bucket_readiness readiness_;  // refers to plan_
  tower_done tower_done_;
  part reduce_, settle_;
  bool during_towers_ = false;
  double seconds_during_towers_ = 0;  // the worker's, this step
  std::vector<char> reduced_;  // [bucket]: reduced by the worker this step (written there, read after a drain)
  background_worker worker_;   // last: joined before the rest goes
};

}  // namespace detail
}  // namespace towerpipe
