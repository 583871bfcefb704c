#pragma once
// What the benchmark executables share: variable lists from .shapes files, medians, the optimizer's
// bytes per parameter (the floor's numerator), command-line options and a small JSON writer.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <towerpipe/towerpipe.hpp>

namespace towerpipe_bench {

// A .shapes file: '#' comment lines, then one variable a line: "name dim dim ...".
inline towerpipe::variable_set read_shapes(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open shapes file " + path);
  towerpipe::variable_set variables;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    towerpipe::shape dims;
    for (long long extent; fields >> extent;) {
      if (extent <= 0) throw std::runtime_error(path + ":" + std::to_string(number) + ": bad extent");
      dims.push_back(static_cast<std::size_t>(extent));
    }
    if (!fields.eof()) throw std::runtime_error(path + ":" + std::to_string(number) + ": not 'name dim...'");
    variables.add(name, dims);
  }
  return variables;
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Bytes one average+apply+broadcast moves per parameter: N gradients read, the parameters and each
// optimizer slot read and written, and `replicas_written` further copies of the parameters written
// (N - 1 for the device backends, whose master is replica 0; 0 for host towers sharing one copy).
// For Adam with N - 1 replicas this is 4N + 24 + 4(N - 1).
inline double bytes_per_parameter(std::size_t towers, int state_slots, std::size_t replicas_written) {
  return 4.0 * static_cast<double>(towers) + 8.0 + 8.0 * state_slots + 4.0 * static_cast<double>(replicas_written);
}

// What a checked step (kernels/screen.hpp) moves on top, per float parameter: the average written by
// the screen and read by the apply, and a tile's 8-byte partial per 2048 parameters.
constexpr double screen_bytes = 8.0 + 8.0 / 2048.0;

// A mixed-precision step (always checked): 16-bit gradients read, the fp32 master read and written, the
// fp32 state, the 16-bit replicas written, the fp32 average written and read.
inline double mixed_bytes_per_parameter(std::size_t towers, int state_slots, double stored_bytes,
                                        std::size_t replicas_written) {
  return stored_bytes * static_cast<double>(towers + replicas_written) + 8.0 + 8.0 * state_slots + screen_bytes;
}

// Where the .shapes files are by default: share/towerpipe/shapes beside an installed executable's bin/
// (cmake --install <build> --component benchmarks puts them there), else the source tree it was built from.
inline std::string default_shapes_dir() {
  std::error_code ignored;
  const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", ignored);
  const std::filesystem::path installed = executable.parent_path().parent_path() / "share" / "towerpipe" / "shapes";
  if (!executable.empty() && std::filesystem::is_directory(installed, ignored)) return installed.string();
  return TOWERPIPE_BENCH_SHAPES_DIR;
}

struct options {
  bool quick = false;
  std::string out = "benchmark.json";
  std::string shapes_dir = default_shapes_dir();
  std::vector<std::size_t> towers{1, 2, 4, 8};
  int repetitions = 20;
  std::string only;  // --only SECTION: one section of the rows (benchmarks that have sections); empty: all
};

inline std::vector<std::size_t> parse_list(const std::string& text) {
  std::vector<std::size_t> values;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoul(item));
  if (values.empty()) throw std::invalid_argument("empty list '" + text + "'");
  return values;
}

// `sections`: the values --only takes; none: the benchmark takes no --only.
inline options parse_options(int argc, char** argv, const char* usage, const std::vector<std::string>& sections = {}) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help") {
      std::printf("%s\nShapes files are read from %s unless --shapes-dir says otherwise.\n", usage, o.shapes_dir.c_str());
      std::exit(0);
    }
    if (flag == "--quick") {
      o.quick = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (flag == "--out") o.out = value;
    else if (flag == "--shapes-dir") o.shapes_dir = value;
    else if (flag == "--towers") o.towers = parse_list(value);
    else if (flag == "--repetitions") o.repetitions = std::stoi(value);
    else if (flag == "--only" && !sections.empty()) {
      if (std::find(sections.begin(), sections.end(), value) == sections.end())
        throw std::invalid_argument("--only " + value + ": not a section of this benchmark (see --help)");
      o.only = value;
    }
    else throw std::invalid_argument("unknown flag " + flag + " (see --help)");
  }
  if (o.repetitions < 1) throw std::invalid_argument("--repetitions must be at least 1");
  return o;
}

// Rows of named fields written as a JSON document {"machine": {...}, "floors": {...}, "rows": [...]}.
class json_rows {
 public:
  class row {
   public:
    row& set(const std::string& key, double value) {
      char text[64];
      std::snprintf(text, sizeof text, "%.6g", value);
      fields_.emplace_back(key, text);
      return *this;
    }
    row& set(const std::string& key, const std::string& value) {
      fields_.emplace_back(key, quote(value));
      return *this;
    }
    std::string text() const {
      std::string out = "{";
      for (std::size_t i = 0; i < fields_.size(); ++i)
        out += (i ? ", " : "") + quote(fields_[i].first) + ": " + fields_[i].second;
      return out + "}";
    }

   private:
    std::vector<std::pair<std::string, std::string>> fields_;
  };

  row machine, floors;
  std::vector<row> rows;

  void write(const std::string& path) const {
    std::ofstream out(path);
    out << "{\n  \"machine\": " << machine.text() << ",\n  \"floors\": " << floors.text() << ",\n  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) out << "    " << rows[i].text() << (i + 1 < rows.size() ? ",\n" : "\n");
    out << "  ]\n}\n";
    if (!out) throw std::runtime_error("cannot write " + path);
  }

  // One measurement, with the fields every benchmark row has.
  static row measurement(const std::string& backend, const std::string& exec, const std::string& model,
                         const char* optimizer, const char* layout, std::size_t towers,
                         const towerpipe::variable_set& variables, double bytes, double ms, double floor_ms) {
    row r;
    r.set("backend", backend)
        .set("exec", exec)
        .set("model", model)
        .set("optimizer", optimizer)
        .set("layout", layout)
        .set("towers", static_cast<double>(towers))
        .set("parameters", static_cast<double>(variables.total_size()))
        .set("tensors", static_cast<double>(variables.count()))
        .set("bytes", bytes)
        .set("ms", ms)
        .set("floor_ms", floor_ms)
        .set("ratio_to_floor", ms / floor_ms);
    return r;
  }

  static std::string quote(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    return out + "\"";
  }
};

}  // namespace towerpipe_bench
