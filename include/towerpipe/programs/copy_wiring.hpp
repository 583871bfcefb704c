#pragma once
// Which tower buffers the device reducers use directly and which they reach through copies: the
// copying paths (no peer access between two devices, or pipeline_options::direct_device_access off, as
// the GPU tests use to run these paths on one device). Decided here, in plain C++, from the towers'
// devices and peer-access pairs, so that the host tests check the very wiring the GPU reducers are
// built from against the canonical sums (tests/host/test_multi_tensor.cpp).
//
// A tower's own buffers are always direct for work on its own stream: tower t's kernels run on t's
// device. The switch only decides whether a kernel on one tower's stream may use another tower's
// memory, even on the same device.

#include <cstddef>
#include <set>
#include <utility>
#include <vector>

#include "towerpipe/programs/agents.hpp"

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

// reduce::p2p_tree (reduce/p2p_tree.cuh) over the canonical tree's rounds. Every tower's partial sum
// lives in its own gradient buffer; an edge (left, right) runs on left's stream and adds right's
// partial into left's buffer, reading right's buffer in place or, where left does not reach right,
// from left's scratch buffer, filled by a copy of right's buffer just before the edge (after right's
// last write). The root (tower 0) writes its replica and those of its children it reaches; every other
// tower then pulls its parent's replica, in place or by a copy.
struct tree_wiring {
  std::vector<int> parent;                   // per tower; -1 for the root
  std::vector<std::vector<char>> via_scratch; // [reader][tower]: reader reads tower's partial from its scratch (only
                                              // its own and its children's are read)
  std::vector<char> needs_scratch;            // per tower: one of its edges reads through its scratch
  std::vector<char> written_by_root;          // per tower: the root's pass writes its replica
  std::vector<char> pulls_directly;           // per non-root tower not written by the root

  explicit tree_wiring(const tower_access& access) {
    const std::size_t n = access.towers();
    parent.assign(n, -1);
    for (const auto& round : canonical_tree_rounds<float>(static_cast<int>(n), std::vector<float>(n, 1.0f))) {
      for (const tree_edge<float>& edge : round) parent[static_cast<std::size_t>(edge.right)] = edge.left;
    }
    via_scratch.assign(n, std::vector<char>(n, 0));
    needs_scratch.assign(n, 0);
    written_by_root.assign(n, 0);
    pulls_directly.assign(n, 0);
    const auto reads = [&](std::size_t reader, std::size_t tower) {
      via_scratch[reader][tower] = !access.reaches(reader, tower);
      if (via_scratch[reader][tower]) needs_scratch[reader] = 1;
    };
    for (std::size_t t = 0; t < n; ++t) {
      reads(t, t);  // its own partial, which its edges add to
      if (t == 0) continue;
      const std::size_t up = static_cast<std::size_t>(parent[t]);
      reads(up, t);  // the edge (up, t)
      written_by_root[t] = up == 0 && access.reaches(0, t);
      pulls_directly[t] = access.reaches(t, up);
    }
  }
};

}  // namespace detail
}  // namespace towerpipe
