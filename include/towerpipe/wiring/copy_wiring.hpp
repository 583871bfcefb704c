#pragma once
// Which tower buffers the device reducers use directly and which through copies (no peer access, or
// direct_device_access off). A tower's own buffers are always direct for work on its own stream.
// Why: docs/design-notes.md#wiring-copy_wiring

#include <algorithm>
#include <cstddef>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "towerpipe/kernels/agents.hpp"
#include "towerpipe/plan/chunk_table.hpp"
#include "towerpipe/plan/copy_list.hpp"

namespace towerpipe {
namespace detail {

class tower_access {
 public:
  // devices[t]: tower t's device; peers: the ordered pairs (reader, owner) of devices with peer access;
  // direct: pipeline_options::direct_device_access.
  tower_access(std::vector<int> devices, std::set<std::pair<int, int>> peers, bool direct)
      : devices_(std::move(devices)), peers_(std::move(peers)), direct_(direct) {}

  std::size_t towers() const { return devices_.size(); }
  // Whether a kernel on tower `reader`'s stream may use tower `tower`'s buffers in place.
  bool reaches(std::size_t reader, std::size_t tower) const {
    if (reader == tower) return true;
    const int from = devices_[reader], to = devices_[tower];
    return direct_ && (from == to || peers_.count({from, to}) != 0);
  }
  // The towers whose buffers a kernel on `reader`'s stream reaches through copies: for reduce::device0
  // (reader 0: that tower's gradients copied in, its replica copied out) and for each owner of
  // reduce::sharded (its slice of them). Never the reader itself.
  std::vector<char> copied_by(std::size_t reader) const {
    std::vector<char> copied(towers());
    for (std::size_t t = 0; t < towers(); ++t) copied[t] = !reaches(reader, t);
    return copied;
  }

 private:
  std::vector<int> devices_;
  std::set<std::pair<int, int>> peers_;
  bool direct_;
};

// The towers' buffers as a kernel on one reader's device uses them: reduce::device0 (reader 0, the
// root) and reduce::sharded across processes (tower 0's device). A tower the reader reaches is used in
// place; any other gets whole copies on the reader's device (CopyBuffer, allocated from `memory`): its
// gradients, copied in before the pass, and, with `replicas_too` (device0), its replica, which the pass
// writes and which is copied out after it. Never the reader itself: the master copy is its replica.
template <class CopyBuffer>
class tower_copies {
 public:
  using value_type = std::remove_pointer_t<decltype(std::declval<const CopyBuffer&>().data(0))>;

  template <class Towers, class Memory>
  tower_copies(Towers& towers, std::size_t reader, const Memory& memory, bool replicas_too)
      : copied_(towers.access().copied_by(reader)), gradients_(copied_.size()), replicas_(copied_.size()) {
    const int device = towers.device(reader);
    for (std::size_t t = 0; t < copied_.size(); ++t) {
      if (!copied_[t]) {
        append_role(gradient_pointers_, towers.gradients(t));
        append_role(replica_pointers_, towers.replica(t));
        continue;
      }
      const auto& variables = towers.gradients(t).variables();
      gradients_[t] = std::make_unique<CopyBuffer>(variables, memory);
      add_whole_copy(gradients_in_, *gradients_[t], device, towers.gradients(t), towers.device(t));
      append_role(gradient_pointers_, *gradients_[t]);
      if (!replicas_too) continue;
      replicas_[t] = std::make_unique<CopyBuffer>(variables, memory);
      add_whole_copy(replicas_out_, towers.replica(t), towers.device(t), *replicas_[t], device);
      append_role(replica_pointers_, *replicas_[t]);
    }
  }

  std::size_t towers() const { return copied_.size(); }
  bool copied(std::size_t t) const { return copied_[t] != 0; }
  // The towers the reader uses in place.
  int reached() const { return static_cast<int>(std::count(copied_.begin(), copied_.end(), 0)); }
  // Pointer-table entries, role = tower: where the pass reads each tower's gradients.
  const std::vector<value_type*>& gradients() const { return gradient_pointers_; }
  // With replicas_too, role = tower: where the pass writes each tower's new parameters. Without, the
  // replicas of the towers the reader reaches, in tower order (none: no entries).
  const std::vector<value_type*>& replicas() const { return replica_pointers_; }
  // Before the pass, after the towers' gradients are ready.
  const copy_list<value_type>& gradients_in() const { return gradients_in_; }
  // After the pass that wrote the replicas (replicas_too).
  const copy_list<value_type>& replicas_out() const { return replicas_out_; }

 private:
  std::vector<char> copied_;
  std::vector<std::unique_ptr<CopyBuffer>> gradients_, replicas_;  // per tower; null: used in place
  std::vector<value_type*> gradient_pointers_, replica_pointers_;
  copy_list<value_type> gradients_in_, replicas_out_;
};

// reduce::p2p_tree over the canonical tree's rounds (docs/design-notes.md#wiring-copy_wiring has how edges read operands).
struct tree_wiring {
  std::vector<int> parent;                   // per tower; -1 for the root
  std::vector<char> has_children;            // per tower: the left side of some edge, so it keeps a partial sum
  std::vector<std::vector<char>> via_scratch; // [reader][tower]: reader reads tower's operand from its scratch (only
                                              // its own and its children's are read)
  std::vector<char> needs_raw_scratch;        // per tower: it reads a child's raw gradient through a copy
  std::vector<char> needs_partial_scratch;    // per tower: it reads a child's partial sum through a copy
  std::vector<char> needs_scratch;            // per tower: either (full precision: one scratch serves both)
  std::vector<char> written_by_root;          // per tower: the root's pass writes its replica
  std::vector<char> pulls_directly;           // per non-root tower not written by the root

  explicit tree_wiring(const tower_access& access) {
    const std::size_t n = access.towers();
    parent.assign(n, -1);
    has_children.assign(n, 0);
    for (const auto& round : canonical_tree_rounds<float>(static_cast<int>(n), std::vector<float>(n, 1.0f))) {
      for (const tree_edge<float>& edge : round) {
        parent[static_cast<std::size_t>(edge.right)] = edge.left;
        has_children[static_cast<std::size_t>(edge.left)] = 1;
      }
    }
    via_scratch.assign(n, std::vector<char>(n, 0));
    needs_raw_scratch.assign(n, 0);
    needs_partial_scratch.assign(n, 0);
    needs_scratch.assign(n, 0);
    written_by_root.assign(n, 0);
    pulls_directly.assign(n, 0);
    for (std::size_t t = 1; t < n; ++t) {
      const std::size_t up = static_cast<std::size_t>(parent[t]);
      if (!access.reaches(up, t)) {  // the edge (up, t) reads t's operand through a copy
        via_scratch[up][t] = 1;
        (has_children[t] ? needs_partial_scratch : needs_raw_scratch)[up] = 1;
        needs_scratch[up] = 1;
      }
      written_by_root[t] = up == 0 && access.reaches(0, t);
      pulls_directly[t] = access.reaches(t, up);
    }
  }

  // Tower `reader`'s tables of operands, role = tower (agents.hpp tree_operands): the raw gradients —
  // the tower's own buffer, or reader's raw scratch for a child without children it reads through a
  // copy — and the partial sums: partials[t] (null for a tower without children), or reader's partial
  // scratch for a child it reads through a copy. A scratch may be null where the reader needs none.
  template <class Stored, class Towers, class Scratch>
  std::vector<Stored*> raw_pointers(Towers& towers, std::size_t reader, const Scratch* raw_scratch) const {
    std::vector<Stored*> pointers;
    for (std::size_t t = 0; t < towers.towers(); ++t) {
      if (!via_scratch[reader][t]) append_role(pointers, towers.gradients(t));
      else if (has_children[t]) pointers.insert(pointers.end(), towers.gradients(t).variables().count(), nullptr);  // read as a partial
      else append_role(pointers, *raw_scratch);
    }
    return pointers;
  }
  template <class T, class Partial, class Scratch>
  std::vector<T*> partial_pointers(const std::vector<Partial*>& partials, std::size_t reader, const Scratch* partial_scratch,
                                   std::size_t variables) const {
    std::vector<T*> pointers;
    for (std::size_t t = 0; t < partials.size(); ++t) {
      if (!has_children[t]) pointers.insert(pointers.end(), variables, nullptr);
      else if (via_scratch[reader][t]) append_role(pointers, *partial_scratch);
      else append_role(pointers, *partials[t]);
    }
    return pointers;
  }
  // Just before the edge into t's parent, after t's last write, where the parent does not reach t: t's
  // raw gradient into the parent's raw scratch (t without children), or t's partial sum into the
  // parent's partial scratch (else nothing).
  template <class Stored, class Towers, class Scratch>
  copy_list<Stored> raw_operand_copies(Towers& towers, std::size_t t, const Scratch* parent_raw_scratch) const {
    copy_list<Stored> copies;
    const std::size_t up = static_cast<std::size_t>(parent[t]);
    if (via_scratch[up][t] && !has_children[t])
      add_whole_copy(copies, *parent_raw_scratch, towers.device(up), towers.gradients(t), towers.device(t));
    return copies;
  }
  template <class T, class Towers, class Partial, class Scratch>
  copy_list<T> partial_operand_copies(Towers& towers, std::size_t t, const std::vector<Partial*>& partials,
                                      const Scratch* parent_partial_scratch) const {
    copy_list<T> copies;
    const std::size_t up = static_cast<std::size_t>(parent[t]);
    if (via_scratch[up][t] && has_children[t])
      add_whole_copy(copies, *parent_partial_scratch, towers.device(up), *partials[t], towers.device(t));
    return copies;
  }
  // The replicas the root's pass writes: tower 0's, and those of written_by_root.
  int root_replicas() const { return 1 + static_cast<int>(std::count(written_by_root.begin(), written_by_root.end(), 1)); }
  // Their pointer-table entries: role 0 tower 0's, then those of written_by_root in tower order.
  template <class T, class Towers>
  std::vector<T*> root_target_pointers(Towers& towers) const {
    std::vector<const std::remove_reference_t<decltype(towers.replica(0))>*> roles{&towers.replica(0)};
    for (std::size_t t = 1; t < towers.towers(); ++t) {
      if (written_by_root[t]) roles.push_back(&towers.replica(t));
    }
    return gather_pointers<T>(roles);
  }
  // A tower neither written by the root nor pulling directly: its parent's replica copied into its own.
  template <class T, class Towers>
  copy_list<T> pull_copies(Towers& towers, std::size_t t) const {
    copy_list<T> copies;
    const std::size_t up = static_cast<std::size_t>(parent[t]);
    if (t != 0 && !written_by_root[t] && !pulls_directly[t])
      add_whole_copy(copies, towers.replica(t), towers.device(t), towers.replica(up), towers.device(up));
    return copies;
  }
};

}  // namespace detail
}  // namespace towerpipe
