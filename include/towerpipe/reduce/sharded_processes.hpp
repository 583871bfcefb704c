#pragma once
// The processes of a reduce::sharded pipeline as its reducers see them (reduce/sharded.hpp for host
// towers, reduce/sharded_across_processes.cuh for GPU towers): the group (pipeline_options::processes,
// or this process alone), the configuration check before the first step, the towers' weights and the
// loss over every process's examples, and the checked step's screen shared by every owner.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/core/config.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/pipeline_options.hpp"
#include "towerpipe/reduce/screen.hpp"
#include "towerpipe/split.hpp"

namespace towerpipe {
namespace detail {

// A group of one process: what reduce::sharded uses without pipeline_options::processes.
class single_process final : public process_group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one process"; }
  std::vector<std::string> all_gather(const void* data, std::size_t bytes, const char*) override {
    return {std::string(static_cast<const char*>(data), bytes)};
  }
  void all_to_all(const char* send, const std::vector<std::size_t>& send_offsets, const std::vector<std::size_t>& send_bytes,
                  char* recv, const std::vector<std::size_t>& recv_offsets, const std::vector<std::size_t>&,
                  const char*) override {
    std::memcpy(recv + recv_offsets[0], send + send_offsets[0], send_bytes[0]);
  }
  void all_gather_blocks(const char* mine, char* out, const std::vector<std::size_t>& block_offsets,
                         const std::vector<std::size_t>& block_bytes, const char*) override {
    std::memcpy(out + block_offsets[0], mine, block_bytes[0]);
  }
};

// What every process compares before the first step, a line each ("key: value").
template <class Optim, class Layout>
std::vector<std::string> sharded_fingerprint(const char* execution, const variable_set& variables,
                                             const typename Optim::hyper_parameters& h, std::size_t towers,
                                             const pipeline_options& options) {
  std::vector<std::string> lines{
      make_message("library: towerpipe ", TOWERPIPE_VERSION_MAJOR, ".", TOWERPIPE_VERSION_MINOR, ".", TOWERPIPE_VERSION_PATCH),
      make_message("towers: ", execution),
      make_message("layout: ", Layout::name, ", ", sizeof(typename Layout::value_type), "-byte values"),
      make_message("optimizer: ", Optim::name, " ", Optim::describe(h)),
      make_message("towers per process: ", towers),
      make_message("split: ", options.split == split_policy::weighted ? "weighted" : "drop_remainder"),
      make_message("variables: ", variables.count())};
  for (std::size_t v = 0; v < variables.count(); ++v)
    lines.push_back(make_message("variable ", v, ": '", variables[v].name, "' ", to_string(variables[v].shape)));
  return lines;
}

class sharded_processes {
 public:
  // Compares `fingerprint` (sharded_fingerprint) across the processes: a difference fails on every
  // process with the same message, naming the first differing line of the first differing rank.
  // checked: whether steps take the checked passes (takes_checked_steps).
  sharded_processes(const pipeline_options& options, bool checked, std::size_t local_towers,
                    const std::vector<std::string>& fingerprint)
      : group_(options.processes ? options.processes : std::make_shared<single_process>()),
        rank_(group_->rank()),
        size_(group_->size()),
        local_towers_(local_towers) {
    check_fingerprint(fingerprint);
    if (checked && towers() >= nonfinite_sum_tower)
      fail("a checked pipeline takes at most ", nonfinite_sum_tower - 1, " towers over all processes, ", towers(), " requested");
  }

  process_group& group() const { return *group_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t local_towers() const { return local_towers_; }
  std::size_t towers() const { return local_towers_ * static_cast<std::size_t>(size_); }  // over every process
  std::size_t global_tower(std::size_t local) const { return static_cast<std::size_t>(rank_) * local_towers_ + local; }

  // The processes' shard sizes, rank-major: every tower's weight examples_i / all examples (as
  // plan_split computes it in one process); returns this process's towers' weights and sets `examples`
  // to the count over every process.
  std::vector<double> weights_across_processes(const std::vector<shard>& shards, std::size_t& examples) const {
    std::vector<std::uint64_t> mine;
    for (const shard& s : shards) mine.push_back(s.examples);
    std::vector<std::uint64_t> counts;
    for (const std::string& bytes : group_->all_gather(mine.data(), mine.size() * sizeof(std::uint64_t), "gathering shard sizes")) {
      const std::size_t before = counts.size();
      counts.resize(before + bytes.size() / sizeof(std::uint64_t));
      std::memcpy(counts.data() + before, bytes.data(), bytes.size());
    }
    std::uint64_t used = 0;
    for (std::uint64_t c : counts) used += c;
    examples = static_cast<std::size_t>(used);
    std::vector<double> local;
    for (std::size_t t = 0; t < local_towers_; ++t)
      local.push_back(static_cast<double>(counts[global_tower(t)]) / static_cast<double>(used));
    return local;
  }

  // The sum over processes, in rank order (the same bits on every process).
  double sum_across_processes(double value) const {
    double total = 0;
    for (const std::string& bytes : group_->all_gather(&value, sizeof value, "summing the loss")) {
      double part = 0;
      std::memcpy(&part, bytes.data(), sizeof part);
      total += part;
    }
    return total;
  }

  // Every process's first non-finite key (the least wins) and its owner's tiles' sums (owners' tiles
  // follow in rank order, as tiles follow in flat order).
  screen_partials share_screen(const screen_partials& mine) const {
    std::string bytes(sizeof mine.first_nonfinite + mine.tile_sums.size() * sizeof(double), '\0');
    std::memcpy(bytes.data(), &mine.first_nonfinite, sizeof mine.first_nonfinite);
    std::memcpy(bytes.data() + sizeof mine.first_nonfinite, mine.tile_sums.data(), mine.tile_sums.size() * sizeof(double));
    screen_partials all;
    for (const std::string& part : group_->all_gather(bytes.data(), bytes.size(), "sharing the gradient screen")) {
      nonfinite_key key = no_nonfinite;
      std::memcpy(&key, part.data(), sizeof key);
      all.first_nonfinite = std::min(all.first_nonfinite, key);
      const std::size_t before = all.tile_sums.size();
      all.tile_sums.resize(before + (part.size() - sizeof key) / sizeof(double));
      std::memcpy(all.tile_sums.data() + before, part.data() + sizeof key, part.size() - sizeof key);
    }
    return all;
  }

 private:
  void check_fingerprint(const std::vector<std::string>& lines) const {
    std::string text;
    for (const std::string& line : lines) text += line + '\n';
    const std::vector<std::string> all = group_->all_gather(text.data(), text.size(), "the configuration check before the first step");
    for (std::size_t r = 1; r < all.size(); ++r) {
      if (all[r] == all[0]) continue;
      const auto lines_of = [](const std::string& s) {
        std::vector<std::string> result;
        for (std::size_t at = 0, end; at < s.size(); at = end + 1) result.push_back(s.substr(at, (end = s.find('\n', at)) - at));
        return result;
      };
      const std::vector<std::string> first = lines_of(all[0]), other = lines_of(all[r]);
      std::size_t i = 0;
      while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
      fail("reduce::sharded over ", group_->describe(), ": the processes differ before the first step: rank ", r, " has '",
           i < other.size() ? other[i] : "(nothing)", "' where rank 0 has '", i < first.size() ? first[i] : "(nothing)", "'");
    }
  }

  std::shared_ptr<process_group> group_;
  int rank_, size_;
  std::size_t local_towers_;
};

}  // namespace detail
}  // namespace towerpipe
