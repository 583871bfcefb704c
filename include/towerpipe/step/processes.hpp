#pragma once
// The processes a pipeline's towers span (pipeline_options::processes; one without it): the group, the configuration
// check, the shared screen and the two agreements a step (settings and weights before the towers; the verdict after).
// Why: docs/design-notes.md#step-processes

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "towerpipe/comm/process_group.hpp"
#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/config.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/step/pipeline_options.hpp"
#include "towerpipe/kernels/screen.hpp"
#include "towerpipe/data/split.hpp"

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

// The first difference between every process's text and rank 0's, a line at a time: "rank r has 'x'
// where rank 0 has 'y'", or nothing when all are equal.
inline std::string first_difference(const std::vector<std::string>& texts) {
  const auto lines_of = [](const std::string& s) {
    std::vector<std::string> result;
    std::istringstream text(s);
    for (std::string line; std::getline(text, line);) result.push_back(line);  // the last line may lack its '\n'
    return result;
  };
  for (std::size_t r = 1; r < texts.size(); ++r) {
    if (texts[r] == texts[0]) continue;
    const std::vector<std::string> first = lines_of(texts[0]), other = lines_of(texts[r]);
    std::size_t i = 0;
    while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
    return make_message("rank ", r, " has '", i < other.size() ? other[i] : "(nothing)", "' where rank 0 has '",
                        i < first.size() ? first[i] : "(nothing)", "'");
  }
  return {};
}

// What every process compares before the first step, a line each ("key: value").
template <class Optim, class Layout>
std::vector<std::string> configuration_fingerprint(const char* execution, const variable_set& variables,
                                             const typename Optim::hyper_parameters& h, std::size_t towers,
                                             const pipeline_options& options) {
  std::vector<std::string> lines{
      make_message("library: towerpipe ", TOWERPIPE_VERSION_MAJOR, ".", TOWERPIPE_VERSION_MINOR, ".", TOWERPIPE_VERSION_PATCH),
      make_message("towers: ", execution),
      make_message("layout: ", Layout::name, ", ", sizeof(typename Layout::value_type), "-byte values"),
      make_message("optimizer: ", Optim::name, " ", Optim::describe(h)),
      make_message("towers per process: ", towers),
      make_message("split: ", options.split == split_policy::weighted ? "weighted" : "drop_remainder"),
      make_message("on_nonfinite: ", static_cast<int>(options.on_nonfinite), " (0 skip, 1 throw_error, 2 unchecked)"),
      make_message("max_grad_norm: ", exact(options.max_grad_norm)),
      make_message("loss scaling: mode ", static_cast<int>(options.loss_scale.mode), " (0 off, 1 fixed, 2 dynamic), initial ",
                   exact(options.loss_scale.initial_scale), ", growth ", exact(options.loss_scale.growth_factor), ", backoff ",
                   exact(options.loss_scale.backoff_factor), ", interval ", options.loss_scale.growth_interval),
      make_message("accumulation_steps: ", options.accumulation_steps),
      make_message("overlap_reduction: ", options.overlap_reduction ? "on" : "off"),
      make_message("identical_process_parts: ", options.identical_process_parts ? "allowed" : "refused"),
      make_message("gradient buckets: ", describe(options.buckets)),
      make_message("variables: ", variables.count())};
  for (std::size_t v = 0; v < variables.count(); ++v)
    lines.push_back(make_message("variable ", v, ": '", variables[v].name, "' ", to_string(variables[v].shape)));
  return lines;
}

// What a process brings to a step's first collective (pipeline_state::step_settings_now).
struct step_settings {
  std::string text;             // a line each, which must be the same on every process
  bool parameters_set = false;  // on this process since the last step (initialisation, a checkpoint)
  std::function<std::uint64_t()> parameter_digest;  // of every parameter as this process holds them now
};

class processes {
 public:
  // Compares `fingerprint` (configuration_fingerprint) across the processes: a difference fails on every
  // process with the same message, naming the first differing line of the first differing rank.
  // checked: whether steps take the checked passes (takes_checked_steps).
  processes(const pipeline_options& options, bool checked, std::size_t local_towers, const std::vector<std::string>& fingerprint)
      : group_(options.processes ? options.processes : std::make_shared<single_process>()),
        local_towers_(local_towers),
        identical_parts_allowed_(options.identical_process_parts) {
    std::string text;
    for (const std::string& line : fingerprint) text += line + '\n';
    const std::string difference =
        first_difference(group_->all_gather(text.data(), text.size(), "the configuration check before the first step"));
    if (!difference.empty())
      fail("reduce::sharded over ", group_->describe(), ": the processes differ before the first step: ", difference);
    if (checked && towers() >= nonfinite_sum_tower)
      fail("a checked pipeline takes at most ", nonfinite_sum_tower - 1, " towers over all processes, ", towers(), " requested");
  }

  process_group& group() const { return *group_; }
  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  std::size_t local_towers() const { return local_towers_; }
  std::size_t towers() const { return local_towers_ * static_cast<std::size_t>(size()); }  // over every process
  std::size_t global_tower(std::size_t local) const { return static_cast<std::size_t>(rank()) * local_towers_ + local; }

  // The first collective of a step, before the towers run, across processes; every check below fails
  // on every process with the same message, before anything changes:
  //   settings()  this process's settings as of this step, a line each, which must be the same;
  //   shards      this process's towers' shards, which must be its part of the global batch as one
  //               process with every tower would cut it (process_part_of), else the step would differ.
  // Returns this process's towers' weights examples_i / all examples (as plan_split computes them in
  // one process) and sets `examples` to the count over every process. One process: the shards' own.
  //   part        a sampled digest of this process's part (batch::sampled_digest): two processes' equal
  //               are refused unless pipeline_options::identical_process_parts.
  template <class Settings>
  std::vector<double> agree_before_towers(std::int64_t step, Settings&& settings, const std::vector<shard>& shards,
                                          std::uint64_t part, split_policy policy, std::size_t& examples) const {
    std::vector<double> weights;
    if (size() > 1) return exchange_before_towers(step, std::nullopt, settings(), shards, part, policy, examples);
    for (const shard& s : shards) {
      weights.push_back(s.weight);
      examples += s.examples;
    }
    return weights;
  }

  // This process cannot take part in the step (its batch was refused, it has none): it joins the step's
  // first collective with `refusal`, which fails the step on every process alike.
  template <class Settings>
  [[noreturn]] void refuse_step(std::int64_t step, const std::string& refusal, Settings&& settings, split_policy policy) const {
    std::size_t examples = 0;
    if (size() > 1) exchange_before_towers(step, refusal, settings(), {}, 0, policy, examples);
    fail(refusal);  // one process: this one alone
  }

  // run_towers() runs this process's towers and returns their weighted loss; settle() then reduces what
  // they left (pipeline/step_parts.hpp). Across processes settle() runs whether the towers succeeded or
  // not (the processes' exchanges must stay in step), and every process learns whether every process's
  // towers and settling succeeded: one failure is every process's error, the same message everywhere,
  // before anything is updated; else returns the sum of the processes' losses in rank order (the same
  // bits on every process). One process: run_towers(), then settle() where they succeeded.
  template <class RunTowers, class Settle>
  double agree_on_towers(std::int64_t step, RunTowers&& run_towers, Settle&& settle) const {
    if (size() == 1) {
      const double loss = run_towers();
      settle();
      return loss;
    }
    std::optional<std::string> failure;
    double loss = 0;
    try {
      loss = run_towers();
    } catch (...) {
      failure = current_exception_text();
    }
    try {
      settle();
    } catch (...) {
      if (!failure) failure = current_exception_text();
    }
    return exchange_after_towers(step, loss, failure);
  }

  // Every process's first non-finite key (the least wins) and its owner's tiles' sums (owners' tiles
  // follow in rank order, as tiles follow in flat order).
  screen_partials share_screen(const screen_partials& mine) const {
    std::string bytes;
    append_raw(bytes, mine.first_nonfinite);
    for (double sum : mine.tile_sums) append_raw(bytes, sum);
    screen_partials all;
    for (const std::string& part : group_->all_gather(bytes.data(), bytes.size(), "sharing the gradient screen")) {
      std::size_t at = 0;
      all.first_nonfinite = std::min(all.first_nonfinite, read_raw<nonfinite_key>(part, at));
      while (at < part.size()) all.tile_sums.push_back(read_raw<double>(part, at));
    }
    return all;
  }

 private:
  // agree_before_towers across processes; with a refusal, that refusal on every process.
  std::vector<double> exchange_before_towers(std::int64_t step, const std::optional<std::string>& refusal, const step_settings& settings,
                                          const std::vector<shard>& shards, std::uint64_t part, split_policy policy,
                                          std::size_t& examples) const {
    std::string mine;
    append_text(mine, refusal ? *refusal : std::string());
    mine += refusal ? 'R' : 'A';  // refused or accepted
    append_text(mine, settings.text);
    mine += settings.parameters_set ? 'P' : 'N';
    append_raw(mine, part);
    for (const shard& s : shards) append_raw<std::uint64_t>(mine, s.examples);
    std::vector<std::string> all_settings;
    std::vector<std::uint64_t> counts, parts;
    std::string refusals, parameters_set_on;
    std::size_t rank = 0;
    for (const std::string& bytes : group_->all_gather(mine.data(), mine.size(), "agreeing on the step's settings and shard sizes")) {
      std::size_t at = 0;
      const std::string refused = read_text(bytes, at);
      if (bytes[at++] == 'R') refusals += make_message(refusals.empty() ? "" : "; ", "rank ", rank, ": ", refused);
      all_settings.push_back(read_text(bytes, at));
      if (bytes[at++] == 'P') parameters_set_on += make_message(parameters_set_on.empty() ? "" : ", ", rank);
      parts.push_back(read_raw<std::uint64_t>(bytes, at));
      while (at < bytes.size()) counts.push_back(read_raw<std::uint64_t>(bytes, at));
      ++rank;
    }
    if (!refusals.empty())
      fail("step ", step, ": the batch was refused on ", group_->describe(), " (", refusals, "); nothing was updated, and no batch stays staged, on any process");
    const std::string difference = first_difference(all_settings);
    if (!difference.empty()) fail(differ_at_step(), difference);
    if (!parameters_set_on.empty()) agree_on_parameters(parameters_set_on, settings.parameter_digest());
    std::uint64_t used = 0;
    for (std::uint64_t c : counts) used += c;
    check_canonical_cut(step, counts, static_cast<std::size_t>(used), policy);
    if (!identical_parts_allowed_) refuse_identical_parts(step, parts, counts, static_cast<std::size_t>(used));
    examples = static_cast<std::size_t>(used);
    std::vector<double> local;
    for (std::size_t t = 0; t < local_towers_; ++t)
      local.push_back(static_cast<double>(counts[global_tower(t)]) / static_cast<double>(used));
    return local;
  }

  std::string differ_at_step() const {
    return make_message("reduce::sharded over ", group_->describe(), ": the processes differ at this step, which therefore runs on none: ");
  }

  // Parameters were set on some process since the last step (on the ranks `set_on`): every process's
  // parameters as they are now must be the same, so that one process setting the values every process
  // holds agrees. Every process takes this second collective alike: each saw the same first one.
  void agree_on_parameters(const std::string& set_on, std::uint64_t digest) const {
    const std::vector<std::string> all = group_->all_gather(&digest, sizeof digest, "comparing the parameters set since the last step");
    std::vector<std::string> digests;
    for (const std::string& bytes : all) {
      std::size_t at = 0;
      digests.push_back("parameters: digest " + hex_digest(read_raw<std::uint64_t>(bytes, at)));
    }
    const std::string difference = first_difference(digests);
    if (!difference.empty())
      fail(differ_at_step(), "parameters were set since the last step on rank(s) ", set_on, " and now differ: ", difference,
           "; set the same values on every process (set_parameter with them, or load_checkpoint of one checkpoint on each) ",
           "and step again");
  }

  // agree_on_towers across processes: `failure` is what failed on this process, nothing where its towers
  // succeeded.
  double exchange_after_towers(std::int64_t step, double loss, const std::optional<std::string>& failure) const {
    std::string mine(1, failure ? 'F' : 'S');  // failed or succeeded, the loss, what failed
    append_raw(mine, loss);
    if (failure) mine += *failure;
    double total = 0;
    std::string failures;
    const std::vector<std::string> all = group_->all_gather(mine.data(), mine.size(), "agreeing on the towers' outcome");
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r][0] == 'F') {
        failures += make_message(failures.empty() ? "" : "; ", "rank ", r, ": ", all[r].substr(1 + sizeof loss));
        continue;
      }
      std::size_t at = 1;
      total += read_raw<double>(all[r], at);
    }
    if (!failures.empty())
      fail("step ", step, " failed on ", group_->describe(), " (", failures, "); nothing was updated on any process");
    return total;
  }

  // The processes' shards, rank-major, must be one process's cut of their examples.
  void check_canonical_cut(std::int64_t step, const std::vector<std::uint64_t>& counts, std::size_t used, split_policy policy) const {
    const std::vector<shard> cut = plan_split(used, towers(), policy);
    for (std::size_t t = 0; t < towers(); ++t) {
      if (counts[t] == cut[t].examples) continue;
      const std::size_t r = t / local_towers_;
      std::string staged, expected;
      std::size_t part = 0;
      for (std::size_t i = r * local_towers_; i < (r + 1) * local_towers_; ++i) {
        staged += make_message(staged.empty() ? "" : "+", counts[i]);
        expected += make_message(expected.empty() ? "" : "+", cut[i].examples);
        part += cut[i].examples;
      }
      fail("step ", step, ": the processes' batches are not one batch of ", used, " examples cut as one process with all ", towers(),
           " towers would cut it: rank ", r, "'s towers have ", staged, " examples where the cut gives them ", expected,
           "; stage each process's part of the global batch (pipeline::process_part(", used, ") gives rank ", r, " ", part,
           " examples); nothing was updated on any process");
    }
  }

  // Two processes that staged the same examples (as when each gives the whole batch, whose cut then
  // passes) would train on them twice and report twice the throughput.
  void refuse_identical_parts(std::int64_t step, const std::vector<std::uint64_t>& parts, const std::vector<std::uint64_t>& counts,
                              std::size_t used) const {
    for (std::size_t a = 0; a < parts.size(); ++a) {
      std::uint64_t examples = 0;
      for (std::size_t t = a * local_towers_; t < (a + 1) * local_towers_; ++t) examples += counts[t];
      for (std::size_t b = a + 1; b < parts.size() && examples > 0; ++b) {  // two empty parts are alike, not a mistake
        if (parts[a] != parts[b]) continue;
        fail("step ", step, ": ranks ", a, " and ", b, " staged byte-identical parts of the batch (sampled digest ", hex_digest(parts[a]),
             "), as when every process gives the whole batch: each stages its own part of the global batch of ", used,
             " examples (pipeline::process_part(", used, ")); set pipeline_options::identical_process_parts where the processes ",
             "see the same data on purpose; nothing was updated on any process");
      }
    }
  }

  static void append_text(std::string& bytes, const std::string& text) {
    append_raw<std::uint64_t>(bytes, text.size());
    bytes += text;
  }
  static std::string read_text(const std::string& bytes, std::size_t& at) {
    const auto length = static_cast<std::size_t>(read_raw<std::uint64_t>(bytes, at));
    at += length;
    return bytes.substr(at - length, length);
  }

  std::shared_ptr<process_group> group_;
  std::size_t local_towers_;
  bool identical_parts_allowed_;
};

}  // namespace detail
}  // namespace towerpipe
