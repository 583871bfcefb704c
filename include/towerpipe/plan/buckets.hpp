#pragma once
// Gradient buckets: the groups of variables a step reduces as soon as every tower has marked them ready
// (tower_context::gradient_ready, exec/tower_context.hpp), while the towers' backward passes go on.
// Why: docs/design-notes.md#plan-buckets
// Plain C++.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"

namespace towerpipe {

// pipeline_options::buckets.
struct gradient_buckets {
  std::size_t cap_bytes = std::size_t(25) << 20;       // 25 MiB, DDP's default
  std::size_t first_cap_bytes = std::size_t(1) << 20;  // the first bucket's (the last variables'): 1 MiB, as DDP
  // Explicit buckets, by variable name, in the order they are reduced; empty: the default plan above.
  std::vector<std::vector<std::string>> groups;
};

namespace detail {

constexpr std::size_t no_bucket = ~std::size_t(0);

// A part of a step over some variables (pipeline/step_parts.hpp): a gradient bucket, reduced
// while the towers run, or what they left (bucket no_bucket, perhaps no variable at all), after them.
struct step_part {
  const std::vector<std::size_t>& variables;
  std::size_t bucket = no_bucket;
  bool during_towers() const { return bucket != no_bucket; }
};

// 0, 1, ..., count - 1: the variables of a whole step as one part.
inline std::vector<std::size_t> every_variable(std::size_t count) {
  std::vector<std::size_t> all(count);
  for (std::size_t v = 0; v < count; ++v) all[v] = v;
  return all;
}

struct bucket_plan {
  std::vector<std::vector<std::size_t>> buckets;  // the variables of each bucket
  std::vector<std::size_t> bucket_of;             // per variable: its bucket

  std::size_t count() const { return buckets.size(); }
};

// The options as one line, for the processes' configuration check (step/processes.hpp): processes whose
// buckets differ would exchange different pieces.
inline std::string describe(const gradient_buckets& options) {
  if (options.groups.empty())
    return make_message("at most ", options.cap_bytes, " bytes each, the first ", std::min(options.first_cap_bytes, options.cap_bytes));
  std::string text = "groups";
  for (const std::vector<std::string>& group : options.groups) {
    text += " [";
    for (std::size_t i = 0; i < group.size(); ++i) text += (i ? " '" : "'") + group[i] + "'";
    text += "]";
  }
  return text;
}

// `element_bytes`: the size of one gradient element as the towers hold it.
inline bucket_plan make_bucket_plan(const variable_set& variables, const gradient_buckets& options, std::size_t element_bytes) {
  bucket_plan plan;
  plan.bucket_of.assign(variables.count(), no_bucket);
  if (options.groups.empty()) {
    if (options.cap_bytes == 0 || options.first_cap_bytes == 0)
      fail("pipeline_options::buckets.cap_bytes and first_cap_bytes must be positive (a bucket of one variable: 1)");
    std::size_t bytes = 0;
    for (std::size_t v = variables.count(); v-- > 0;) {
      const std::size_t size = variables[v].size * element_bytes;
      const std::size_t cap = plan.buckets.size() == 1 ? std::min(options.first_cap_bytes, options.cap_bytes) : options.cap_bytes;
      if (plan.buckets.empty() || bytes + size > cap) {
        plan.buckets.emplace_back();
        bytes = 0;
      }
      plan.buckets.back().push_back(v);
      plan.bucket_of[v] = plan.buckets.size() - 1;
      bytes += size;
    }
  } else {
    for (std::size_t g = 0; g < options.groups.size(); ++g) {
      if (options.groups[g].empty()) fail("pipeline_options::buckets.groups[", g, "] is empty");
      plan.buckets.emplace_back();
      for (const std::string& name : options.groups[g]) {
        if (!variables.contains(name))
          fail("pipeline_options::buckets.groups[", g, "] names '", name, "', which is not a variable of the pipeline");
        const std::size_t v = variables.index_of(name);
        if (plan.bucket_of[v] != no_bucket)
          fail("pipeline_options::buckets.groups[", g, "] names '", name, "', which groups[", plan.bucket_of[v],
               "] holds already: each variable belongs to one bucket");
        plan.bucket_of[v] = g;
        plan.buckets.back().push_back(v);
      }
    }
  }
  for (std::size_t v = 0; v < variables.count(); ++v) {
    if (plan.bucket_of[v] == no_bucket)
      fail("pipeline_options::buckets.groups leave out variable '", variables[v].name, "': each variable belongs to one bucket");
  }
  return plan;
}

// One step's readiness. mark() is called from the marking tower's thread; reset() between
// steps, by the thread that runs them.
class bucket_readiness {
 public:
  bucket_readiness(const bucket_plan& plan, std::size_t towers)
      : plan_(plan), towers_(towers), missing_(towers, std::vector<std::size_t>(plan.count())),
        complete_(std::make_unique<std::atomic<std::size_t>[]>(plan.count())) {
    reset();
  }

  void reset() {
    for (std::vector<std::size_t>& missing : missing_) {
      for (std::size_t b = 0; b < plan_.count(); ++b) missing[b] = plan_.buckets[b].size();
    }
    for (std::size_t b = 0; b < plan_.count(); ++b) complete_[b].store(0, std::memory_order_relaxed);
  }

  // Tower `tower` marked variable v (each at most once a step: the tower context checks it). Returns the
  // bucket this mark completed for the tower, else no_bucket.
  std::size_t mark_for_tower(std::size_t tower, std::size_t v) {
    const std::size_t b = plan_.bucket_of[v];
    return --missing_[tower][b] == 0 ? b : no_bucket;
  }
  // A tower completed bucket b (after whatever it does first, such as recording an event, which the
  // tower that makes the bucket ready then sees). Returns whether every tower has now.
  bool tower_completed(std::size_t b) { return complete_[b].fetch_add(1, std::memory_order_acq_rel) + 1 == towers_; }
  // Both: returns the bucket this mark made ready for every tower, else no_bucket.
  std::size_t mark(std::size_t tower, std::size_t v) {
    const std::size_t b = mark_for_tower(tower, v);
    return b != no_bucket && tower_completed(b) ? b : no_bucket;
  }

 private:
  const bucket_plan& plan_;
  std::size_t towers_;
  std::vector<std::vector<std::size_t>> missing_;          // [tower][bucket]: variables not yet marked
  std::unique_ptr<std::atomic<std::size_t>[]> complete_;  // [bucket]: towers that marked all of it
};

}  // namespace detail
}  // namespace towerpipe
