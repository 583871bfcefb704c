#pragma once
// What every tower function sees, whatever the execution space: its index, its shard of the batch and
// weight, the parameters, and its gradient buffers. Views point into the execution space's memory: host
// memory for exec::host, the tower's device for exec::cuda.
//
// The gradient contract. Each step the tower writes the MEAN gradient over its shard of every variable,
// every element of it, through one of:
//   gradient(v)        a writable view whose contents on entry are unspecified (in practice the last
//                      step's values): write every element. Costs nothing.
//   zeroed_gradient(v) the same view after it has been set to zero (on the tower's thread, or on its
//                      stream for GPU towers): for code that accumulates, e.g. += per example. Costs one
//                      pass over the variable's gradient (4 bytes an element for float), paid only by
//                      the variables it is called for.
//   write_gradient(v, values, count)  copies a whole gradient from elsewhere.
// Calling any of them marks the variable as written; a variable none of them was called for fails the
// step, naming the tower and the variable. An element left unwritten after gradient(v) cannot be seen
// by the library in general: pipeline_options::poison_gradients (a debug option) fills the buffers with a
// signalling-NaN pattern before the tower runs and fails the step on any element that still holds it,
// naming tower, variable and element.
//
// Marking gradients ready (overlap, plan/buckets.hpp). gradient_ready(v) says that the tower is done with
// variable v for this step: it will neither write its gradient nor read its parameter again, so the
// pipeline may reduce v's bucket — and, in an unchecked step, update its parameters — while the tower's
// backward pass goes on. Marking a variable before its gradient was written, marking it twice, or
// writing its gradient or reading its parameter through the context after marking it is a
// towerpipe::error naming tower and variable; a write through a view taken before the mark is found by
// poison_gradients (host towers). A tower that marks nothing, or not everything, has the rest marked
// when it returns: the unbucketed step.
//
// What went wrong in the towers of one step becomes a single towerpipe::error that names the tower
// (throw_tower_failures): the lowest-numbered tower that threw (and how many others did), else the first
// gradient left unwritten.

#include <algorithm>
#include <cstddef>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "towerpipe/core/error.hpp"
#include "towerpipe/core/tensor_view.hpp"
#include "towerpipe/core/variable_set.hpp"
#include "towerpipe/data/batch.hpp"
#include "towerpipe/kernels/access_hook.hpp"

namespace towerpipe {
namespace detail {

// Told of each gradient_ready mark, and of each tower function that returned without failing (with
// the tower's marks: what it did not mark counts as marked now), on that tower's thread (the
// overlapped reduction: pipeline/step_parts.hpp).
class tower_ready_listener {
 public:
  virtual void gradient_ready(std::size_t tower, std::size_t variable) = 0;
  virtual void tower_returned(std::size_t tower, const std::vector<char>& ready) = 0;

 protected:
  ~tower_ready_listener() = default;
};

// The part of a tower context every execution space shares. Derived provides fill_zero(T*, count) and
// copy_into(T* target, const T* source, count) in its own memory space.
template <class Derived, class Buffer, class T>
class tower_context_base {
 public:
  using value_type = T;

  std::size_t tower() const { return tower_; }
  std::size_t towers() const { return towers_; }
  const towerpipe::batch& shard() const { return shard_; }
  template <class U>
  batch_view<U> input(const std::string& name) const { return shard_.input<U>(name); }
  std::size_t examples() const { return shard_.examples(); }
  double weight() const { return weight_; }  // this tower's share of the batch, b_i / B
  const variable_set& variables() const { return parameters_->variables(); }

  tensor_view<const T> parameter(std::size_t index) const {
    variables().check_index(index);
    if ((*ready_)[index]) fail_after_ready("read the parameter of", index);
    const tensor_view<const T> view = parameters_->view(index);
    self().note_access(view.data(), view.size(), operand_access::read);
    return view;
  }
  tensor_view<const T> parameter(const std::string& name) const { return parameter(variables().index_of(name)); }

  // Write-only: see the gradient contract at the top of this header.
  tensor_view<T> gradient(std::size_t index) {
    const tensor_view<T> view = written_view(index);
    self().note_access(view.data(), view.size(), operand_access::write);
    return view;
  }
  tensor_view<T> gradient(const std::string& name) { return gradient(variables().index_of(name)); }

  // Zero-filled before it is returned, for accumulating code.
  tensor_view<T> zeroed_gradient(std::size_t index) {
    const tensor_view<T> view = written_view(index);
    self().fill_zero(view.data(), view.size());
    self().note_access(view.data(), view.size(), operand_access::write);
    return view;
  }
  tensor_view<T> zeroed_gradient(const std::string& name) { return zeroed_gradient(variables().index_of(name)); }

  // Copies the whole gradient of a variable (count must be its element count) from `values`, which lie
  // where the execution space's memory is (host memory for exec::host; device memory for exec::cuda).
  void write_gradient(std::size_t index, const T* values, std::size_t count) {
    variables().check_index(index);
    const variable& v = variables()[index];
    if (count != v.size)
      fail("gradient of variable '", v.name, "' written with ", count, " elements; its shape ", to_string(v.shape),
           " holds ", v.size);
    self().copy_into(written_view(index).data(), values, count);
  }
  void write_gradient(const std::string& name, const T* values, std::size_t count) {
    write_gradient(variables().index_of(name), values, count);
  }

  // This step's gradient of the variable is final and its parameter no longer read (see the top).
  void gradient_ready(std::size_t index) {
    variables().check_index(index);
    const variable& v = variables()[index];
    if (!(*written_)[index])
      fail("gradient_ready('", v.name, "') before its gradient was written (gradient(), zeroed_gradient() or write_gradient())");
    if ((*ready_)[index]) fail("gradient_ready('", v.name, "') called twice in one step");
    (*ready_)[index] = 1;
    self().note_ready(index);
    if (listener_ != nullptr) listener_->gradient_ready(tower_, index);
  }
  void gradient_ready(const std::string& name) { gradient_ready(variables().index_of(name)); }

 protected:
  tower_context_base(std::size_t tower, std::size_t towers, towerpipe::batch shard, double weight,
                     const Buffer* parameters, Buffer* gradients, std::vector<char>* written, std::vector<char>* ready,
                     tower_ready_listener* listener)
      : tower_(tower),
        towers_(towers),
        shard_(std::move(shard)),
        weight_(weight),
        parameters_(parameters),
        gradients_(gradients),
        written_(written),
        ready_(ready),
        listener_(listener) {}

  // What an execution space does at a mark beyond the bookkeeping, and when the tower function is handed
  // a parameter to read or a gradient to write (device towers declare it to their executor); nothing by default.
  void note_ready(std::size_t) {}
  void note_access(const T*, std::size_t, operand_access) const {}
  tensor_view<const T> gradients_view(std::size_t index) const { return gradients_->view(index); }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  // The gradient's view, the variable marked as written.
  tensor_view<T> written_view(std::size_t index) {
    variables().check_index(index);
    if ((*ready_)[index]) fail_after_ready("wrote the gradient of", index);
    (*written_)[index] = 1;
    return gradients_->view(index);
  }
  [[noreturn]] void fail_after_ready(const char* what, std::size_t index) const {
    const variable& v = variables()[index];
    fail(what, " variable '", v.name, "' after gradient_ready('", v.name,
         "'): once marked, its bucket may be reduced (and in an unchecked step its parameters updated) at any time");
  }

  std::size_t tower_, towers_;
  towerpipe::batch shard_;
  double weight_;
  const Buffer* parameters_;
  Buffer* gradients_;
  std::vector<char>* written_;
  std::vector<char>* ready_;
  tower_ready_listener* listener_;
};

// An element of a gradient that still holds the poison after the tower function (the tower is named by
// throw_tower_failures, which wraps this message).
[[noreturn]] inline void fail_unwritten_element(const variable& v, std::size_t element) {
  fail("element ", element, " (index ", shaped_index(v, element), ") of the gradient of variable '", v.name, "' ",
       to_string(v.shape), " was not written: it still holds the poison of pipeline_options::poison_gradients");
}

inline void throw_tower_failures(const std::vector<std::exception_ptr>& failures,
                                 const std::vector<std::vector<char>>& written, const variable_set& variables) {
  const std::size_t failed = static_cast<std::size_t>(
      std::count_if(failures.begin(), failures.end(), [](const std::exception_ptr& e) { return e != nullptr; }));
  const std::string others = failed > 1 ? make_message(" (", failed - 1, " more tower(s) failed too)") : std::string();
  for (std::size_t tower = 0; tower < failures.size(); ++tower) {
    if (failures[tower] == nullptr) continue;
    try {
      std::rethrow_exception(failures[tower]);
    } catch (const error& e) {
      fail("tower ", tower, ": ", e.message(), others);
    } catch (const std::exception& e) {
      fail("tower ", tower, " threw: ", e.what(), others);
    } catch (...) {
      fail("tower ", tower, " threw an exception that is not a std::exception", others);
    }
  }
  for (std::size_t tower = 0; tower < written.size(); ++tower) {
    for (std::size_t v = 0; v < variables.count(); ++v) {
      if (!written[tower][v]) fail("tower ", tower, " did not write the gradient of variable '", variables[v].name, "'");
    }
  }
}

}  // namespace detail
}  // namespace towerpipe
