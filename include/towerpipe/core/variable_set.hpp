#pragma once
// The model's trainable variables: unique names with shapes, in a fixed order that every layout,
// backend and checkpoint follows.

#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/shape.hpp"

namespace towerpipe {

struct variable {
  std::string name;
  towerpipe::shape shape;
  std::size_t size = 0;  // element count of shape
};

// The index of flat element `element` of v by shape: "(3, 17)".
inline std::string shaped_index(const variable& v, std::size_t element) {
  std::string index;
  for (std::size_t d = v.shape.size(), rest = element; d-- > 0; rest /= v.shape[d])
    index = std::to_string(rest % v.shape[d]) + (index.empty() ? "" : ", ") + index;
  return "(" + index + ")";
}

class variable_set {
 public:
  variable_set() = default;
  variable_set(std::initializer_list<std::pair<std::string, towerpipe::shape>> variables) {
    for (const auto& [name, dims] : variables) add(name, dims);
  }

  // Appends a variable; returns its index. Names must be non-empty, unique and printable without
  // whitespace (checkpoints and timelines write them as words); extents positive.
  std::size_t add(const std::string& name, const towerpipe::shape& dims) {
    if (name.empty()) detail::fail("variable #", variables_.size(), " has an empty name");
    for (std::size_t i = 0; i < name.size(); ++i) {
      const auto c = static_cast<unsigned char>(name[i]);
      if (c <= ' ' || c == 0x7F)
        detail::fail("variable #", variables_.size(), " name '", printable(name), "' has whitespace or a control ",
                     "character at byte ", i, "; names are single words");
    }
    if (index_.count(name) != 0) detail::fail("duplicate variable name '", name, "'");
    for (std::size_t extent : dims) {
      if (extent == 0) detail::fail("variable '", name, "' has a zero extent in shape ", to_string(dims));
    }
    index_.emplace(name, variables_.size());
    variables_.push_back({name, dims, element_count(dims)});
    total_size_ += variables_.back().size;
    return variables_.size() - 1;
  }

  std::size_t count() const { return variables_.size(); }
  bool empty() const { return variables_.empty(); }
  const variable& operator[](std::size_t index) const { return variables_[index]; }
  auto begin() const { return variables_.begin(); }
  auto end() const { return variables_.end(); }

  // Sum of all variables' element counts.
  std::size_t total_size() const { return total_size_; }

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  std::size_t index_of(const std::string& name) const {
    auto found = index_.find(name);
    if (found == index_.end()) detail::fail("no variable named '", name, "'");
    return found->second;
  }

  // Checks an index that came from user code.
  void check_index(std::size_t index) const {
    if (index >= variables_.size())
      detail::fail("variable index ", index, " is out of range (", variables_.size(), " variables)");
  }

 private:
  // The name with control characters shown as \xNN, for messages.
  static std::string printable(const std::string& name) {
    static const char digits[] = "0123456789abcdef";
    std::string shown;
    for (char ch : name) {
      const auto c = static_cast<unsigned char>(ch);
      if (c < ' ' || c == 0x7F) shown += std::string("\\x") + digits[c >> 4] + digits[c & 15];
      else shown += ch;
    }
    return shown;
  }

  std::vector<variable> variables_;
  std::unordered_map<std::string, std::size_t> index_;
  std::size_t total_size_ = 0;
};

namespace detail {
// `variables` where `wanted`, else an empty set: for buffers only some configurations need.
inline const variable_set& variables_if(bool wanted, const variable_set& variables) {
  static const variable_set none;
  return wanted ? variables : none;
}
}  // namespace detail

}  // namespace towerpipe
