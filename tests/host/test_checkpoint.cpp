// Checkpoints: round trip into another layout, resume equal to the uninterrupted run bitwise, and
// every damaged or mismatched file rejected with its reason, leaving the pipeline untouched.
#include <towerpipe/towerpipe.hpp>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "test_support.hpp"

using namespace towerpipe;
using towerpipe_tests::first_bitwise_difference;
using towerpipe_tests::random_source;

namespace {

template <class Layout, class Optim = optim::adam>
using trainer = pipeline<exec::host, reduce::host, Optim, Layout>;

const variable_set variables{{"w", {33, 7}}, {"b", {7}}};
const std::vector<input_spec> inputs{{"x", dtype::float32, {1}}};

std::string temporary_path(const std::string& name) {
  return "/tmp/towerpipe_test_" + std::to_string(::getpid()) + "_" + name;
}

// Steps [first, last) of a fixed random gradient sequence: step s draws from its own seed, so any
// split of the steps sees the same gradients.
template <class Pipeline>
void train_steps(Pipeline& p, int first, int last) {
  const std::vector<float> x(4, 1.0f);
  batch b;
  b.add("x", x.data(), 4, {1});
  for (int s = first; s < last; ++s) {
    random_source random(1000 + static_cast<std::uint64_t>(s));
    std::vector<std::vector<std::vector<float>>> grads(p.towers());
    for (auto& tower : grads) {
      for (const variable& v : variables) tower.push_back(random.normal(v.size));
    }
    p.step(b, [&](typename Pipeline::tower_context& tower) {
      for (std::size_t v = 0; v < variables.count(); ++v)
        tower.write_gradient(v, grads[tower.tower()][v].data(), grads[tower.tower()][v].size());
      return 0.0;
    });
  }
}

template <class A, class B>
void require_same_state(const A& a, const B& b) {
  REQUIRE(a.steps_done() == b.steps_done());
  for (std::size_t v = 0; v < variables.count(); ++v) {
    REQUIRE(first_bitwise_difference(a.parameter(v), b.parameter(v)) == -1);
    for (std::size_t slot = 0; slot < a.optimizer_state_slots(); ++slot)
      REQUIRE(first_bitwise_difference(a.optimizer_state(slot, v), b.optimizer_state(slot, v)) == -1);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// A checkpoint's bytes with the header line that starts with `key` replaced by `line` (removed where it is
// empty) and, where given, another format version; the header size and the checksum to match.
std::string with_header_line(const std::string& file, const std::string& key, const std::string& line, std::uint32_t version = 0) {
  std::string bytes = file.substr(0, file.size() - sizeof(std::uint64_t));
  const std::size_t found = bytes.find("\n" + key + " ");
  REQUIRE(found != std::string::npos);
  const std::size_t begin = found + 1, size = bytes.find('\n', begin) + 1 - begin;
  const std::string replacement = line.empty() ? line : line + "\n";
  bytes.replace(begin, size, replacement);
  std::uint64_t header_size;
  std::memcpy(&header_size, bytes.data() + 12, sizeof header_size);
  header_size = header_size - size + replacement.size();
  std::memcpy(&bytes[12], &header_size, sizeof header_size);
  if (version != 0) std::memcpy(&bytes[8], &version, sizeof version);
  const std::uint64_t sum = fnv1a(bytes.data(), bytes.size());
  return bytes.append(reinterpret_cast<const char*>(&sum), sizeof sum);
}

// No temporary of a save to `path` is left beside it.
bool no_temporary_of(const std::string& path) {
  glob_t leftovers{};
  const bool none = ::glob((path + ".tmp.*").c_str(), 0, nullptr, &leftovers) == GLOB_NOMATCH;
  ::globfree(&leftovers);
  return none;
}

}  // namespace

TEST_CASE("a checkpoint round-trips into another layout and resumes bitwise", "[checkpoint]") {
  const std::string path = temporary_path("resume.ckpt");
  trainer<layout::flat<float>> uninterrupted(variables, inputs, 3, optim::adam::hyper_parameters{});
  train_steps(uninterrupted, 0, 10);

  trainer<layout::flat<float>> first_half(variables, inputs, 3, optim::adam::hyper_parameters{});
  train_steps(first_half, 0, 5);
  save_checkpoint(first_half, path);
  CHECK(no_temporary_of(path));

  trainer<layout::per_variable<float>> resumed(variables, inputs, 3, optim::adam::hyper_parameters{});
  load_checkpoint(resumed, path);
  require_same_state(resumed, first_half);
  train_steps(resumed, 5, 10);
  require_same_state(resumed, uninterrupted);
  std::remove(path.c_str());
}

TEST_CASE("damaged or mismatched checkpoints are rejected with the reason, and nothing changes", "[checkpoint][errors]") {
  const std::string path = temporary_path("damaged.ckpt");
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(source, 0, 3);
  save_checkpoint(source, path);
  const std::string good = read_file(path);

  trainer<layout::flat<float>> target(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(target, 0, 1);
  const auto rejects = [&](const std::string& bytes, const std::string& reason) {
    write_file(path, bytes);
    std::vector<std::vector<float>> before;
    for (std::size_t v = 0; v < variables.count(); ++v) before.emplace_back(target.parameter(v).begin(), target.parameter(v).end());
    CHECK_THROWS_WITH(load_checkpoint(target, path), Catch::Contains(reason));
    CHECK(target.steps_done() == 1);
    for (std::size_t v = 0; v < variables.count(); ++v) CHECK(first_bitwise_difference(target.parameter(v), before[v]) == -1);
  };
  rejects(good.substr(0, good.size() - 100), "truncated");
  rejects(good.substr(0, 10), "truncated");
  rejects(good + "x", "too long");
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  rejects(flipped, "corrupted: checksum mismatch");
  rejects("PK\x03\x04 not a checkpoint at all", "not a towerpipe checkpoint");
  CHECK_THROWS_WITH(load_checkpoint(target, path + ".missing"), Catch::Contains("cannot open"));
  CHECK_THROWS_WITH(load_checkpoint(target, "/tmp"), Catch::Contains("checkpoint /tmp: not a regular file"));

  // Header fields out of range or unreadable, with a checksum that matches: rejected before anything changes.
  rejects(with_header_line(good, "steps", "steps -1"), "step count -1 is outside [0, 2^53]");
  rejects(with_header_line(good, "steps", "steps 9223372036854775807"), "step count 9223372036854775807 is outside");
  rejects(with_header_line(good, "steps", "steps 3", 99), "format version 99, this build reads versions 1 to 3");
  rejects(with_header_line(good, "loss_scale", "loss_scale x"), "unreadable header: 'loss_scale' is 'x' (a scale and a good-step count)");
  rejects(with_header_line(good, "variable", "variable w 33 0"), "unreadable header: variable 'w' has a zero extent in shape [33, 0]");
  rejects(with_header_line(good, "user_data", "user_data 0 xyz"), "unreadable header: 'user_data' is '0 xyz' (a size and a 16-digit checksum)");
  rejects(with_header_line(good, "user_data", "user_data 99999999999 0000000000000000"),
          "unreadable header: 99999999999 bytes of user data, at most 1048576");

  write_file(path, good);
  trainer<layout::flat<float>> other_shape(variable_set{{"w", {33, 8}}, {"b", {7}}}, inputs, 2,
                                           optim::adam::hyper_parameters{});
  CHECK_THROWS_WITH(load_checkpoint(other_shape, path),
                    Catch::Contains("variable #0 is 'w' [33, 7], this pipeline has 'w' [33, 8]"));
  trainer<layout::flat<float>, optim::adamw> other_optimizer(variables, inputs, 2, optim::adamw::hyper_parameters{});
  CHECK_THROWS_WITH(load_checkpoint(other_optimizer, path),
                    Catch::Contains("written by optimizer adam, this pipeline uses adamw"));
  trainer<layout::flat<float>> fewer_variables(variable_set{{"w", {33, 7}}}, inputs, 2, optim::adam::hyper_parameters{});
  CHECK_THROWS_WITH(load_checkpoint(fewer_variables, path), Catch::Contains("holds 2 variables, this pipeline has 1"));
  // The same optimizer with another number of state slots: sgd with momentum keeps one, without none.
  optim::sgd::hyper_parameters momentum;
  momentum.momentum = 0.9;
  trainer<layout::flat<float>, optim::sgd> with_momentum(variables, inputs, 2, momentum);
  train_steps(with_momentum, 0, 1);
  save_checkpoint(with_momentum, path);
  trainer<layout::flat<float>, optim::sgd> plain(variables, inputs, 2, optim::sgd::hyper_parameters{});
  CHECK_THROWS_WITH(load_checkpoint(plain, path), Catch::Contains("holds 1 optimizer state slot(s), this pipeline has 0"));
  std::remove(path.c_str());
}

TEST_CASE("saves to one path from several threads all succeed and leave one whole checkpoint", "[checkpoint]") {
  const std::string path = temporary_path("concurrent.ckpt");
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(source, 0, 2);
  std::vector<std::thread> savers;
  std::vector<int> failures(4, 0);
  for (int i = 0; i < 4; ++i) {
    savers.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round) {
        try {
          save_checkpoint(source, path);
        } catch (const error&) {
          ++failures[static_cast<std::size_t>(i)];
        }
      }
    });
  }
  for (std::thread& saver : savers) saver.join();
  CHECK(failures == std::vector<int>(4, 0));
  trainer<layout::flat<float>> loaded(variables, inputs, 2, optim::adam::hyper_parameters{});
  load_checkpoint(loaded, path);
  require_same_state(loaded, source);
  std::remove(path.c_str());
}

TEST_CASE("a checkpoint that cannot be written says why and leaves no temporary", "[checkpoint][errors]") {
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{});
  CHECK_THROWS_WITH(save_checkpoint(source, "/nonexistent-dir/x.ckpt"),
                    Catch::Contains("checkpoint /nonexistent-dir/x.ckpt: cannot create a temporary file beside it"));
  // A full disk, as a file size limit makes one: the write fails, named, and its temporary goes.
  const std::string path = temporary_path("too_large.ckpt");
  struct rlimit limit {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &limit) == 0);
  const struct rlimit unlimited = limit;
  limit.rlim_cur = 64;
  const auto signal_before = std::signal(SIGXFSZ, SIG_IGN);  // else past the limit the process is killed
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  std::string message;
  try {
    save_checkpoint(source, path);
  } catch (const error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &unlimited);
  std::signal(SIGXFSZ, signal_before);
  CHECK_THAT(message, Catch::Contains("checkpoint " + path + ": write failed: File too large"));
  CHECK(no_temporary_of(path));
  CHECK(::access(path.c_str(), F_OK) != 0);
  // A directory where the file should go: the rename fails, named, and the directory stays as it was.
  const std::string directory = temporary_path("a_directory.ckpt");
  std::filesystem::remove_all(directory);
  REQUIRE(std::filesystem::create_directory(directory));
  write_file(directory + "/inside", "kept");
  CHECK_THROWS_WITH(save_checkpoint(source, directory), Catch::Contains("checkpoint " + directory + ": rename failed: "));
  CHECK(no_temporary_of(directory));
  CHECK(read_file(directory + "/inside") == "kept");
  std::filesystem::remove_all(directory);
}

namespace {
// Dynamic loss scaling from 256, growing after 2 good steps.
pipeline_options dynamic_scaling() {
  pipeline_options options;
  options.loss_scale.mode = loss_scale_mode::dynamic;
  options.loss_scale.initial_scale = 256.0;
  options.loss_scale.growth_interval = 2;
  return options;
}
}  // namespace

TEST_CASE("the dynamic loss scale is saved and restored, and version-1 files without it still load", "[checkpoint][loss_scale]") {
  const std::string path = temporary_path("scaled.ckpt");
  const pipeline_options options = dynamic_scaling();
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  train_steps(source, 0, 3);  // 256 -> 512 after two good steps, one good step towards the next
  REQUIRE(source.loss_scale() == 512.0);
  REQUIRE(source.loss_scale_good_steps() == 1);
  save_checkpoint(source, path);
  trainer<layout::per_variable<float>> loaded(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  load_checkpoint(loaded, path);
  CHECK(loaded.loss_scale() == 512.0);
  CHECK(loaded.loss_scale_good_steps() == 1);
  require_same_state(loaded, source);

  // The same file as format version 1: no loss_scale line (nor version 3's user_data line, here for no
  // user data).
  write_file(path, with_header_line(with_header_line(read_file(path), "loss_scale", ""), "user_data", "", 1));
  trainer<layout::flat<float>> old(variables, inputs, 2, optim::adam::hyper_parameters{});
  load_checkpoint(old, path);
  require_same_state(old, source);
  // Into a pipeline that scales: the file holds no scale, so the configured initial one (not 1).
  trainer<layout::flat<float>> old_scaled(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  old_scaled.set_loss_scale(4096.0, 1);
  load_checkpoint(old_scaled, path);
  CHECK(old_scaled.loss_scale() == 256.0);
  CHECK(old_scaled.loss_scale_good_steps() == 0);
  require_same_state(old_scaled, source);
  std::remove(path.c_str());
}

TEST_CASE("a checkpoint whose loss scale no step could use is refused whole", "[checkpoint][loss_scale][errors]") {
  const std::string path = temporary_path("bad_scale.ckpt");
  const pipeline_options options = dynamic_scaling();
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  train_steps(source, 0, 3);
  save_checkpoint(source, path);
  const std::string good = read_file(path);
  REQUIRE(good.find("\nloss_scale 512 1\n") != std::string::npos);
  const auto with_loss_scale = [&](const std::string& line) { return with_header_line(good, "loss_scale", "loss_scale " + line); };
  trainer<layout::flat<float>> target(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  train_steps(target, 0, 1);
  std::vector<std::vector<float>> before;
  for (std::size_t v = 0; v < variables.count(); ++v) before.emplace_back(target.parameter(v).begin(), target.parameter(v).end());
  // 0 and subnormal scales in float would skip every later step; a good-step count at or past the
  // growth interval (here 2), up to INT64_MAX, would overflow or never grow.
  for (const std::string line : {"1e-50 0", "1e-45 0", "1e-40 0", "0 0", "512 2", "512 9223372036854775807", "512 -1"}) {
    INFO("loss_scale " << line);
    write_file(path, with_loss_scale(line));
    CHECK_THROWS_WITH(load_checkpoint(target, path), Catch::Contains("a loss scale must be a positive normal float"));
    CHECK(target.steps_done() == 1);
    CHECK(target.loss_scale() == 256.0);
    for (std::size_t v = 0; v < variables.count(); ++v) CHECK(first_bitwise_difference(target.parameter(v), before[v]) == -1);
  }
  write_file(path, with_loss_scale("1e-30 1"));  // small but normal: taken
  load_checkpoint(target, path);
  CHECK(target.loss_scale() == static_cast<double>(1e-30f));
  CHECK(target.loss_scale_good_steps() == 1);
  std::remove(path.c_str());
}

TEST_CASE("a checkpoint is refused in the middle of an accumulation window, and taken at its end", "[checkpoint][errors]") {
  // Resuming from mid-window would start a new window there and shift every later one.
  pipeline_options options;
  options.accumulation_steps = 3;
  trainer<layout::flat<float>> p(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  const std::string path = temporary_path("mid_window.ckpt");
  std::remove(path.c_str());
  train_steps(p, 0, 2);
  CHECK(p.micro_batches_pending() == 2);
  CHECK_THROWS_WITH(save_checkpoint(p, path),
                    "towerpipe: checkpoint: not saved in the middle of an accumulation window (2 of 3 micro-batches averaged): "
                    "save after a step whose stats.accumulating is false");
  CHECK_FALSE(std::ifstream(path).good());
  train_steps(p, 2, 3);
  CHECK(p.micro_batches_pending() == 0);
  CHECK(p.steps_done() == 1);
  save_checkpoint(p, path);
  trainer<layout::flat<float>> resumed(variables, inputs, 2, optim::adam::hyper_parameters{}, options);
  load_checkpoint(resumed, path);
  train_steps(p, 3, 9);
  train_steps(resumed, 3, 9);
  require_same_state(p, resumed);
  CHECK(resumed.steps_done() == 3);
  std::remove(path.c_str());
}

namespace {
// A directory of its own under /tmp for a test that lists what is beside a checkpoint.
std::string fresh_directory(const std::string& name) {
  const std::string directory = temporary_path(name);
  std::filesystem::remove_all(directory);
  REQUIRE(std::filesystem::create_directory(directory));
  return directory;
}
bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}
}  // namespace

TEST_CASE("a save removes the temporaries that killed saves to the same target left, and nothing else", "[checkpoint]") {
  const std::string directory = fresh_directory("stale_temporaries");
  const std::string path = directory + "/model.ckpt";
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(source, 0, 2);
  save_checkpoint(source, path);
  const std::string whole = read_file(path);
  REQUIRE(whole.compare(0, 8, "TWRPCKPT") == 0);

  // What saves killed before their rename leave: NAME.tmp. and mkstemp's six letters or digits, holding
  // all of a checkpoint or the part written before the kill.
  const std::vector<std::string> killed{"model.ckpt.tmp.a1B2c3", "model.ckpt.tmp.ZZZZZZ", "model.ckpt.tmp.000000"};
  write_file(directory + "/" + killed[0], whole);
  write_file(directory + "/" + killed[1], whole.substr(0, whole.size() / 3));
  write_file(directory + "/" + killed[2], whole.substr(0, 8));
  // Files that are not a killed save's to this target, and must stay.
  const std::vector<std::string> kept{
      "other.ckpt.tmp.a1B2c3",    // another target's temporary
      "model.ckpt.tmp.a1B2c",     // five characters
      "model.ckpt.tmp.a1B2c3d",   // seven
      "model.ckpt.tmp.a1-2c3",    // not mkstemp's alphabet
      "model.ckpt.tmpXa1B2c3",    // not ".tmp."
      "xmodel.ckpt.tmp.a1B2c3",   // another target whose name ends like this one
      "model.ckpt.tmp.notour",    // the right name, but not a checkpoint
      "model.ckpt.tmp.TWRPCK",    // the right name, shorter than the magic
      "model.ckpt.tmp.e0e0e0",    // empty: perhaps a save that has just begun
      "model.ckpt.tmp.L0CKED",    // a save in progress elsewhere (locked below)
  };
  for (const std::string& name : kept) write_file(directory + "/" + name, whole);
  write_file(directory + "/model.ckpt.tmp.notour", "the user's own notes, not a checkpoint");
  write_file(directory + "/model.ckpt.tmp.TWRPCK", "TWRPCK");
  write_file(directory + "/model.ckpt.tmp.e0e0e0", "");
  // A link with the right name, to a checkpoint: not a regular file, and the file it names is not ours.
  write_file(directory + "/elsewhere.ckpt", whole);
  REQUIRE(::symlink((directory + "/elsewhere.ckpt").c_str(), (directory + "/model.ckpt.tmp.L1NK00").c_str()) == 0);
  const int in_progress = ::open((directory + "/model.ckpt.tmp.L0CKED").c_str(), O_RDONLY);
  REQUIRE(in_progress >= 0);
  REQUIRE(::flock(in_progress, LOCK_EX) == 0);

  train_steps(source, 2, 3);
  save_checkpoint(source, path);
  ::close(in_progress);
  for (const std::string& name : killed) {
    INFO(name);
    CHECK_FALSE(exists(directory + "/" + name));
  }
  for (const std::string& name : kept) {
    INFO(name);
    CHECK(exists(directory + "/" + name));
  }
  CHECK(exists(directory + "/model.ckpt.tmp.L1NK00"));
  CHECK(read_file(directory + "/elsewhere.ckpt") == whole);
  CHECK(read_file(directory + "/model.ckpt.tmp.notour") == "the user's own notes, not a checkpoint");
  trainer<layout::flat<float>> loaded(variables, inputs, 2, optim::adam::hyper_parameters{});
  load_checkpoint(loaded, path);
  require_same_state(loaded, source);
  // The lock released (its save "killed"), the next save removes that one too.
  save_checkpoint(source, path);
  CHECK_FALSE(exists(directory + "/model.ckpt.tmp.L0CKED"));
  CHECK(exists(directory + "/other.ckpt.tmp.a1B2c3"));
  std::filesystem::remove_all(directory);
}

TEST_CASE("a checkpoint carries the program's own data, checksummed, and files without it load with none", "[checkpoint]") {
  const std::string path = temporary_path("user_data.ckpt");
  trainer<layout::flat<float>> source(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(source, 0, 3);
  // Every byte value, a NUL among them: bytes, not text.
  std::string cursor;
  for (int i = 0; i < 300; ++i) cursor += static_cast<char>((i * 7 + 3) % 256);
  REQUIRE(cursor.find('\0') != std::string::npos);
  save_checkpoint(source, path, cursor);

  trainer<layout::per_variable<float>> resumed(variables, inputs, 2, optim::adam::hyper_parameters{});
  const std::string back = load_checkpoint(resumed, path);
  CHECK(back.size() == cursor.size());
  CHECK(back == cursor);
  require_same_state(resumed, source);
  const std::string good = read_file(path);

  // A string literal is user data (not the this_process_writes flag), and no user data loads as none.
  save_checkpoint(source, path, "epoch 3 batch 17");
  CHECK(load_checkpoint(resumed, path) == "epoch 3 batch 17");
  save_checkpoint(source, path);
  CHECK(load_checkpoint(resumed, path).empty());
  const std::string without = read_file(path);

  // One byte of the user data changed: refused, naming it, and nothing loaded.
  trainer<layout::flat<float>> target(variables, inputs, 2, optim::adam::hyper_parameters{});
  train_steps(target, 0, 1);
  std::vector<std::vector<float>> before;
  for (std::size_t v = 0; v < variables.count(); ++v) before.emplace_back(target.parameter(v).begin(), target.parameter(v).end());
  std::string damaged = good;
  const std::size_t user_data_at = good.size() - sizeof(std::uint64_t) - cursor.size();
  REQUIRE(good.compare(user_data_at, cursor.size(), cursor) == 0);
  damaged[user_data_at + 100] ^= 0x01;
  write_file(path, damaged);
  CHECK_THROWS_WITH(load_checkpoint(target, path),
                    Catch::Contains("corrupted: checksum mismatch (in the user data: the 300 bytes the program saved with it)"));
  CHECK(target.steps_done() == 1);
  for (std::size_t v = 0; v < variables.count(); ++v) CHECK(first_bitwise_difference(target.parameter(v), before[v]) == -1);
  // Cut short, or the user data's length changed in the header: refused too.
  write_file(path, good.substr(0, good.size() - 10));
  CHECK_THROWS_WITH(load_checkpoint(target, path), Catch::Contains("truncated"));
  CHECK(target.steps_done() == 1);

  // Too much to be a cursor: refused when saving, and the last good file stays.
  write_file(path, good);
  CHECK_THROWS_WITH(save_checkpoint(source, path, std::string(max_checkpoint_user_data + 1, 'x')),
                    Catch::Contains("bytes of user data, at most 1048576"));
  CHECK(read_file(path) == good);

  // A version-2 file (before user data): the same bytes without the user_data line; it loads, with none.
  write_file(path, with_header_line(without, "user_data", "", 2));
  trainer<layout::flat<float>> old(variables, inputs, 2, optim::adam::hyper_parameters{});
  CHECK(load_checkpoint(old, path).empty());
  require_same_state(old, source);
  std::remove(path.c_str());
}
