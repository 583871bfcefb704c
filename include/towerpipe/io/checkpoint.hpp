#pragma once
// Checkpoints: parameters, optimizer state, step count and the program's user_data (at most 1 MiB) in one checksummed
// file, written atomically; resuming reproduces the uninterrupted run bitwise. Derive a data cursor from user_data, not
// steps_done() (a skipped step consumed a batch but did not count).
// Why: docs/design-notes.md#io-checkpoint

#include <cstdint>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/checksum.hpp"
#include "towerpipe/core/error.hpp"
#include "towerpipe/core/shape.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/io/checkpoint_file.hpp"

namespace towerpipe {

// The most bytes of user data a checkpoint carries (a data cursor, an epoch and batch, a generator's state).
constexpr std::size_t max_checkpoint_user_data = std::size_t(1) << 20;

namespace detail {

// Version 2 added the loss_scale line, version 3 the user data; older files still load.
constexpr std::uint32_t checkpoint_version = 3;

// The checkpoint file's bytes (see the top) for a pipeline, with the program's `user_data`.
template <class Pipeline>
std::string checkpoint_bytes(const Pipeline& pipeline, const std::string& user_data = std::string()) {
  using T = typename Pipeline::master_type;
  // The window's running sum is not saved: resuming from here would start a new window and shift every
  // later one.
  if (pipeline.micro_batches_pending() != 0)
    detail::fail("checkpoint: not saved in the middle of an accumulation window (", pipeline.micro_batches_pending(), " of ",
                 pipeline.options().accumulation_steps, " micro-batches averaged): save after a step whose stats.accumulating is false");
  const variable_set& variables = pipeline.variables();
  std::ostringstream header;
  header << "optimizer " << Pipeline::optimizer::name << "\n"
         << "value_bytes " << sizeof(T) << "\n"
         << "state_slots " << pipeline.optimizer_state_slots() << "\n"
         << "steps " << pipeline.steps_done() << "\n"
         << "loss_scale " << std::setprecision(9) << pipeline.loss_scale() << " " << pipeline.loss_scale_good_steps() << "\n"
         << "written_by exec::" << Pipeline::exec_policy::name << " reduce::" << pipeline.backend_name()
         << " layout::" << Pipeline::layout_policy::name << "\n"
         << "variables " << variables.count() << "\n";
  for (const variable& v : variables) {
    header << "variable " << v.name;
    for (std::size_t extent : v.shape) header << " " << extent;
    header << "\n";
  }
  header << "user_data " << user_data.size() << " " << hex_digest(fnv1a(user_data.data(), user_data.size())) << "\n";
  const std::string header_text = header.str();

  std::string bytes(detail::checkpoint_magic, sizeof detail::checkpoint_magic);
  detail::append_raw(bytes, detail::checkpoint_version);
  detail::append_raw(bytes, static_cast<std::uint64_t>(header_text.size()));
  bytes += header_text;
  const auto append_view = [&](auto view) { bytes.append(reinterpret_cast<const char*>(view.data()), view.size() * sizeof(T)); };
  for (std::size_t v = 0; v < variables.count(); ++v) append_view(pipeline.parameter(v));
  for (std::size_t slot = 0; slot < pipeline.optimizer_state_slots(); ++slot) {
    for (std::size_t v = 0; v < variables.count(); ++v) append_view(pipeline.optimizer_state(slot, v));
  }
  // Checked once the state is gathered (a collective with reduce::sharded across processes, which every
  // process joins whatever its user data).
  if (user_data.size() > max_checkpoint_user_data)
    detail::fail("checkpoint: ", user_data.size(), " bytes of user data, at most ", max_checkpoint_user_data,
                 " (a data cursor, not data: keep large state in a file of its own)");
  bytes += user_data;
  detail::append_raw(bytes, fnv1a(bytes.data(), bytes.size()));
  return bytes;
}

}  // namespace detail

// With reduce::sharded over several processes, saving is collective (each process holds a slice of the
// optimizer state): every process calls it, and those given this_process_writes = false only help
// gather (e.g. all but rank 0, where the processes share a file system).
// user_data: the program's own bytes (at most max_checkpoint_user_data), which load_checkpoint returns:
// where its data stands (see the top). The writing process's are written.
template <class Pipeline>
void save_checkpoint(const Pipeline& pipeline, const std::string& path, const std::string& user_data,
                     bool this_process_writes = true) {
  const std::string bytes = detail::checkpoint_bytes(pipeline, user_data);
  if (this_process_writes) detail::write_file_atomically(path, bytes);
}
// (A string literal as user data: without this overload it would convert to this_process_writes.)
template <class Pipeline>
void save_checkpoint(const Pipeline& pipeline, const std::string& path, const char* user_data, bool this_process_writes = true) {
  save_checkpoint(pipeline, path, std::string(user_data), this_process_writes);
}
template <class Pipeline>
void save_checkpoint(const Pipeline& pipeline, const std::string& path, bool this_process_writes = true) {
  save_checkpoint(pipeline, path, std::string(), this_process_writes);
}

namespace detail {

// load_checkpoint on bytes already read; `path` names them in messages (the fuzz harness calls this).
// Returns the user data.
template <class Pipeline>
std::string load_checkpoint_bytes(Pipeline& pipeline, const std::string& bytes, const std::string& path) {
  using T = typename Pipeline::master_type;
  const auto reject = [&](const auto&... why) { detail::fail("checkpoint ", path, ": ", why...); };

  const std::size_t preamble = sizeof detail::checkpoint_magic + sizeof(std::uint32_t) + sizeof(std::uint64_t);
  if (bytes.size() < sizeof detail::checkpoint_magic ||
      std::memcmp(bytes.data(), detail::checkpoint_magic, sizeof detail::checkpoint_magic) != 0)
    reject("not a towerpipe checkpoint (no TWRPCKPT magic)");
  if (bytes.size() < preamble) reject("truncated: ", bytes.size(), " bytes, not even a header");
  std::size_t at = sizeof detail::checkpoint_magic;
  const auto version = detail::read_raw<std::uint32_t>(bytes, at);
  if (version < 1 || version > detail::checkpoint_version)
    reject("format version ", version, ", this build reads versions 1 to ", detail::checkpoint_version);
  const auto header_size = detail::read_raw<std::uint64_t>(bytes, at);
  if (header_size > bytes.size() - preamble) reject("truncated inside the header");

  // The fingerprint: everything but the policies must match this pipeline.
  std::istringstream header(bytes.substr(preamble, header_size));
  const auto field = [&](const char* expected_key) {
    std::string line, key;
    std::getline(header, line);
    std::istringstream fields(line);
    fields >> key;
    if (!header || key != expected_key) reject("unreadable header: expected '", expected_key, "', read '", line, "'");
    std::string rest;
    std::getline(fields >> std::ws, rest);
    return rest;
  };
  const auto number = [&](const char* key) {
    const std::string text = field(key);
    std::istringstream digits(text);
    long long value = 0;
    if (!(digits >> value) || !(digits >> std::ws).eof()) reject("unreadable header: '", key, "' is '", text, "'");
    return value;
  };
  const std::string optimizer_name = field("optimizer");
  const auto value_bytes = static_cast<std::size_t>(number("value_bytes"));
  const auto slots = static_cast<std::size_t>(number("state_slots"));
  const long long steps = number("steps");
  if (steps < 0 || steps > Pipeline::max_steps) reject("step count ", steps, " is outside [0, 2^53]");
  std::optional<std::pair<double, std::int64_t>> loss_scale;  // none in version 1: the configured initial scale
  if (version >= 2) {
    const std::string text = field("loss_scale");
    std::istringstream values(text);
    double scale = 0;
    long long good_steps = 0;
    if (!(values >> scale >> good_steps) || !(values >> std::ws).eof())
      reject("unreadable header: 'loss_scale' is '", text, "' (a scale and a good-step count)");
    loss_scale = std::make_pair(scale, static_cast<std::int64_t>(good_steps));
  }
  field("written_by");
  const long long count = number("variables");
  variable_set variables;
  for (long long v = 0; v < count; ++v) {
    std::istringstream fields(field("variable"));
    std::string name;
    fields >> name;
    shape extents;
    for (std::size_t extent; fields >> extent;) extents.push_back(extent);
    try {
      variables.add(name, extents);
    } catch (const error& e) {
      reject("unreadable header: ", e.message());
    }
  }
  // Version 3: the user data's size and checksum; none before.
  std::size_t user_bytes = 0;
  std::uint64_t user_checksum = fnv1a_basis;  // of no bytes
  if (version >= 3) {
    const std::string text = field("user_data");
    std::istringstream values(text);
    long long size = -1;
    std::string hex;
    if (!(values >> size >> hex) || !(values >> std::ws).eof() || size < 0 || hex.size() != 16 ||
        hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      reject("unreadable header: 'user_data' is '", text, "' (a size and a 16-digit checksum)");
    if (static_cast<unsigned long long>(size) > max_checkpoint_user_data)
      reject("unreadable header: ", size, " bytes of user data, at most ", max_checkpoint_user_data);
    user_bytes = static_cast<std::size_t>(size);
    user_checksum = std::stoull(hex, nullptr, 16);
  }
  if (optimizer_name != Pipeline::optimizer::name)
    reject("written by optimizer ", optimizer_name, ", this pipeline uses ", Pipeline::optimizer::name);
  if (value_bytes != sizeof(T)) reject("holds ", value_bytes, "-byte values, this pipeline ", sizeof(T), "-byte ones");
  if (slots != pipeline.optimizer_state_slots())
    reject("holds ", slots, " optimizer state slot(s), this pipeline has ", pipeline.optimizer_state_slots());
  const variable_set& mine = pipeline.variables();
  if (variables.count() != mine.count())
    reject("holds ", variables.count(), " variables, this pipeline has ", mine.count());
  for (std::size_t v = 0; v < mine.count(); ++v) {
    if (variables[v].name != mine[v].name || variables[v].shape != mine[v].shape)
      reject("variable #", v, " is '", variables[v].name, "' ", to_string(variables[v].shape), ", this pipeline has '",
             mine[v].name, "' ", to_string(mine[v].shape));
  }

  const std::size_t payload = (1 + slots) * mine.total_size() * sizeof(T);
  const std::size_t expected = preamble + header_size + payload + user_bytes + sizeof(std::uint64_t);
  if (bytes.size() != expected)
    reject(bytes.size() < expected ? "truncated: " : "too long: ", bytes.size(), " bytes, expected ", expected);
  const std::size_t user_at = preamble + header_size + payload;
  at = expected - sizeof(std::uint64_t);  // the checksum, of every byte before it
  if (detail::read_raw<std::uint64_t>(bytes, at) != fnv1a(bytes.data(), expected - sizeof(std::uint64_t))) {
    if (fnv1a(bytes.data() + user_at, user_bytes) != user_checksum)
      reject("corrupted: checksum mismatch (in the user data: the ", user_bytes, " bytes the program saved with it)");
    reject("corrupted: checksum mismatch");
  }

  // The file is whole: the pipeline checks the step count and the loss scale against its own rules, then
  // applies everything at once or, refusing, changes nothing.
  std::vector<T> values((1 + slots) * mine.total_size());
  std::memcpy(values.data(), bytes.data() + preamble + header_size, payload);
  try {
    pipeline.restore_state(values.data(), steps, loss_scale);
  } catch (const error& e) {
    reject(e.message());
  }
  return bytes.substr(user_at, user_bytes);
}

}  // namespace detail

// Loads the checkpoint at `path` into `pipeline` (everything is checked first: on an error nothing
// changes) and returns the user data it was saved with; empty where it had none (and from files of
// format versions 1 and 2).
template <class Pipeline>
std::string load_checkpoint(Pipeline& pipeline, const std::string& path) {
  return detail::load_checkpoint_bytes(pipeline, detail::read_whole_file(path), path);
}

}  // namespace towerpipe
